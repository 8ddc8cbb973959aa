"""`hubvit convert pytorch`: a plain PyTorch ViT built on `nn.TransformerEncoder(norm_first=True)` as a hubvit folder.

The layout is the design document's reference class: `patch_embed` (a stride-P convolution), `cls_token`,
`pos_embed` ([CLS] row first), `blocks` (an `nn.TransformerEncoder` of `nn.TransformerEncoderLayer(norm_first=True,
batch_first=True)`), a final `norm` and a `head`. Sizes come from the shapes; the head count, the activation and the
two LayerNorm eps values (the layers' PyTorch default 1e-5, the final norm's 1e-6) cannot be read from weights and are
options. The check runs PyTorch's own `nn.TransformerEncoder` on the same weights.
"""

import argparse
import re
import shlex

import torch
from torch import nn

from ..modeling import HubViTConfig
from .card import CardInfo
from .common import ConversionError, StrictMapping, read_weights
from .folder import build_model, expected_shapes, make_image_processor, write_folder
from .timm import clean_state_dict

TOLERANCE = 1e-5
ACTIVATIONS = ("gelu", "relu")
LAYER = re.compile(r"blocks\.layers\.(\d+)\..*")

RENAMES = [
    (r"patch_embed\.(weight|bias)", r"embeddings.patch_embedding.\1"),
    (r"cls_token", "embeddings.class_token"),
    (r"pos_embed", "embeddings.position_embedding"),
    (r"blocks\.layers\.(\d+)\.norm([12])\.(weight|bias)", r"encoder.layers.\1.norm\2.\3"),
    (r"blocks\.layers\.(\d+)\.self_attn\.in_proj_(weight|bias)", r"encoder.layers.\1.attention.qkv.\2"),
    (r"blocks\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)", r"encoder.layers.\1.attention.proj.\2"),
    (r"blocks\.layers\.(\d+)\.linear([12])\.(weight|bias)", r"encoder.layers.\1.mlp.fc\2.\3"),
    (r"norm\.(weight|bias)", r"norm.\1"),
    (r"head\.(weight|bias)", r"classifier.\1"),
]


def add_arguments(parser):
    parser.add_argument("src", metavar="SRC", help="state dict (.pth or .safetensors) of the nn.TransformerEncoder ViT")
    parser.add_argument("out", metavar="OUT", help="hubvit folder to write")
    parser.add_argument("--num-heads", type=int, required=True, help="attention heads (not readable from the weights)")
    parser.add_argument("--activation", choices=ACTIVATIONS, default="gelu", help="the layers' activation (gelu)")
    parser.add_argument(
        "--layer-norm-eps", type=float, default=1e-5, help="eps of the layers' norm1/norm2 (nn.TransformerEncoderLayer: 1e-5)"
    )
    parser.add_argument("--final-layer-norm-eps", type=float, default=1e-6, help="eps of the final norm (1e-6)")
    parser.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run nn.TransformerEncoder and the converted model on the same input; fail above tolerance (default: on)",
    )
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="relative tolerance of --verify (1e-5)")


def shape(weights, key, what):
    if key not in weights:
        raise ConversionError(f"no {key} in the state dict ({what}); is this a ViT on nn.TransformerEncoder?")
    return tuple(weights[key].shape)


def read_sizes(weights):
    """Patch, width, depth, MLP width, grid and classes from the shapes."""
    hidden, channels, patch_h, patch_w = shape(weights, "patch_embed.weight", "patch embedding")
    shape(weights, "cls_token", "class token")
    rows = shape(weights, "pos_embed", "position table")[1] - 1
    grid = round(rows**0.5)
    if grid * grid != rows:
        raise ConversionError(f"pos_embed has {rows} patch rows after [CLS]: not a square grid")
    layers = {int(m.group(1)) for key in weights if (m := LAYER.fullmatch(key))}
    if not layers or sorted(layers) != list(range(len(layers))):
        raise ConversionError(f"blocks.layers indices {sorted(layers)} are not numbered 0..N-1")
    return dict(
        image_size=[grid * patch_h, grid * patch_w] if patch_h != patch_w else grid * patch_h,
        patch_size=[patch_h, patch_w] if patch_h != patch_w else patch_h,
        num_channels=channels,
        hidden_size=hidden,
        num_hidden_layers=len(layers),
        intermediate_size=shape(weights, "blocks.layers.0.linear1.weight", "MLP")[0],
        patch_bias="patch_embed.bias" in weights,
        num_labels=shape(weights, "head.weight", "")[0] if "head.weight" in weights else 0,
    )


class TransformerEncoderViT(nn.Module):
    """The source layout around PyTorch's own `nn.TransformerEncoder`, the module the weights were trained in."""

    def __init__(self, config):
        super().__init__()
        dim = config.hidden_size
        self.patch_embed = nn.Conv2d(
            config.num_channels, dim, config.patch_size_2d, config.patch_size_2d, bias=config.patch_bias
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + config.grid_size[0] * config.grid_size[1], dim))
        layer = nn.TransformerEncoderLayer(
            dim,
            config.num_attention_heads,
            config.intermediate_size,
            dropout=0.0,
            activation=config.hidden_act,
            layer_norm_eps=config.layer_norm_eps,
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, config.num_hidden_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim, eps=config.final_norm_eps)
        self.head = nn.Linear(dim, config.num_labels) if config.num_labels else nn.Identity()

    def forward(self, pixels):
        tokens = self.patch_embed(pixels).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(tokens))[:, 0])


def map_weights(weights, config, description):
    mapping = StrictMapping(weights, description)
    for key in weights:
        for pattern, target in RENAMES:
            if re.fullmatch(pattern, key):
                mapping.map(re.sub(pattern, target, key), key)
                break
    return mapping.finish(expected_shapes(config)), mapping


@torch.no_grad()
def verify(weights, config, model, tolerance):
    reference = TransformerEncoderViT(config).eval()
    reference.load_state_dict(weights, strict=True)
    pixels = torch.randn(2, config.num_channels, *config.image_size_2d, generator=torch.Generator().manual_seed(0))
    theirs, ours = reference(pixels), model(pixel_values=pixels).logits
    diff, scale = (theirs - ours).abs().max().item(), theirs.abs().max().item()
    field = "logits" if config.num_labels else "features"
    line = f"max |Δ{field}| = {diff:.2e} (max |{field}| = {scale:.3g})"
    failed = None if diff <= tolerance * scale else f"max |Δ{field}| {diff:.3g} > {tolerance:g} x {scale:.3g}"
    return diff, line, failed


def main(args):
    weights = clean_state_dict(read_weights(args.src))
    sizes = read_sizes(weights)
    if args.num_heads <= 0 or sizes["hidden_size"] % args.num_heads:
        raise ConversionError(f"--num-heads {args.num_heads} does not divide the width {sizes['hidden_size']}")
    config = HubViTConfig(
        **sizes,
        num_attention_heads=args.num_heads,
        hidden_act=args.activation,
        layer_norm_eps=args.layer_norm_eps,
        final_layer_norm_eps=args.final_layer_norm_eps,
        interpolation_mode="bicubic",
        interpolation_antialias=False,
        interpolation_align_corners=False,
        pooling="cls",
    )
    if not config.num_labels:
        config.id2label, config.label2id = {}, {}
    state_dict, mapping = map_weights(weights, config, f"nn.TransformerEncoder ViT state dict ({args.src})")
    model = build_model(config, state_dict)
    for line in mapping.report():
        print(line)

    max_abs_diff, verification = None, None
    if args.verify:
        max_abs_diff, line, failed = verify(weights, config, model, args.tolerance)
        print(f"verify: {line}")
        if failed:
            raise ConversionError(f"the converted model does not reproduce the source; nothing was written.\n    {failed}")
        (h, w) = config.image_size_2d
        verification = (
            f"PyTorch {torch.__version__} `nn.TransformerEncoder` (norm_first=True) in the source layout and this model, "
            f"same weights, one random float32 batch of 2x{config.num_channels}x{h}x{w}: {line}. Tolerance "
            f"{args.tolerance:g} relative to the output scale. At other resolutions the grid rows of the position table "
            "are resized bicubic without antialias or align_corners, [CLS] row kept."
        )
    command = ["hubvit", "convert", "pytorch", str(args.src), str(args.out), "--num-heads", str(args.num_heads)]
    for flag, value, default in (
        ("--activation", args.activation, "gelu"),
        ("--layer-norm-eps", args.layer_norm_eps, 1e-5),
        ("--final-layer-norm-eps", args.final_layer_norm_eps, 1e-6),
    ):
        if value != default:
            command += [flag, str(value)]
    card = CardInfo(
        provenance=(
            "Converted from a plain PyTorch ViT on `nn.TransformerEncoder` (norm_first=True). Layer norms eps "
            f"{config.layer_norm_eps:g}, final norm eps {config.final_norm_eps:g}, activation {config.hidden_act}. The source records no preprocessing: the image processor resizes "
            "(bicubic) and normalises with the ImageNet mean and std; set yours if the model was trained otherwise."
        ),
        command=shlex.join(command),
        family="pytorch",
        verification=verification,
        max_abs_diff=max_abs_diff,
        dropped=mapping.report()[1:],
    )
    processor = make_image_processor(config, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), resample="bicubic")
    out = write_folder(model, args.out, processor, card, overwrite=getattr(args, "overwrite", False))
    print(f"wrote {out}")
    return out
