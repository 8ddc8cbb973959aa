"""`hubvit convert torchvision`: a state dict of torchvision's `VisionTransformer` (vit_b_16 ... vit_h_14) as a hubvit
folder.

Sizes are read from the tensor shapes; the head count, which no shape carries, comes from the torchvision builder
named by `--architecture` (or `--num-heads` for a `VisionTransformer` built with other sizes). torchvision changes
resolution only offline, with `interpolate_embeddings` (bicubic, `align_corners=True`): `--image-size` uses that
function itself, and the config records the same interpolation so hubvit's on-the-fly resizing agrees with it.
The result is checked against torchvision's own forward on the same weights before anything is written.
"""

import re
import shlex
from dataclasses import dataclass

import torch

from ..modeling import HubViTConfig
from ..errors import HubViTError
from ..options import argument, choice, option, settle, text, whole
from ..preprocessing import Preprocessing, resample_name
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

ARCHITECTURES = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
LAYER = re.compile(r"encoder\.layers\.encoder_layer_(\d+)\..*")
BLOCK = r"encoder\.layers\.encoder_layer_(\d+)\."

RENAMES = [
    (r"conv_proj\.(weight|bias)", r"embeddings.patch_embedding.\1"),
    (r"class_token", "embeddings.class_token"),
    (r"encoder\.pos_embedding", "embeddings.position_embedding"),
    (BLOCK + r"ln_([12])\.(weight|bias)", r"encoder.layers.\1.norm\2.\3"),
    (BLOCK + r"self_attention\.in_proj_(weight|bias)", r"encoder.layers.\1.attention.qkv.\2"),
    (BLOCK + r"self_attention\.out_proj\.(weight|bias)", r"encoder.layers.\1.attention.proj.\2"),
    (BLOCK + r"mlp\.0\.(weight|bias)", r"encoder.layers.\1.mlp.fc1.\2"),
    (BLOCK + r"mlp\.3\.(weight|bias)", r"encoder.layers.\1.mlp.fc2.\2"),
    (r"encoder\.ln\.(weight|bias)", r"norm.\1"),
    (r"heads\.pre_logits\.(weight|bias)", r"pre_logits.0.\1"),
    (r"heads\.head\.(weight|bias)", r"classifier.\1"),
]


@dataclass(frozen=True)
class Options(ConversionOptions):
    """Convert a state dict of torchvision's `VisionTransformer` into a hubvit folder at OUT, after checking it
    against torchvision's own forward (`verify`, within `tolerance` of the output scale). Exactly one of
    `architecture` or `num_heads` says how many heads it has."""

    src: str = argument("SRC", "torchvision VisionTransformer state dict (.pth, .safetensors)")
    architecture: str | None = option(
        None, "the torchvision.models builder of the weights (or --num-heads)", choices=ARCHITECTURES
    )
    num_heads: int | None = option(
        None, "heads of a VisionTransformer built directly with other sizes (or --architecture)"
    )
    image_size: int | None = option(
        None,
        "native resolution (384 or 512 for the SWAG weights); a position table for another grid is resized "
        "with torchvision's interpolate_embeddings. Default: the resolution of the table in SRC",
    )
    weights: str | None = option(
        None,
        "the torchvision weights the file holds (IMAGENET1K_V1, IMAGENET1K_SWAG_E2E_V1, ...), whose transforms "
        "become the preprocessing; default: the first of --architecture's weights whose crop is the image size",
        metavar="ENUM",
    )

    def __post_init__(self):
        super().__post_init__()
        if (self.architecture is None) == (self.num_heads is None):
            raise HubViTError(
                f"architecture={self.architecture!r}, num_heads={self.num_heads!r}; give exactly one: the "
                f"torchvision builder ({', '.join(ARCHITECTURES)}) or the head count"
            )
        settle(
            self,
            architecture=choice(self.architecture, ARCHITECTURES, "architecture", optional=True),
            num_heads=whole(self.num_heads, "num_heads", minimum=1),
            image_size=whole(self.image_size, "image_size", minimum=1),
            weights=text(self.weights, "weights"),
        )


def run(options: Options) -> ConversionResult:
    return run_conversion(convert, options)


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
    kernel = shape(weights, "conv_proj.weight", "patch embedding")
    if len(kernel) != 4:
        raise ConversionError(
            f"conv_proj.weight has shape {kernel}; expected 4 dimensions (width, channels, patch, patch)"
        )
    hidden, channels, patch, patch_w = kernel
    if patch != patch_w:
        raise ConversionError(f"conv_proj.weight is {patch}x{patch_w}: torchvision's ViT has square patches")
    rows = shape(weights, "encoder.pos_embedding", "position table")[1] - 1
    grid = round(rows**0.5)
    if grid * grid != rows:
        raise ConversionError(f"encoder.pos_embedding has {rows} patch rows, not a square grid")
    layers = {int(m.group(1)) for key in weights if (m := LAYER.fullmatch(key))}
    if sorted(layers) != list(range(len(layers))) or not layers:
        raise ConversionError(f"encoder layers {sorted(layers)} are not numbered 0..N-1")
    pre_logits = weights.get("heads.pre_logits.weight")
    sizes = dict(
        patch_size=patch,
        num_layers=len(layers),
        hidden_dim=hidden,
        mlp_dim=shape(weights, "encoder.layers.encoder_layer_0.mlp.0.weight", "MLP")[0],
        num_classes=shape(weights, "heads.head.weight", "classifier")[0],
        representation_size=int(pre_logits.shape[0]) if pre_logits is not None else None,
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


def reference(args, sizes, num_heads, image_size, state_dict, name):
    """torchvision's own VisionTransformer holding the (resized) source weights."""
    import torchvision
    from torchvision.models.vision_transformer import VisionTransformer

    if not args.verify:
        return Reference.unavailable("skipped (--no-verify)")
    model = VisionTransformer(image_size=image_size, num_heads=num_heads, **sizes)
    model.load_state_dict(state_dict, strict=True)
    model.eval()
    return Reference(
        f"torchvision {torchvision.__version__} `VisionTransformer` ({name})",
        lambda pixels: {"logits": model(pixels)},
        tolerance=args.tolerance,
    )


def preprocessing(architecture, image_size, chosen=None):
    """The evaluation transform of the torchvision weights enum `chosen` of `architecture`, by default the first whose
    crop is `image_size` (IMAGENET1K_V1 at 224, the SWAG end-to-end weights at 384/512/518)."""
    from torchvision.models import get_model_weights

    mean, std = IMAGENET
    if chosen and not architecture:
        raise ConversionError(f"--weights {chosen} needs --architecture (weights belong to a torchvision builder)")
    if architecture:
        enums = list(get_model_weights(architecture))
        if chosen:
            names = [weights.name for weights in enums]
            if chosen not in names:
                raise ConversionError(f"--weights {chosen}: torchvision's {architecture} has {names}")
            enums = [weights for weights in enums if weights.name == chosen]
        for weights in enums:
            transform = weights.transforms()
            if chosen or transform.crop_size == [image_size]:
                crop, resize = transform.crop_size[0], transform.resize_size[0]
                return Preprocessing(
                    mean=tuple(transform.mean),
                    std=tuple(transform.std),
                    resample=resample_name(transform.interpolation.value),
                    size=(crop, crop),
                    crop_pct=crop / resize,
                    notes=[
                        f"torchvision's {weights} evaluates with resize {resize} ({transform.interpolation.value}), "
                        f"centre crop {crop}; the image processor here resizes the whole image to {crop}x{crop}"
                    ],
                )
    return Preprocessing(
        mean=mean,
        std=std,
        resample="bilinear",
        notes=["no torchvision weights enum at this size: ImageNet mean and std, bilinear resize to the model's size"],
    )


def label_names(num_classes):
    if num_classes == 1000:
        from torchvision.models import ViT_B_16_Weights

        return dict(enumerate(ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"])), "torchvision's ImageNet categories"
    return {i: f"LABEL_{i}" for i in range(num_classes)}, "no names in the checkpoint (LABEL_i)"


def settings(sizes, num_heads, channels, image_size):
    """HubViTConfig fields of a torchvision ViT: erf GELU, eps 1e-6, [CLS], and interpolate_embeddings' resize."""
    return dict(
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
    )


def map_weights(weights, description):
    """The strict mapper holding a torchvision state dict translated to hubvit names."""
    mapping = StrictMapping(weights, description)
    mapping.rename(RENAMES)
    return mapping


def convert(args):
    """The `Conversion` of a torchvision VisionTransformer state dict; `args` is an `Options`."""
    torchvision = import_torchvision()
    from torchvision.models.vision_transformer import interpolate_embeddings

    weights = clean_state_dict(read_weights(args.src))
    sizes, channels, table_size = read_sizes(weights)
    if args.image_size is not None and args.image_size <= 0:
        raise ConversionError(f"--image-size {args.image_size}; expected a positive number of pixels")
    image_size = args.image_size or table_size
    if image_size % sizes["patch_size"]:
        raise ConversionError(f"--image-size {image_size} is not a multiple of the patch size {sizes['patch_size']}")
    num_heads = args.num_heads
    if args.architecture:
        num_heads = architecture_sizes(args.architecture, image_size, sizes)
    if num_heads <= 0 or sizes["hidden_dim"] % num_heads:
        raise ConversionError(f"--num-heads {num_heads} does not divide the width {sizes['hidden_dim']}")
    resized = ""
    if image_size != table_size:
        weights = dict(interpolate_embeddings(image_size, sizes["patch_size"], dict(weights)))
        resized = (
            f"position table resized from {table_size} to {image_size} px with torchvision's interpolate_embeddings "
            "(bicubic, align_corners=True)"
        )
    labels, label_source = label_names(sizes["num_classes"])
    fields = settings(sizes, num_heads, channels, image_size)
    name = args.architecture or f"VisionTransformer({sizes['hidden_dim']}d{sizes['num_layers']}/{sizes['patch_size']})"
    mapping = map_weights(weights, f"torchvision {name} state dict ({args.src})")
    state_dict = mapping.finish(expected_shapes(HubViTConfig(**fields, num_labels=len(labels))))
    command = ["hubvit", "convert", "torchvision", str(args.src), str(args.out)]
    command += ["--architecture", args.architecture] if args.architecture else ["--num-heads", str(num_heads)]
    command += ["--image-size", str(args.image_size)] if args.image_size else []
    command += ["--weights", args.weights] if args.weights else []
    return Conversion(
        weights=state_dict,
        config=fields,
        preprocessing=preprocessing(args.architecture, image_size, args.weights),
        labels=labels,
        reference=reference(args, sizes, num_heads, image_size, weights, name),
        provenance=f"Converted from a torchvision {name} state dict with torchvision {torchvision.__version__}.\n\n"
        f"Labels: {label_source}. {resized + '. ' if resized else ''}At other resolutions the position table is "
        "resized as torchvision's `interpolate_embeddings` does (bicubic, align_corners=True, no antialias).",
        command=shlex.join(command),
        family="torchvision",
        dropped=mapping.report(),
        title=f"hubvit torchvision {name}",
        notes=[resized] if resized else [],
    )
