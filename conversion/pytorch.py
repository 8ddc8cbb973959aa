"""`hubvit convert pytorch`: a plain PyTorch ViT built on `nn.TransformerEncoder(norm_first=True)` as a hubvit folder.

The layout is the reference class of the blog post "Vision Transformer (ViT) from First Principles": `patch_embed` (a stride-P convolution), `cls_token`,
`pos_embed` ([CLS] row first), `blocks` (an `nn.TransformerEncoder` of `nn.TransformerEncoderLayer(norm_first=True,
batch_first=True)`), a final `norm` and a `head`. Sizes come from the shapes; the head count, the activation and the
two LayerNorm eps values (the layers' PyTorch default 1e-5, the final norm's 1e-6) cannot be read from weights and are
options. The check runs PyTorch's own `nn.TransformerEncoder` on the same weights.
"""

import re
import shlex
from dataclasses import dataclass

import torch
from torch import nn

from ..modeling import HubViTConfig
from ..options import argument, choice, option, positive, settle, whole
from ..preprocessing import Preprocessing
from .common import (
    Conversion,
    ConversionError,
    ConversionOptions,
    ConversionResult,
    Reference,
    StrictMapping,
    read_weights,
)
from ..folder import expected_shapes
from .folder import run_conversion
from .timm import clean_state_dict

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


@dataclass(frozen=True)
class Options(ConversionOptions):
    """Convert the state dict of a plain PyTorch ViT on `nn.TransformerEncoder(norm_first=True)` into a hubvit folder
    at OUT, after checking it against that PyTorch model's forward (`verify`, within `tolerance`). `num_heads`,
    `activation` and the two LayerNorm eps values cannot be read from the weights."""

    src: str = argument("SRC", "state dict (.pth or .safetensors) of the nn.TransformerEncoder ViT")
    num_heads: int = option(help="attention heads (not readable from the weights)")
    activation: str = option("gelu", "the layers' activation", choices=ACTIVATIONS)
    layer_norm_eps: float = option(1e-5, "eps of the layers' norm1/norm2 (PyTorch's default 1e-5)")
    final_layer_norm_eps: float = option(1e-6, "eps of the final norm")

    def __post_init__(self):
        super().__post_init__()
        settle(
            self,
            num_heads=whole(self.num_heads, "num_heads", minimum=1, optional=False),
            activation=choice(self.activation, ACTIVATIONS, "activation"),
            layer_norm_eps=positive(self.layer_norm_eps, "layer_norm_eps"),
            final_layer_norm_eps=positive(self.final_layer_norm_eps, "final_layer_norm_eps"),
        )


def run(options: Options) -> ConversionResult:
    return run_conversion(convert, options)


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
        num_labels=tuple(weights["head.weight"].shape)[0] if "head.weight" in weights else 0,
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


def map_weights(weights, description):
    """The strict mapper holding the source state dict translated to hubvit names."""
    mapping = StrictMapping(weights, description)
    mapping.rename(RENAMES)
    return mapping


def reference(args, weights, config):
    """PyTorch's nn.TransformerEncoder in the source layout, holding the source weights."""
    if not args.verify:
        return Reference.unavailable("skipped (--no-verify)")
    model = TransformerEncoderViT(config).eval()
    model.load_state_dict(weights, strict=True)
    name = "logits" if config.num_labels else "pooler_output"
    return Reference(
        f"PyTorch {torch.__version__} `nn.TransformerEncoder` (norm_first=True) in the source layout, with the options "
        "given",
        lambda pixels: {name: model(pixels)},
        tolerance=args.tolerance,
    )


def convert(args):
    """The `Conversion` of a plain PyTorch ViT state dict; `args` is an `Options`."""
    weights = clean_state_dict(read_weights(args.src))
    if "visual.class_embedding" in weights or any(key.startswith("visual.trunk.") for key in weights):
        raise ConversionError(
            f"{args.src} is an open_clip state dict (visual.*): convert its image tower with `hubvit convert timm "
            f"{args.src} OUT --architecture NAME` (a timm CLIP ViT, or the trunk's timm model)"
        )
    sizes = read_sizes(weights)
    num_labels = sizes.pop("num_labels")
    if args.num_heads <= 0 or sizes["hidden_size"] % args.num_heads:
        raise ConversionError(f"--num-heads {args.num_heads} does not divide the width {sizes['hidden_size']}")
    fields = dict(
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
    config = HubViTConfig(**fields, num_labels=num_labels)
    mapping = map_weights(weights, f"nn.TransformerEncoder ViT state dict ({args.src})")
    state_dict = mapping.finish(expected_shapes(config))
    command = ["hubvit", "convert", "pytorch", str(args.src), str(args.out), "--num-heads", str(args.num_heads)]
    for flag, value, default in (
        ("--activation", args.activation, "gelu"),
        ("--layer-norm-eps", args.layer_norm_eps, 1e-5),
        ("--final-layer-norm-eps", args.final_layer_norm_eps, 1e-6),
    ):
        if value != default:
            command += [flag, str(value)]
    return Conversion(
        weights=state_dict,
        config=fields,
        preprocessing=Preprocessing(
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            resample="bicubic",
            notes=[
                "the source records no preprocessing: the image processor resizes (bicubic) to the model's size and "
                "normalises with the ImageNet mean and std; set yours if the model was trained otherwise"
            ],
        ),
        labels={i: f"LABEL_{i}" for i in range(num_labels)},
        reference=reference(args, weights, config),
        provenance=(
            "Converted from a plain PyTorch ViT on `nn.TransformerEncoder` (norm_first=True). Layer norms eps "
            f"{config.layer_norm_eps:g}, final norm eps {config.final_norm_eps:g}, activation {config.hidden_act}, "
            f"{config.num_attention_heads} heads (given, not read from the weights). At other resolutions the grid "
            "rows of the position table are resized bicubic without antialias or align_corners, [CLS] row kept."
        ),
        command=shlex.join(command),
        family="pytorch",
        dropped=mapping.report(),
    )
