"""`hubvit convert torchvision`: a state dict of torchvision's `VisionTransformer` (vit_b_16 ... vit_h_14) as a hubvit
folder.

Sizes are read from the tensor shapes; the head count, which no shape carries, comes from the torchvision builder
named by `--architecture` (or `--num-heads` for a `VisionTransformer` built with other sizes). torchvision changes
resolution only offline, with `interpolate_embeddings` (bicubic, `align_corners=True`): `--image-size` uses that
function itself, and the config records the same interpolation so hubvit's on-the-fly resizing agrees with it.
The result is checked against torchvision's own forward on the same weights before anything is written.
"""

import argparse
import re
import shlex

import torch

from ..modeling import HubViTConfig
from .card import CardInfo
from .common import ConversionError, StrictMapping, read_weights
from .folder import build_model, expected_shapes, make_image_processor, write_folder
from .timm import clean_state_dict

TOLERANCE = 1e-5
ARCHITECTURES = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
LAYER = re.compile(r"encoder\.layers\.encoder_layer_(\d+)\..*")

RENAMES = [
    (r"conv_proj\.(weight|bias)", r"embeddings.patch_embedding.\1"),
    (r"class_token", "embeddings.class_token"),
    (r"encoder\.pos_embedding", "embeddings.position_embedding"),
    (r"encoder\.layers\.encoder_layer_(\d+)\.ln_([12])\.(weight|bias)", r"encoder.layers.\1.norm\2.\3"),
    (r"encoder\.layers\.encoder_layer_(\d+)\.self_attention\.in_proj_(weight|bias)", r"encoder.layers.\1.attention.qkv.\2"),
    (r"encoder\.layers\.encoder_layer_(\d+)\.self_attention\.out_proj\.(weight|bias)", r"encoder.layers.\1.attention.proj.\2"),
    (r"encoder\.layers\.encoder_layer_(\d+)\.mlp\.0\.(weight|bias)", r"encoder.layers.\1.mlp.fc1.\2"),
    (r"encoder\.layers\.encoder_layer_(\d+)\.mlp\.3\.(weight|bias)", r"encoder.layers.\1.mlp.fc2.\2"),
    (r"encoder\.ln\.(weight|bias)", r"norm.\1"),
    (r"heads\.pre_logits\.(weight|bias)", r"pre_logits.0.\1"),
    (r"heads\.head\.(weight|bias)", r"classifier.\1"),
]


def add_arguments(parser):
    parser.add_argument("src", metavar="SRC", help="state dict of torchvision's VisionTransformer (.pth or .safetensors)")
    parser.add_argument("out", metavar="OUT", help="hubvit folder to write")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--architecture", choices=ARCHITECTURES, help="the torchvision.models builder of the weights")
    which.add_argument("--num-heads", type=int, help="heads of a VisionTransformer built directly with other sizes")
    parser.add_argument(
        "--image-size",
        type=int,
        help="native resolution (384 or 512 for the SWAG weights); a position table for another grid is resized "
        "with torchvision's interpolate_embeddings. Default: the resolution of the table in SRC",
    )
    parser.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run torchvision and the converted model on the same input and fail above tolerance (default: on)",
    )
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="relative tolerance of --verify (1e-5)")


def import_torchvision():
    try:
        import torchvision
    except ImportError:
        raise ConversionError("converting torchvision checkpoints needs torchvision: pip install torchvision") from None
    return torchvision


def shape(weights, key, what):
    if key not in weights:
        raise ConversionError(f"no {key} in the state dict ({what}); is this torchvision's VisionTransformer?")
    return tuple(weights[key].shape)


def read_sizes(weights):
    """The sizes a torchvision ViT state dict shows in its shapes (everything but the head count)."""
    hidden, channels, patch, patch_w = shape(weights, "conv_proj.weight", "patch embedding")
    if patch != patch_w:
        raise ConversionError(f"conv_proj.weight is {patch}x{patch_w}: torchvision's ViT has square patches")
    rows = shape(weights, "encoder.pos_embedding", "position table")[1] - 1
    grid = round(rows**0.5)
    if grid * grid != rows:
        raise ConversionError(f"encoder.pos_embedding has {rows} patch rows, not a square grid")
    layers = {int(m.group(1)) for key in weights if (m := LAYER.fullmatch(key))}
    if sorted(layers) != list(range(len(layers))) or not layers:
        raise ConversionError(f"encoder layers {sorted(layers)} are not numbered 0..N-1")
    sizes = dict(
        patch_size=patch,
        num_layers=len(layers),
        hidden_dim=hidden,
        mlp_dim=shape(weights, "encoder.layers.encoder_layer_0.mlp.0.weight", "MLP")[0],
        num_classes=shape(weights, "heads.head.weight", "classifier")[0],
        representation_size=shape(weights, "heads.pre_logits.weight", "")[0] if "heads.pre_logits.weight" in weights else None,
    )
    return sizes, channels, grid * patch


def architecture_sizes(name, image_size, sizes):
    """Builder `name`'s settings on the meta device; refuses weights whose shapes disagree with them."""
    torchvision = import_torchvision()
    extra = dict(num_classes=sizes["num_classes"], representation_size=sizes["representation_size"])
    with torch.device("meta"):
        model = torchvision.models.get_model(name, image_size=image_size, **extra)
    layer = model.encoder.layers[0]
    built = dict(
        patch_size=model.patch_size,
        num_layers=len(model.encoder.layers),
        hidden_dim=model.hidden_dim,
        mlp_dim=model.mlp_dim,
    )
    wrong = [f"{key}={sizes[key]} (torchvision {name}: {value})" for key, value in built.items() if sizes[key] != value]
    if wrong:
        raise ConversionError(f"these weights are not torchvision's {name}: " + ", ".join(wrong))
    return layer.self_attention.num_heads


def reference_model(sizes, num_heads, image_size, state_dict):
    """torchvision's own VisionTransformer holding `state_dict`, for the check."""
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=image_size, num_heads=num_heads, **sizes)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def label_names(num_classes):
    if num_classes == 1000:
        from torchvision.models import ViT_B_16_Weights

        return dict(enumerate(ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"])), "torchvision's ImageNet categories"
    return {i: f"LABEL_{i}" for i in range(num_classes)}, "no names in the checkpoint (LABEL_i)"


def hubvit_config(sizes, num_heads, channels, image_size, id2label):
    return HubViTConfig(
        image_size=image_size,
        patch_size=sizes["patch_size"],
        num_channels=channels,
        hidden_size=sizes["hidden_dim"],
        num_hidden_layers=sizes["num_layers"],
        num_attention_heads=num_heads,
        intermediate_size=sizes["mlp_dim"],
        hidden_act="gelu",
        layer_norm_eps=1e-6,
        interpolation_mode="bicubic",
        interpolation_antialias=False,
        interpolation_align_corners=True,
        pooling="cls",
        representation_size=sizes["representation_size"],
        num_labels=sizes["num_classes"],
        id2label=id2label,
    )


def map_weights(weights, config, description):
    mapping = StrictMapping(weights, description)
    for key in weights:
        for pattern, target in RENAMES:
            if re.fullmatch(pattern, key):
                mapping.map(re.sub(pattern, target, key), key)
                break
    return mapping.finish(expected_shapes(config)), mapping


@torch.no_grad()
def verify(reference, model, tolerance):
    """Max |torchvision - hubvit| of the logits on one random batch at the native size, and what exceeds tolerance."""
    height, width = model.config.image_size_2d
    pixels = torch.randn(2, model.config.num_channels, height, width, generator=torch.Generator().manual_seed(0))
    theirs, ours = reference(pixels), model(pixel_values=pixels).logits
    diff, scale = (theirs - ours).abs().max().item(), theirs.abs().max().item()
    line = f"max |Δlogits| = {diff:.2e} (max |logits| = {scale:.3g})"
    failed = None if diff <= tolerance * scale else f"max |Δlogits| {diff:.3g} > {tolerance:g} x {scale:.3g}"
    return diff, line, failed


def main(args):
    torchvision = import_torchvision()
    from torchvision.models.vision_transformer import interpolate_embeddings

    weights = clean_state_dict(read_weights(args.src))
    sizes, channels, table_size = read_sizes(weights)
    image_size = args.image_size or table_size
    if image_size % sizes["patch_size"]:
        raise ConversionError(f"--image-size {image_size} is not a multiple of the patch size {sizes['patch_size']}")
    num_heads = args.num_heads
    if args.architecture:
        num_heads = architecture_sizes(args.architecture, image_size, sizes)
    if num_heads <= 0 or sizes["hidden_dim"] % num_heads:
        raise ConversionError(f"--num-heads {num_heads} does not divide the width {sizes['hidden_dim']}")
    if image_size != table_size:
        weights = dict(interpolate_embeddings(image_size, sizes["patch_size"], dict(weights)))
        print(
            f"position table resized from {table_size} to {image_size} px with torchvision's interpolate_embeddings "
            "(bicubic, align_corners=True)"
        )
    id2label, label_source = label_names(sizes["num_classes"])
    config = hubvit_config(sizes, num_heads, channels, image_size, id2label)
    name = args.architecture or f"VisionTransformer({sizes['hidden_dim']}d{sizes['num_layers']}/{sizes['patch_size']})"
    state_dict, mapping = map_weights(weights, config, f"torchvision {name} state dict ({args.src})")
    model = build_model(config, state_dict)
    for line in mapping.report():
        print(line)
    print(f"labels: {label_source}")

    max_abs_diff, verification = None, None
    if args.verify:
        reference = reference_model(sizes, num_heads, image_size, weights)
        max_abs_diff, line, failed = verify(reference, model, args.tolerance)
        print(f"verify: {line}")
        if failed:
            raise ConversionError(f"the converted model does not reproduce torchvision {name}; nothing was written.\n    {failed}")
        verification = (
            f"torchvision {torchvision.__version__} `VisionTransformer` ({name}) and this model, same weights, one "
            f"random float32 batch of 2x{channels}x{image_size}x{image_size}: {line}. Tolerance {args.tolerance:g} "
            "relative to the output scale. At other resolutions the position table is resized as torchvision's "
            "`interpolate_embeddings` does (bicubic, align_corners=True, no antialias)."
        )
    command = ["hubvit", "convert", "torchvision", str(args.src), str(args.out)]
    command += ["--architecture", args.architecture] if args.architecture else ["--num-heads", str(num_heads)]
    command += ["--image-size", str(args.image_size)] if args.image_size else []
    card = CardInfo(
        provenance=(
            f"Converted from a torchvision {name} state dict with torchvision {torchvision.__version__}.\n\n"
            f"torchvision's weight transforms resize and centre-crop (IMAGENET1K_V1: resize 256, crop 224); the image "
            f"processor here resizes the whole image to {image_size}x{image_size}. Labels: {label_source}."
        ),
        command=shlex.join(command),
        family="torchvision",
        verification=verification,
        max_abs_diff=max_abs_diff,
        dropped=mapping.report()[1:],
        title=f"hubvit torchvision {name}",
    )
    processor = make_image_processor(config, *IMAGENET, resample="bilinear")
    out = write_folder(model, args.out, processor, card, overwrite=getattr(args, "overwrite", False))
    print(f"wrote {out}")
    return out
