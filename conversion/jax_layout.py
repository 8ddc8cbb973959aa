"""The two layouts of an original JAX ViT checkpoint (`.npz`), read without converting anything.

google-research/vision_transformer (pre-Linen module names, the position table with its [CLS] row under
`Transformer/posembed_input`) and google-research/big_vision (Linen names, top-level `pos_embedding` without a [CLS]
row, blocks looped or scanned along a leading depth axis, an optional MAP head): where the image tower sits in the
archive (`detect_layout`), and the hubvit config its array shapes give (`read_config`). jax.py maps the arrays.
"""

import math
import re
from dataclasses import dataclass

from .common import ConversionError, listing
from .kinds import BIG_VISION_NAFLEX_POOL_TYPE, BIG_VISION_POOL_TYPE, reading

PREFIXES = ("params/img/", "opt/target/", "params/", "")
BLOCK_NAMES = {
    "vision_transformer": ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
    "big_vision": ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"),
}
POOL_TYPES = reading(BIG_VISION_POOL_TYPE)
DEFAULT_NATIVE_SIZE = 224


@dataclass
class Layout:
    """Where the ViT sits in the archive and how its modules are named."""

    name: str
    prefix: str
    scanned: bool
    depth: int
    naflex: bool = False  # big_vision's NaFlex ViT: a Dense patch embedding and an (n, n, D) table

    def block(self, index):
        """Key prefix of block `index` and its index into the leading depth axis (None when blocks are looped)."""
        if self.scanned:
            return f"{self.prefix}Transformer/encoderblock", index
        return f"{self.prefix}Transformer/encoderblock_{index}", None


def detect_layout(source, path):
    """The layout of `source`, or `ConversionError` listing the keys when it is not a ViT checkpoint."""
    prefixes = [p for p in PREFIXES if f"{p}embedding/kernel" in source]
    if not prefixes:
        raise ConversionError(
            f"{path} is not a ViT checkpoint: no 'embedding/kernel' under any of the prefixes "
            f"{[p or '(none)' for p in PREFIXES]}. Keys found ({len(source)}):\n{listing(source)}"
        )
    prefix = prefixes[0]
    inside = [key[len(prefix) :] for key in source if key.startswith(prefix)]
    original = any(
        key.startswith("Transformer/posembed_input/") or "/MultiHeadDotProductAttention_1/" in key for key in inside
    )
    name = "vision_transformer" if original else "big_vision"
    scanned = any(key.startswith("Transformer/encoderblock/") for key in inside)
    if scanned:
        norm = f"{prefix}Transformer/encoderblock/{BLOCK_NAMES[name][0]}/scale"
        if norm not in source:
            raise ConversionError(f"{path}: scanned blocks without {norm!r}, which gives the depth")
        depth = source[norm].shape[0]
        wrong = [
            f"{key}: {tuple(source[key].shape)}"
            for key in source
            if key.startswith(f"{prefix}Transformer/encoderblock/") and source[key].shape[:1] != (depth,)
        ]
        if wrong:
            raise ConversionError(f"{path}: scanned block arrays must all lead with depth {depth}:\n{listing(wrong)}")
    else:
        looped = (re.match(r"Transformer/encoderblock_(\d+)/", key) for key in inside)
        indices = {int(match.group(1)) for match in looped if match}
        if not indices:
            raise ConversionError(
                f"{path}: no encoder blocks under '{prefix}Transformer/encoderblock_<i>/' or "
                f"'{prefix}Transformer/encoderblock/'. Keys found:\n{listing(source)}"
            )
        depth = max(indices) + 1
    naflex = name == "big_vision" and len(source[f"{prefix}embedding/kernel"].shape) == 2
    return Layout(name, prefix, scanned, depth, naflex)


def _shape(source, key, layout, path):
    if key not in source:
        raise ConversionError(
            f"{path}: the {layout.name} layout needs {key!r}, which the file lacks; keys found:\n{listing(source)}"
        )
    return tuple(source[key].shape)


def read_config(source, layout, args, path):
    """(HubViTConfig fields, number of labels) read from the array shapes and the few options the keys cannot tell."""
    p = layout.prefix
    kernel = _shape(source, f"{p}embedding/kernel", layout, path)
    if layout.naflex:
        return naflex_config(source, layout, args, path)
    if len(kernel) != 4:
        raise ConversionError(
            f"{path}: {p}embedding/kernel has shape {kernel}; expected 4 dimensions "
            "(patch height, patch width, channels, width)"
        )
    ph, pw, channels, _ = kernel
    class_token = f"{p}cls" in source
    has_map = map_head(source, p, path)

    pool_type = args.pool_type or ("tok" if class_token else "map" if has_map else "gap")
    if pool_type == "tok" and not class_token:
        raise ConversionError(f"{path}: --pool-type tok needs a [CLS] token, but there is no '{p}cls'")
    if pool_type == "map" and not has_map:
        raise ConversionError(f"{path}: --pool-type map needs '{p}MAPHead_0/...', which the file lacks")
    if class_token and pool_type != "tok":
        raise ConversionError(f"{path}: the file has a [CLS] token ('{p}cls'), so it pools with it (pool_type tok)")
    if has_map and pool_type != "map":
        raise ConversionError(f"{path}: the file has a MAP head ('{p}MAPHead_0/...'); its pool_type is map")

    table_key = (
        f"{p}Transformer/posembed_input/pos_embedding" if layout.name == "vision_transformer" else (f"{p}pos_embedding")
    )
    fields = {}
    if table_key in source:
        if args.position_embedding:
            raise ConversionError(
                f"{path} has a learned position table {table_key!r}; "
                f"--position-embedding {args.position_embedding} is for checkpoints without one"
            )
        rows = source[table_key].shape[1]
        includes_prefix = layout.name == "vision_transformer"
        patches = rows - (int(class_token) if includes_prefix else 0)
        side = math.isqrt(patches)
        if side * side != patches:
            raise ConversionError(f"{path}: {table_key} covers {patches} patches, not a square grid")
        fields.update(
            position_embedding_type="learned",
            position_embedding_includes_prefix=includes_prefix,
            image_size=[side * ph, side * pw] if ph != pw else side * ph,
        )
    elif args.position_embedding is None:
        raise ConversionError(
            f"{path} has no position table ({table_key!r} is absent): it was trained with a fixed table or none. "
            "Pass --position-embedding sincos_2d (big_vision posemb='sincos2d') or --position-embedding none"
        )
    else:
        fields.update(
            position_embedding_type=args.position_embedding,
            position_embedding_includes_prefix=False,
            image_size=args.image_size or DEFAULT_NATIVE_SIZE,
        )

    representation, num_labels = head_fields(source, layout, args, path)

    return dict(
        patch_size=[ph, pw] if ph != pw else ph,
        num_channels=channels,
        **encoder_fields(source, layout, args, path),
        class_token=class_token,
        pooling=POOL_TYPES[pool_type],
        representation_size=representation,
        interpolation_mode="bilinear",
        interpolation_antialias=False,
        interpolation_align_corners=True,
        **fields,
    ), num_labels


def encoder_fields(source, layout, args, path):
    """Width, depth, heads, MLP width, GELU and LayerNorm epsilon, from the first block's shapes."""
    names = BLOCK_NAMES[layout.name]
    first, _ = layout.block(0)
    return dict(
        hidden_size=_shape(source, f"{layout.prefix}embedding/kernel", layout, path)[-1],
        num_hidden_layers=layout.depth,
        num_attention_heads=_shape(source, f"{first}/{names[1]}/query/kernel", layout, path)[-2],
        intermediate_size=_shape(source, f"{first}/{names[3]}/Dense_0/kernel", layout, path)[-1],
        hidden_act="gelu_pytorch_tanh" if args.gelu == "tanh" else "gelu",
        layer_norm_eps=1e-6,
    )


def head_fields(source, layout, args, path):
    """(representation size or None, number of labels) after --drop-pre-logits and --num-labels."""
    p = layout.prefix
    if args.drop_pre_logits and f"{p}pre_logits/kernel" not in source:
        raise ConversionError(f"--drop-pre-logits: {path} has no {p}pre_logits layer to drop")
    representation = None
    if f"{p}pre_logits/kernel" in source and not args.drop_pre_logits:
        representation = source[f"{p}pre_logits/kernel"].shape[-1]
    if args.num_labels is not None:
        return representation, args.num_labels
    if args.drop_pre_logits and f"{p}pre_logits/kernel" in source:
        return representation, 0
    return representation, source[f"{p}head/kernel"].shape[-1] if f"{p}head/kernel" in source else 0


NAFLEX_POOL_TYPES = reading(BIG_VISION_NAFLEX_POOL_TYPE)


def map_head(source, p, path):
    """Whether the file has a MAP head; one whose arrays are there without its probe is refused, naming it (the
    rest would otherwise be listed as arrays no rule maps, as if the file pooled another way)."""
    probe = f"{p}MAPHead_0/probe"
    if probe not in source and any(key.startswith(f"{p}MAPHead_0/") for key in source):
        raise ConversionError(
            f"{path}: the MAP head's arrays are there but not its probe ('{probe}'): an incomplete file"
        )
    return probe in source


def naflex_config(source, layout, args, path):
    """big_vision's NaFlex ViT (models/proj/image_text/naflex_vit.py): a Dense patch embedding over (row, column,
    channel) pixels, an (n, n, D) table resized to each image's grid bilinearly with antialias (SigLIP 2's rule),
    no [CLS], pooling over patches only."""
    p = layout.prefix
    pixels, _ = _shape(source, f"{p}embedding/kernel", layout, path)
    patch = math.isqrt(pixels // 3)
    if patch * patch * 3 != pixels:
        raise ConversionError(
            f"{path}: {p}embedding/kernel embeds {pixels} values per patch; expected P * P * 3 (RGB patches)"
        )
    if f"{p}patchln_pre/scale" in source:
        raise ConversionError(
            f"{path}: '{p}patchln_pre' normalises each patch's pixels before the embedding; hubvit has no norm there "
            "(patchln_post, after it, converts)"
        )
    if args.image_size:
        raise ConversionError(
            f"--image-size {args.image_size}: a NaFlex table is resized to each image's own grid as it runs; "
            "nothing is converted for one size"
        )
    table = _shape(source, f"{p}pos_embedding", layout, path)
    if len(table) != 3 or table[0] != table[1]:
        raise ConversionError(f"{path}: {p}pos_embedding has shape {table}; expected a square (n, n, width) grid")
    has_map = map_head(source, p, path)
    pool_type = args.pool_type or ("map" if has_map else "gap")
    if (pool_type == "map") != has_map or pool_type not in NAFLEX_POOL_TYPES:
        raise ConversionError(
            f"{path}: --pool-type {pool_type} with{'' if has_map else 'out'} a MAP head; a NaFlex tower pools with "
            f"{'map' if has_map else 'gap'}"
        )
    representation, num_labels = head_fields(source, layout, args, path)
    return dict(
        patch_size=patch,
        num_channels=3,
        **encoder_fields(source, layout, args, path),
        class_token=False,
        pooling=NAFLEX_POOL_TYPES[pool_type],
        representation_size=representation,
        patch_norm=f"{p}patchln_post/scale" in source,
        position_embedding_type="learned",
        position_embedding_includes_prefix=False,
        image_size=table[0] * patch,
        interpolation_mode="bilinear",
        interpolation_antialias=True,
        interpolation_align_corners=False,
    ), num_labels
