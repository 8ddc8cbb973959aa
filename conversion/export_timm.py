"""`hubvit export timm`: a hubvit folder as a timm Hub-layout folder that timm loads with no hubvit installed.

The folder becomes the timm class it would have been converted from: `VisionTransformer` where its settings allow,
else `Beit` (the BEiT relative bias), `VisionTransformerRelPos` (the relpos bias MLP) or `Eva` (rotary positions,
gated MLPs, RMSNorm, the EVA and DINOv3 attention). The class is built with JSON-only `model_args` (what a Hub config
can carry); a family's build is accepted only when `hubvit convert timm`'s own reader reads it back as the same
config, and its weights are that reader's mapping run backwards (`mapping.inverse`). Both are checked against
hubvit's own forward and written by timm's own `save_for_hf` (config.json with `architecture`, `model_args`,
`pretrained_cfg`, labels; model.safetensors). Settings timm cannot express are refused, all of them listed at once.
"""

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from ..modeling.heads_hubvit import AttentionPooling, ClassTokenPooling, MeanPooling
from ..modeling.positions_hubvit import RelativeBias2DWithClass, RelativeBiasMLP
from ..options import argument
from ..preprocessing import RESAMPLE_NAMES
from .common import (
    block_component_problems,
    ConversionError,
    ExportOptions,
    ExportResult,
    StrictMapping,
    load_hubvit,
    read_back_problems,
    read_hubvit_config,
    verify,
)
from ..folder import check_output_path, expected_shapes, staged_folder
from . import timm_beit, timm_eva, timm_relpos, timm_sam
from .kinds import TIMM_GLOBAL_POOL, TIMM_POS_EMBED
from .mapping import inverse
from .timm import RENAMES, import_timm, map_weights, timm_reference
from .timm_layers import mlp_ratio
from .transformers import read_json

logger = logging.getLogger(__name__)

TIMM_INTERPOLATION = ("bicubic", True, False)
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
    "relu": "relu",
}
POOLS = {kind: TIMM_GLOBAL_POOL[kind] for kind in (ClassTokenPooling, MeanPooling, AttentionPooling)}
"""The pooling kinds timm's `VisionTransformer` export writes, with their `global_pool`."""
# timm entry points whose code sets the LayerNorm eps (a JSON model_args cannot carry a norm_layer with another eps);
# every structural argument is passed explicitly on top of them.
ENTRY_POINTS = {1e-6: "vit_base_patch16_224", 1e-5: "vit_base_patch16_clip_224"}
DISTILLED_ENTRY_POINT = "deit_base_distilled_patch16_224"
FAMILY_BY_POSITION = {RelativeBias2DWithClass: timm_beit, RelativeBiasMLP: timm_relpos}
"""The position kinds only one timm class has; any other folder whose settings `model_args` alone cannot give
`VisionTransformer` is tried as a `VisionTransformer` from an entry point that sets a constructor, then as `Eva`."""
CONSTRUCTOR_ENTRY_POINTS = [
    "vit_base_patch16_224",
    "vit_base_patch16_clip_224",
    "beit3_base_patch16_224",
    "vit_giant_patch14_dinov2",
    "aimv2_large_patch14_224",
    "vit_base_patch16_rpn_224",
]
"""`VisionTransformer` entry points by what their code sets beside JSON arguments: LayerNorm 1e-6 or 1e-5, BEiT-3's
1e-5 norms, DINOv2's packed SwiGLU, AIMv2's RMSNorm with a patch norm and SwiGLU, residual post-norm blocks."""
PACKED_GATED_MLP = {"vit_giant_patch14_dinov2"}
"""Entry points whose MLP (`SwiGLUPacked`) counts both gated halves in `mlp_ratio`."""


@dataclass(frozen=True)
class Options(ExportOptions):
    """Write the hubvit folder SRC as a timm Hub-layout folder (`timm.create_model("local-dir:OUT")` loads it with
    no hubvit installed), after both agree within `tolerance`; settings timm cannot express are refused."""

    out: str = argument("OUT", "timm Hub-layout folder to write (config.json + model.safetensors)")


def run(options: Options) -> ExportResult:
    check_output_path(options.out, options.src)
    return export(options)


def export_problems(config):
    """Settings of `config` timm's VisionTransformer cannot be told through config.json (empty when it can)."""
    eps = config.layer_norm_eps
    checks = [
        (
            config.position_kind not in TIMM_POS_EMBED,
            f"position_embedding_type={config.position_embedding_type!r} (timm's ViT has a learned 1D table or none)",
        ),
        (config.pooling_kind not in POOLS, f"pooling={config.pooling!r} (timm pools with 'token', 'avg' or 'map')"),
        (
            config.representation_size is not None,
            f"representation_size={config.representation_size} (timm's ViT has no Dense + tanh pre-logits layer)",
        ),
        (
            eps not in ENTRY_POINTS,
            f"layer_norm_eps={eps:g} (timm's ViT entry points build LayerNorms with eps 1e-6, or 1e-5 for CLIP)",
        ),
        (
            config.final_layer_norm_eps not in (None, eps),
            f"final_layer_norm_eps={config.final_layer_norm_eps} differs from layer_norm_eps={eps:g} (timm uses one "
            "norm layer for the blocks and the final norm)",
        ),
        (
            config.patch_bias == config.pre_norm,
            f"patch_bias={config.patch_bias} with pre_norm={config.pre_norm} (timm's patch convolution has a bias "
            "exactly when there is no pre-norm)",
        ),
        (
            config.distillation_token and not config.distillation_head,
            "distillation_token=True with distillation_head=False (timm's distilled DeiT always has both heads)",
        ),
        (
            config.distillation_token
            and (config.num_register_tokens or eps != 1e-6 or config.pooling_kind is not ClassTokenPooling),
            "distillation_token=True with registers, eps other than 1e-6 or pooling other than cls",
        ),
        (config.hidden_act not in ACTIVATIONS, f"hidden_act={config.hidden_act!r}"),
    ]
    ratio = config.intermediate_size / config.hidden_size
    checks.append(
        (
            int(config.hidden_size * ratio) != config.intermediate_size,
            f"intermediate_size={config.intermediate_size} is not int(hidden_size * mlp_ratio) for any float ratio",
        )
    )
    return [text for bad, text in checks if bad] + block_component_problems(config, "timm's VisionTransformer")


def timm_interpolation(config):
    return (config.interpolation_mode, config.interpolation_antialias, config.interpolation_align_corners)


def timm_arguments(config, entry_point=True):
    """(timm entry point, JSON model_args) building timm's VisionTransformer for `config` (no entry point with
    `entry_point=False`)."""
    if not entry_point:
        architecture = None
    else:
        architecture = DISTILLED_ENTRY_POINT if config.distillation_token else ENTRY_POINTS[config.layer_norm_eps]
    pool_include_prefix = config.pooling_kind.attention_pool and config.num_prefix_tokens > 0
    args = dict(
        img_size=list(config.image_size_2d),
        patch_size=list(config.patch_size_2d),
        in_chans=config.num_channels,
        num_classes=config.num_labels,
        global_pool=POOLS[config.pooling_kind],
        embed_dim=config.hidden_size,
        depth=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        mlp_ratio=config.intermediate_size / config.hidden_size,
        qkv_bias=config.qkv_bias,
        init_values=config.layer_scale_init_value,
        class_token=config.class_token,
        pos_embed=TIMM_POS_EMBED.get(config.position_kind),
        no_embed_class=not config.position_embedding_includes_prefix,
        reg_tokens=config.num_register_tokens,
        pre_norm=config.pre_norm,
        fc_norm=config.fc_norm,
        final_norm=config.final_norm,
        dynamic_img_size=any_size(config),
        dynamic_img_pad=config.dynamic_img_pad,
        act_layer=ACTIVATIONS[config.hidden_act],
    )
    if pool_include_prefix:
        args["pool_include_prefix"] = True
    for ours, theirs in (
        ("hidden_dropout_prob", "proj_drop_rate"),
        ("attention_probs_dropout_prob", "attn_drop_rate"),
        ("drop_path_rate", "drop_path_rate"),
    ):
        if getattr(config, ours):
            args[theirs] = getattr(config, ours)
    return architecture, args


def divides(config):
    return all(side % patch == 0 for side, patch in zip(config.image_size_2d, config.patch_size_2d))


def any_size(config):
    """Whether timm's model may run at any size (`dynamic_img_size=True`): only where it resizes as hubvit does, and
    the native size is whole patches (timm's dynamic patch embedding refuses a remainder that hubvit leaves out)."""
    return timm_interpolation(config) == TIMM_INTERPOLATION and divides(config)


def export_notes(config, timm_model):
    notes = []
    if not divides(config):
        (height, width), (ph, pw) = config.image_size_2d, config.patch_size_2d
        notes.append(
            f"{height}x{width} is not whole {ph}x{pw} patches: timm's model runs at its native size only "
            "(dynamic_img_size=False), where its patch embedding leaves the last pixels out as hubvit does"
        )
    elif not hasattr(timm_model, "dynamic_img_size") and getattr(timm_model.patch_embed, "strict_img_size", True):
        notes.append(f"timm's {type(timm_model).__name__} has no dynamic_img_size: it runs at its native size only")
    if timm_interpolation(config) != TIMM_INTERPOLATION:
        mode, antialias, align_corners = timm_interpolation(config)
        notes.append(
            f"position tables resize with {mode}, antialias={antialias}, align_corners={align_corners} in hubvit; timm "
            "can only resize with bicubic + antialias, so the timm model is built for the native size only "
            "(dynamic_img_size=False)"
        )
    return notes


def hubvit_name(timm_key):
    """The hubvit tensor (without `hubvit.`) a timm key is read from, by the rename table of `hubvit convert timm`."""
    for pattern, target in RENAMES:
        if re.fullmatch(pattern, timm_key):
            return re.sub(pattern, target, timm_key)
    return None


def map_to_timm(weights, timm_shapes, description):
    """The timm state dict of a hubvit one, through the shared strict mapper."""
    mapping = StrictMapping(weights, description)
    for timm_key in timm_shapes:
        source = hubvit_name(timm_key)
        if source is None:
            raise ConversionError(f"timm tensor {timm_key} has no hubvit counterpart in the rename table")
        mapping.map(timm_key, source)
    return mapping.finish(timm_shapes), mapping


def data_config(src, config):
    """timm preprocessing (mean, std, interpolation, input size, crop_pct) of the folder's preprocessor_config.json."""
    path = Path(src) / "preprocessor_config.json"
    height, width = config.image_size_2d
    if not path.is_file():
        return dict(input_size=(config.num_channels, height, width), crop_pct=1.0)
    cfg = read_json(path)
    result = dict(input_size=(config.num_channels, height, width), crop_pct=1.0)
    if cfg.get("image_mean") is not None:
        result["mean"] = tuple(float(m) for m in cfg["image_mean"])
    if cfg.get("image_std") is not None:
        result["std"] = tuple(float(s) for s in cfg["image_std"])
    if cfg.get("resample") in RESAMPLE_NAMES:
        result["interpolation"] = RESAMPLE_NAMES[cfg["resample"]]
    crop, size = cfg.get("crop_size") or {}, cfg.get("size") or {}
    if cfg.get("do_center_crop") and crop.get("height"):
        result["input_size"] = (config.num_channels, crop["height"], crop["width"])
        if cfg.get("crop_pct"):
            result["crop_pct"] = float(cfg["crop_pct"])
        elif size.get("shortest_edge"):
            result["crop_pct"] = crop["height"] / size["shortest_edge"]
    return result


def label_fields(config):
    """timm's `label_names` for a head with real names (none for headless models or LABEL_i placeholders)."""
    if not config.num_labels:
        return {}
    names = [str(config.id2label[i]) for i in range(config.num_labels)]
    if names == [f"LABEL_{i}" for i in range(config.num_labels)]:
        return {}
    return {"label_names": names}


def card_text(args, architecture, config, lines, notes):
    """A short timm-style model card: where the weights came from, how to load them, the measured check."""
    import timm
    from huggingface_hub import ModelCard, ModelCardData

    from .. import __version__

    tags = ["image-classification" if config.num_labels else "image-feature-extraction", "timm", "hubvit"]
    data = ModelCardData(library_name="timm", tags=tags).to_yaml()
    (h, w) = config.image_size_2d
    body = [
        f"# {Path(args.out).name}",
        f"Exported from the hubvit folder `{args.src}` with `hubvit export timm {args.src} {args.out}` (hubvit "
        f"{__version__}, timm {timm.__version__}): timm's `{architecture}` entry point with every structural "
        "argument in `model_args`.",
        "## Loading",
        "```python\nimport timm\n"
        'model = timm.create_model("local-dir:path/to/this/folder", pretrained=True).eval()\n'
        '# once uploaded: timm.create_model("hf-hub:OWNER/NAME", pretrained=True)\n```',
        "## Verification",
        f"timm and hubvit, same weights, a seeded random float32 batch of 2x{config.num_channels}x{h}x{w}: "
        + "; ".join(lines)
        + f". Tolerance {args.tolerance:g} relative to the output scale.",
    ]
    if notes:
        body += ["## Notes", "\n".join(f"- {note}" for note in notes)]
    return ModelCard(f"---\n{data}\n---\n\n" + "\n\n".join(body) + "\n")


def create(timm, architecture, model_args, num_labels, device="cpu"):
    """timm's model from an entry point, with a bare pretrained_cfg: the entry point's own (tag, license, hub id of
    its default weights) is not ours."""
    import torch

    default = timm.models.get_pretrained_cfg(architecture)
    bare = dict(num_classes=num_labels, first_conv=default.first_conv, classifier=default.classifier)
    with torch.device(device):
        return timm.create_model(architecture, pretrained=False, pretrained_cfg=bare, **model_args).eval()


def constructor_arguments(config):
    """([(candidate entry point, model_args)], why not) for timm's `VisionTransformer` with every block setting it
    takes as a JSON argument; the entry point supplies what only code can (norm layer, MLP class, block class)."""
    if config.hidden_act not in ACTIVATIONS or config.pooling_kind not in POOLS or config.distillation_token:
        return [], f"hidden_act={config.hidden_act!r}, pooling={config.pooling!r} or a distillation token"
    args = timm_arguments(config, entry_point=False)[1]
    args.update(
        mlp_ratio=mlp_ratio(config.hidden_size, config.intermediate_size),
        qk_norm=config.qk_norm,
        proj_bias=config.proj_bias,
        scale_attn_norm=config.attention_inner_norm,
        scale_mlp_norm=config.mlp_inner_norm,
    )
    packed = dict(args, mlp_ratio=mlp_ratio(config.hidden_size, 2 * config.intermediate_size))
    return [(entry, packed if entry in PACKED_GATED_MLP else args) for entry in CONSTRUCTOR_ENTRY_POINTS], None


def family_candidates(config):
    """(reader's read_settings, [(entry point, model_args)], why none) of each timm class to try, in order."""
    from .timm import read_settings

    def pairs(entries, args):
        return ([(entry, args) for entry in entries], None) if entries else ([], args)

    family = FAMILY_BY_POSITION.get(config.position_kind)
    if config.attention_window_size or config.decomposed_relative_position or config.neck_size:
        family = timm_sam
    if family is not None:
        return [(family.read_settings, *pairs(*family.export_arguments(config)))]
    entries, eva_args = timm_eva.export_arguments(config)
    if entries:
        eva_args["dynamic_img_size"] = any_size(config)
    return [(read_settings, *constructor_arguments(config)), (timm_eva.read_settings, *pairs(entries, eva_args))]


def family_build(timm, config):
    """(entry point, model_args, timm model) for a folder `VisionTransformer`'s JSON arguments cannot express: the
    first candidate that `hubvit convert timm`'s reader reads back as `config` (tried on the meta device, then
    built); else the list of what the last family tried reads back differently."""
    problems = []
    for read_settings, candidates, why_none in family_candidates(config):
        problems = [] if candidates else [why_none]
        for architecture, model_args in candidates:
            try:
                trial = create(timm, architecture, model_args, config.num_labels, device="meta")
            except (TypeError, AssertionError, ValueError, RuntimeError, KeyError) as error:
                found = [f"timm's {architecture} cannot be built from model_args {model_args}: {error}"]
            else:
                settings, found = read_settings(trial, architecture)
                found = found or read_back_problems(config, settings, f"timm's {architecture} built from model_args")
            if not found:
                return architecture, model_args, create(timm, architecture, model_args, config.num_labels)
            problems = problems or found
    return problems


def family_weights(timm_model, config, hubvit_weights, description):
    """timm's state dict for `hubvit_weights`: `hubvit convert timm`'s mapping for the family, run backwards."""

    shapes = expected_shapes(config)

    def forward(source):
        return map_weights(source, description, timm_model).finish(shapes)

    target = {key: hubvit_weights[key] for key in shapes}
    state, filled = inverse(forward, timm_model.state_dict(), target, description)
    unfilled = sorted(name for name, _ in timm_model.named_parameters() if name not in filled)
    if unfilled:
        raise ConversionError(f"{description}: timm parameters no hubvit tensor fills: {', '.join(unfilled)}")
    return state, [f"mapped {len(target)} hubvit tensors onto {len(filled)} timm tensors ({type(timm_model).__name__})"]


def export(args):
    """Write the hubvit folder `args.src` (read with `from_pretrained`) as a timm folder at `args.out`; `args` is an
    `Options`."""
    timm = import_timm()
    from timm.models import save_for_hf

    config, _ = read_hubvit_config(args.src)
    problems = export_problems(config)
    built = family_build(timm, config) if problems or config.position_kind in FAMILY_BY_POSITION else None
    if isinstance(built, list):
        raise ConversionError(
            "no timm class can express this hubvit model; nothing was written. Offending settings:\n"
            + "".join(f"    timm's VisionTransformer: {p}\n" for p in problems)
            + "\n".join(f"    {p}" for p in built)
        )
    model = load_hubvit(args.src)
    hubvit_weights = {key.removeprefix("hubvit."): value for key, value in model.state_dict().items()}
    if built is None:
        architecture, model_args = timm_arguments(config)
        timm_model = create(timm, architecture, model_args, config.num_labels)
        timm_shapes = {key: tuple(value.shape) for key, value in timm_model.state_dict().items()}
        state_dict, mapping = map_to_timm(hubvit_weights, timm_shapes, f"hubvit folder ({args.src})")
        report = mapping.report()
    else:
        architecture, model_args, timm_model = built
        description = f"timm {architecture} folder for the hubvit folder ({args.src})"
        state_dict, report = family_weights(timm_model, config, hubvit_weights, description)
    timm_model.load_state_dict(state_dict, strict=True)

    notes = export_notes(config, timm_model)
    description = f"the exported timm {import_timm().__version__} `{architecture}`"
    exported = timm_reference(timm_model, description, args.tolerance)
    result = verify(exported, model)
    lines = result.lines
    with staged_folder(args.out, args.overwrite) as staging:
        save_for_hf(
            timm_model,
            staging,
            model_config=label_fields(config),
            model_args=model_args,
            safe_serialization=True,
            data_config=data_config(args.src, config),
        )
        card_text(args, architecture, config, lines, notes).save(staging / "README.md")
    logger.info("wrote %s (timm %s with model_args, timm %s)", args.out, architecture, timm.__version__)
    return ExportResult(Path(args.out), result.max_abs_diff, tuple(lines), tuple(report + notes))
