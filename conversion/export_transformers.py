"""`hubvit export transformers`: a hubvit folder as transformers' built-in `ViTForImageClassification`, or as the
vision tower class it came from.

A hubvit folder that transformers' ViT can express becomes a `ViTForImageClassification` (or `ViTModel` without
pooler when headless) folder written by transformers' own `save_pretrained`, after both models agree on one batch.
A headless folder ViT cannot express becomes the first of DINOv3 ViT, SigLIP, CLIP, AIMv2, I-JEPA and BEiT whose
config the converter reads back as the folder's (export_transformers_towers.py); anything else is refused with the
list of offending settings.
"""

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..modeling.heads_hubvit import ClassTokenPooling
from ..options import argument
from .common import (
    block_component_problems,
    ConversionError,
    ExportOptions,
    ExportResult,
    Reference,
    StrictMapping,
    load_hubvit,
    read_hubvit_config,
    verify,
)
from ..folder import check_output_path, make_image_processor, staged_folder
from . import export_transformers_towers as towers
from .kinds import ABSOLUTE_TABLES

logger = logging.getLogger(__name__)

VIT_INTERPOLATION = ("bicubic", False, False)
VIT_LAYER_NAMES = {
    "norm1": "layernorm_before",
    "attention.proj": "attention.o_proj",
    "norm2": "layernorm_after",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}


def export_problems(config):
    """Settings of a hubvit config transformers' ViT cannot express (empty when it can)."""
    from transformers.activations import ACT2FN

    checks = [
        (not config.class_token, "class_token=False (ViT always prepends [CLS])"),
        (config.distillation_token, "distillation_token=True (DeiT, not ViT)"),
        (config.num_register_tokens, f"num_register_tokens={config.num_register_tokens} (ViT has no registers)"),
        (
            config.position_kind not in ABSOLUTE_TABLES,
            f"position_embedding_type={config.position_embedding_type!r} (ViT has a learned 1D table)",
        ),
        (config.pooling_kind is not ClassTokenPooling, f"pooling={config.pooling!r} (ViT classifies the [CLS] token)"),
        (config.fc_norm, "fc_norm=True (ViT norms before pooling)"),
        (config.layer_scale_init_value is not None, "layer_scale_init_value set (ViT has no layer scale)"),
        (config.pre_norm, "pre_norm=True (ViT has no LayerNorm before the encoder)"),
        (config.representation_size is not None, f"representation_size={config.representation_size} (no pre-logits)"),
        (config.dynamic_img_pad, "dynamic_img_pad=True (ViT does not pad inputs)"),
        (config.hidden_act not in ACT2FN, f"hidden_act={config.hidden_act!r} (not in transformers' ACT2FN)"),
    ]
    return [text for bad, text in checks if bad] + block_component_problems(config, "transformers' ViTModel")


def export_notes(config):
    """What changes without affecting the outputs at the native resolution."""
    notes = []
    interpolation = (config.interpolation_mode, config.interpolation_antialias, config.interpolation_align_corners)
    if interpolation != VIT_INTERPOLATION:
        notes.append(
            f"interpolation {interpolation} becomes ViT's (bicubic, antialias=False, align_corners=False): outputs at "
            "other resolutions (interpolate_pos_encoding=True) differ from hubvit's"
        )
    if config.drop_path_rate:
        notes.append(f"drop_path_rate={config.drop_path_rate} is dropped: ViT has no stochastic depth (training only)")
    if not config.position_embedding_includes_prefix:
        notes.append("the position table has no [CLS] row: ViT's gets a zero row (same outputs at every size)")
    if len(set(config.image_size_2d)) > 1 or len(set(config.patch_size_2d)) > 1:
        notes.append("non-square image or patch: ViT runs it at the native size but cannot interpolate its table")
    return notes


def vit_config(config):
    from transformers import ViTConfig

    labels = {}
    if config.num_labels:
        id2label = {int(k): v for k, v in config.id2label.items()}
        labels = dict(id2label=id2label, label2id=config.label2id or {v: k for k, v in id2label.items()})
    return ViTConfig(
        **towers.sizes(config),
        layer_norm_eps=config.layer_norm_eps,
        qkv_bias=config.qkv_bias,
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        initializer_range=config.initializer_range,
        num_labels=config.num_labels,
        **labels,
    )


def map_to_vit(weights, config, prefix, description):
    """The shared strict mapper from a hubvit state dict to ViT's v5 in-memory names under `prefix`."""
    mapping = StrictMapping(weights, description)
    dim = config.hidden_size
    ours, theirs = "hubvit.embeddings.", f"{prefix}embeddings."
    mapping.map(f"{theirs}cls_token", f"{ours}class_token")
    table = f"{ours}position_embedding"
    if config.position_embedding_includes_prefix:
        mapping.map(f"{theirs}position_embeddings", table)
    else:
        mapping.map(f"{theirs}position_embeddings", table, lambda t: torch.cat([torch.zeros_like(t[:, :1]), t], 1))
    patch = f"{theirs}patch_embeddings.projection."
    mapping.map(f"{patch}weight", f"{ours}patch_embedding.weight")
    if config.patch_bias:
        mapping.map(f"{patch}bias", f"{ours}patch_embedding.bias")
    else:
        mapping.create(
            f"{patch}bias",
            torch.zeros(dim),
            "patch_bias=False: ViT's patch convolution has a bias; zero gives the same outputs",
        )
    for i in range(config.num_hidden_layers):
        src, dst = f"hubvit.encoder.layers.{i}.", f"{prefix}layers.{i}."
        for part in ("weight", "bias") if config.qkv_bias else ("weight",):
            for n, name in enumerate(("q_proj", "k_proj", "v_proj")):
                rows = slice(n * dim, (n + 1) * dim)
                mapping.map(f"{dst}attention.{name}.{part}", f"{src}attention.qkv.{part}", lambda t, r=rows: t[r])
        for name, vit_name in VIT_LAYER_NAMES.items():
            for part in ("weight", "bias"):
                mapping.map(f"{dst}{vit_name}.{part}", f"{src}{name}.{part}")
    for part in ("weight", "bias"):
        mapping.map(f"{prefix}layernorm.{part}", f"hubvit.norm.{part}")
        if config.num_labels:
            mapping.map(f"classifier.{part}", f"classifier.{part}")
    return mapping


def build_vit(config, weights, description):
    """transformers' ViTForImageClassification (ViTModel without pooler when headless) holding `weights`."""
    from transformers import ViTForImageClassification, ViTModel

    headless = not config.num_labels
    vit_class, kwargs = (ViTModel, {"add_pooling_layer": False}) if headless else (ViTForImageClassification, {})
    vit_cfg = vit_config(config)
    vit_cfg.architectures = [vit_class.__name__]
    model = vit_class(vit_cfg, **kwargs).eval()
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    mapping = map_to_vit(weights, config, "" if headless else "vit.", description)
    model.load_state_dict(mapping.finish(shapes), strict=True)
    return model, mapping


@dataclass(frozen=True)
class Options(ExportOptions):
    """Write the hubvit folder SRC as transformers' built-in `ViTForImageClassification` (`ViTModel` when headless)
    at OUT, or a headless folder ViT cannot express as the vision tower class it reads back as (DINOv3 ViT, SigLIP,
    CLIP, AIMv2, I-JEPA, BEiT), after both agree within `tolerance`; what no class expresses is refused, listed."""

    out: str = argument("OUT", "folder for transformers' ViTForImageClassification / ViTModel or the tower's class")


def run(options: Options) -> ExportResult:
    check_output_path(options.out, options.src)
    return export(options)


def export(args):
    """Export `args.src` (read with `from_pretrained`) as transformers' ViT at `args.out`, checked against the hubvit
    model first; `args` is an `Options`."""
    import transformers
    from transformers import AutoImageProcessor, ViTImageProcessor

    src, out = Path(args.src), Path(args.out)
    config, _ = read_hubvit_config(src)
    problems = export_problems(config)
    tower = towers.choose(config) if problems else None
    if isinstance(tower, list) or (tower is not None and config.num_labels):
        reason = (
            [f"{tower[0]} is a vision model without a classification head; this folder has {config.num_labels} classes"]
            if isinstance(tower, tuple)
            else tower
        )
        raise ConversionError(
            "no transformers class can express this hubvit model; nothing was written. Offending settings:\n"
            + "".join(f"    transformers' ViT: {p}\n" for p in problems)
            + "\n".join(f"    {p}" for p in reason)
        )
    hubvit_model = load_hubvit(src)
    if tower is None:
        model, mapping = build_vit(config, hubvit_model.state_dict(), f"hubvit folder ({src})")
        notes = tuple(mapping.report() + export_notes(config))
    else:
        weights = {key.removeprefix("hubvit."): value for key, value in hubvit_model.state_dict().items()}
        model, report = towers.build(*tower, config, weights, f"{tower[0]} folder for the hubvit folder ({src})")
        notes = tuple(report)
    run = model if tower is None else tower[1].run_on_images(model)

    def forward(pixels):
        outputs = run(pixel_values=pixels)
        if config.num_labels:
            return {"logits": outputs.logits}
        pooled = (
            {}
            if getattr(outputs, "pooler_output", None) is None or tower is None
            else {"pooler_output": outputs.pooler_output}
        )
        return {"last_hidden_state": outputs.last_hidden_state, **pooled}

    exported = Reference(
        f"the exported transformers {transformers.__version__} `{type(model).__name__}`",
        forward,
        tolerance=args.tolerance,
    )
    result = verify(exported, hubvit_model)

    with staged_folder(out, args.overwrite) as staging:
        model.save_pretrained(staging)
        if (src / "preprocessor_config.json").is_file():
            (ViTImageProcessor if tower is None else AutoImageProcessor).from_pretrained(str(src)).save_pretrained(
                staging
            )
        else:
            make_image_processor(config).save_pretrained(staging)
    logger.info("wrote %s (%s)", out, type(model).__name__)
    return ExportResult(out, result.max_abs_diff, tuple(result.lines), notes)
