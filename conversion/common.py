"""What every converter shares: the `Conversion` record a converter returns, the records the API returns, and (re-exported
from their own modules) safe reading of weight files (`weights`), the strict key mapper (`mapping`), the check against
the source (`verification`), and the options every converter shares (`ConversionOptions`).

A converter module reads its source and returns a `Conversion` (weights, config fields, preprocessing, labels, a
reference forward of the source); `folder.write_conversion` then builds the model, runs `verify`, writes the folder and
returns a `ConversionResult`.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConversionError, listing
from ..preprocessing import Preprocessing
from ..limits import check_config_sizes
from ..options import TOLERANCE, argument, flag, nonempty_path, option, path_text, positive, settle
from .patch_size import check_patch_size
from .mapping import StrictMapping
from .verification import Verification, hubvit_outputs, verify
from .weights import CORRUPT_FILE_ERRORS, WEIGHT_SUFFIXES, check_finite, read_weights, shard_files, to_tensor

__all__ = [
    "CORRUPT_FILE_ERRORS",
    "TOLERANCE",
    "WEIGHT_SUFFIXES",
    "Conversion",
    "ConversionError",
    "ConversionResult",
    "ExportOptions",
    "ExportResult",
    "Reference",
    "StrictMapping",
    "Verification",
    "ConversionOptions",
    "check_finite",
    "hubvit_outputs",
    "listing",
    "load_hubvit",
    "make_config",
    "read_hubvit_config",
    "read_weights",
    "shard_files",
    "to_tensor",
    "verify",
]


@dataclass
class Reference:
    """The SOURCE implementation's forward pass, which the converted model must reproduce.

    `forward(pixel_values)` takes an NCHW float32 batch and returns a dict of outputs named as hubvit names them
    (`logits`, `pooler_output`, `last_hidden_state`); `verify` runs it on a seeded random batch of `batch` images at
    each of `sizes` (None: the model's resolution). With `forward=None`, `reason` says why the file was not verified.
    """

    description: str
    forward: Callable | None = None
    sizes: tuple = (None,)
    batch: int = 2
    tolerance: float = TOLERANCE
    reason: str | None = None

    @classmethod
    def unavailable(cls, reason):
        return cls(description="none", reason=reason)


@dataclass
class Conversion:
    """Everything a converter learns from its source; `folder.write_conversion` turns it into a hubvit folder.

    `weights`: the hubvit state dict (keys without the `hubvit.` prefix where the body holds them); `config`:
    HubViTConfig fields other than the labels; `labels`: id2label ({} for a headless model); `dropped`: the mapper's
    lines about tensors not carried over. The card texts (`provenance`, `command`, `family`, `license`,
    `citation_key`, `title`) say where the weights came from; `source` where SRC itself came from
    (`sources.Source.record()`: Hub repo id and resolved commit, or address and sha256; {} for a local path).
    `notes`: what else the conversion did to the weights, for the result's lines.
    """

    weights: dict
    config: dict
    preprocessing: Preprocessing
    labels: dict
    reference: Reference
    provenance: str
    command: str
    family: str
    dropped: list = field(default_factory=list)
    license: str | None = None
    citation_key: str | list | None = None
    title: str | None = None
    source: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def make_config(conversion):
    """The HubViTConfig of `conversion`: its fields plus the labels (a headless model has none)."""
    from ..modeling import HubViTConfig

    check_config_sizes(conversion.config, "the converted config")
    labels = {int(k): str(v) for k, v in conversion.labels.items()}
    if sorted(labels) != list(range(len(labels))):
        raise ConversionError(f"labels must be numbered 0..{len(labels) - 1}, got ids {sorted(labels)[:10]}")
    try:
        config = HubViTConfig(
            **conversion.config,
            num_labels=len(labels),
            id2label=labels or None,
            label2id={name: i for i, name in labels.items()} or None,
        )
    except ValueError as error:  # the config's own checks: a checkpoint hubvit cannot express
        raise ConversionError(f"the converted settings are not a valid hubvit config: {error}") from None
    if not labels:
        config.id2label, config.label2id = {}, {}
    return config


def read_hubvit_config(src):
    """(HubViTConfig, raw config.json) of the hubvit folder SRC that an export reads; one clear error otherwise."""
    from ..modeling import HubViTConfig

    src = Path(src)
    if not src.is_dir():
        raise ConversionError(f"{src}: no such folder" if not src.exists() else f"{src}: not a folder")
    path = src / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConversionError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ConversionError(f"{path}: expected a JSON object of config fields, got a JSON {type(raw).__name__}")
    if raw.get("model_type") != HubViTConfig.model_type:
        raise ConversionError(
            f"{src}: not a hubvit folder (config.json model_type={raw.get('model_type')!r}, expected 'hubvit')"
        )
    check_config_sizes(raw, str(path))
    try:
        return HubViTConfig.from_pretrained(str(src)), raw
    except ValueError as error:
        raise ConversionError(f"{path}: not a valid hubvit config: {error}") from None


@dataclass(frozen=True)
class CheckedCopyOptions:
    """What every conversion and export reads: SRC, OUT, whether to replace OUT, and the tolerance of the check of
    what is written against what was read."""

    src: str = argument("SRC", "what to read")
    out: str = argument("OUT", "where to write")
    overwrite: bool = option(False, "replace OUT if it exists")
    tolerance: float = option(TOLERANCE, f"relative tolerance of the check against SRC ({TOLERANCE:g})")

    def __post_init__(self):
        settle(
            self,
            src=nonempty_path(self.src, "src"),
            out=path_text(self.out, "out"),
            overwrite=flag(self.overwrite, "overwrite"),
            tolerance=positive(self.tolerance, "tolerance"),
        )


@dataclass(frozen=True)
class ConversionOptions(CheckedCopyOptions):
    """What every converter reads besides its own options: SRC, OUT, and how the result is checked and served."""

    src: str = argument("SRC", "the checkpoint to convert")
    out: str = argument("OUT", "hubvit folder to write")
    tolerance: float = option(
        TOLERANCE,
        f"relative tolerance of the check: max |difference| <= tolerance x max |source output| ({TOLERANCE:g})",
    )
    verify: bool = option(
        True,
        "run the source implementation and the converted model on the same input and fail above tolerance",
    )
    patch_size: int | tuple | str | None = option(
        None,
        "serve the converted model at this patch size (int or HxW): verified at the source's patch size, then the "
        "patch embedding PI-resized (FlexiViT) and the position table resized to the new grid; the card records it",
        metavar="P",
    )

    def __post_init__(self):
        super().__post_init__()
        settle(self, verify=flag(self.verify, "verify"), patch_size=check_patch_size(self.patch_size))


@dataclass(frozen=True)
class ExportOptions(CheckedCopyOptions):
    """What every export reads: the hubvit folder SRC, OUT, and the tolerance of the check against SRC."""

    src: str = argument("SRC", "hubvit folder (config.json + model.safetensors)")
    tolerance: float = option(TOLERANCE, f"relative tolerance of the check against the hubvit folder ({TOLERANCE:g})")


@dataclass(frozen=True)
class ConversionResult:
    """What a conversion wrote: the hubvit `folder`, and the largest |difference| from the source's own forward over
    every checked output and size (`max_abs_diff`, None when not verified, `verification` then says why).

    `lines`: what the conversion has to say (tensors dropped and why, preprocessing notes, the verification figures
    per output and size), which the command line prints."""

    folder: Path
    max_abs_diff: float | None
    verification: str
    lines: tuple = ()


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: the folder or file at `path`, and the largest |difference| between the exported model
    and the hubvit folder over every checked output (`lines`: one per output and size; `notes`: tensors dropped and
    settings changed on the way, which the command line prints)."""

    path: Path
    max_abs_diff: float
    lines: tuple = ()
    notes: tuple = ()


def load_hubvit(src):
    """The hubvit folder SRC as a `HubViTForImageClassification` in eval mode (a headless folder gets an identity
    head), read strictly by `hubvit.folder.load`: every weight filled, none left over."""
    from ..folder import load

    read_hubvit_config(src)
    return load(src, classifier=True, dtype="float32")


BLOCK_COMPONENTS = (
    "key_bias",
    "qkv_fused",
    "qk_norm",
    "proj_bias",
    "mlp_bias",
    "norm_type",
    "norm_placement",
    "scale_attention_branch_only",
    "mlp_type",
    "mlp_inner_norm",
    "attention_inner_norm",
    "rope_type",
    "attention_window_size",
    "decomposed_relative_position",
    "neck_size",
)


def block_component_problems(config, target):
    """The block's component settings that differ from the paper's block (fused qkv with all three biases,
    LayerNorm, fc1-activation-fc2), each named with its value, for an export to `target`, whose plain ViT class has
    only the paper's block."""
    from ..modeling import HubViTConfig

    paper = HubViTConfig()
    problems = []
    for name in BLOCK_COMPONENTS:
        value = getattr(config, name)
        if value != getattr(paper, name) and not (name == "key_bias" and not config.qkv_bias):
            problems.append(f"{name}={value!r} ({target} builds {name}={getattr(paper, name)!r} only)")
    return problems


NOT_STRUCTURAL = {
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "drop_path_rate",
    "initializer_range",
    "_out_features",
    "_out_indices",
    "apply_layernorm",
    "reshape_hidden_states",
    "interpolation_mode",
    "interpolation_antialias",
    "interpolation_align_corners",
    "patch_resize",
    "decode_head_pixels",
    "semantic_loss_ignore_index",
}
"""Config fields a read-back need not reproduce: training-only rates, the backbone's outputs, and the resize mode
(the target's own, said in the export's notes)."""


def effective_settings(config):
    """The structural fields of `config` as the model uses them (defaults resolved, fields that only matter beside
    another left out), for comparing two configs of one model."""
    from ..modeling import HubViTConfig
    from ..modeling.heads_hubvit import POOLING_KINDS
    from ..modeling.positions_hubvit import POSITION_KINDS

    values = {name: getattr(config, name) for name in HubViTConfig.__annotations__ if name not in NOT_STRUCTURAL}
    values.update(image_size=tuple(config.image_size_2d), patch_size=tuple(config.patch_size_2d))
    values["layer_scale_init_value"] = config.layer_scale_init_value is not None
    values["final_layer_norm_eps"] = config.final_norm_eps
    if config.rotary_kind is None:
        values = {k: v for k, v in values.items() if not k.startswith("rope_") or k == "rope_type"}
    else:
        values.update(rope_temperature=config.rope_base, rope_rotate_half=config.rope_pairs_halves)
        values["rope_reference_grid"] = list(config.rope_reference_grid) if config.rope_reference_grid else None
    values.update(map_num_heads=config.map_heads, map_intermediate_size=config.map_width)
    for registry, chosen in ((POOLING_KINDS, config.pooling_kind), (POSITION_KINDS, config.position_kind)):
        for kind in registry.values():
            for name in kind.own_fields if kind is not chosen else ():
                values.pop(name, None)
    if not config.distillation_token:
        del values["distillation_head"]
    if not config.qkv_bias:
        del values["key_bias"]
    return values


def read_back_problems(config, settings, name):
    """Each structural field on which `settings` (an exported model as its converter reads it back) differs from
    `config`; `name` says which model."""
    from ..modeling import HubViTConfig

    ours = effective_settings(config)
    theirs = effective_settings(HubViTConfig(**settings, num_labels=config.num_labels))
    return [
        f"{key}={ours.get(key)!r} ({name} reads back as {theirs.get(key)!r})"
        for key in sorted(set(ours) | set(theirs))
        if ours.get(key) != theirs.get(key)
    ]


def linear_patch_kernel(weight, patch_size, channels):
    """A linear patch projection over (row, column, channel) pixels (SigLIP 2 NaFlex, timm's NaFlexVit), (D, P * P * C),
    as hubvit's stride-P kernel (D, C, P, P)."""
    (ph, pw) = patch_size
    return weight.reshape(weight.shape[0], ph, pw, channels).permute(0, 3, 1, 2)
