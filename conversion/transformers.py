"""`hubvit convert transformers`: a folder saved by transformers' ViT, DeiT, DINOv2 or DINOv2-with-registers.

Both key spellings are read: the legacy names `save_pretrained` still writes on disk (`encoder.layer.{i}.attention.
attention.query`, `layernorm_before`, `intermediate.dense`, ...) and the v5 in-memory names (`layers.{i}.attention.
q_proj`, `mlp.fc1`, ...). The result is checked against transformers' own forward before anything is written.
The way back (a hubvit folder as transformers' ViT) is `export_transformers`.
"""

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from ..modeling import HubViTConfig
from ..modeling.configuration_hubvit import HIDDEN_ACTS
from . import sources
from ..options import argument, flag, option, settle, text
from ..preprocessing import Preprocessing, resample_name
from .common import (
    ConversionError,
    Conversion,
    ConversionOptions,
    ConversionResult,
    Reference,
    StrictMapping,
    read_weights,
    shard_files,
)
from ..folder import expected_shapes
from .folder import run_conversion
from .preprocessing import from_transformers
from . import transformers_beit, transformers_clip, transformers_towers
from .transformers_towers import map_tower, prefix_of, vision_config

# architecture -> (family, head); the family names transformers' config class and interpolation.
ARCHITECTURES = {
    "ViTModel": ("vit", None),
    "ViTForImageClassification": ("vit", "classifier"),
    "ViTMSNModel": ("vit_msn", None),
    "ViTMAEModel": ("vit_mae", None),
    "ViTMAEForPreTraining": ("vit_mae", None),  # the encoder; the pixel decoder of pre-training is named and dropped
    "ViTMSNForImageClassification": ("vit_msn", "classifier"),
    "DeiTModel": ("deit", None),
    "DeiTForImageClassification": ("deit", "cls_only"),
    "DeiTForImageClassificationWithTeacher": ("deit", "teacher"),
    "Dinov2Model": ("dinov2", None),
    "Dinov2Backbone": ("dinov2", None),  # the body; its stages are chosen when the folder is loaded as a backbone
    "Dinov2ForImageClassification": ("dinov2", "cls_and_mean"),
    "Dinov2WithRegistersModel": ("dinov2_with_registers", None),
    "Dinov2WithRegistersForImageClassification": ("dinov2_with_registers", "cls_and_mean"),
}
BASE_MODELS = {
    "vit": "ViTModel",
    "vit_msn": "ViTMSNModel",
    "vit_mae": "ViTMAEModel",
    "deit": "DeiTModel",
    "dinov2": "Dinov2Model",
    "dinov2_with_registers": "Dinov2WithRegistersModel",
}
CONFIG_CLASSES = {
    "vit": "ViTConfig",
    "vit_msn": "ViTMSNConfig",
    "vit_mae": "ViTMAEConfig",
    "deit": "DeiTConfig",
    "dinov2": "Dinov2Config",
    "dinov2_with_registers": "Dinov2WithRegistersConfig",
}
# Each family's `interpolate_pos_encoding` (5.24): bicubic, align_corners=False; only DINOv2-with-registers antialiases.
ANTIALIAS = {
    "vit": False,
    "vit_msn": False,
    "vit_mae": False,
    "deit": False,
    "dinov2": False,
    "dinov2_with_registers": True,
}
# Image processing when SRC has no preprocessor_config.json: (mean, std, resample) of the family's processor.
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
DEFAULT_PREPROCESSING = {
    "vit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear"),
    "vit_msn": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear"),
    "vit_mae": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear"),
    "deit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bicubic"),
    "dinov2": (*IMAGENET, "bicubic"),
    "dinov2_with_registers": (*IMAGENET, "bicubic"),
}
CITATION_KEYS = {"deit": "deit", "dinov2": "dinov2", "dinov2_with_registers": "dinov2"}
TOWERS = {**transformers_towers.TOWERS, **transformers_clip.TOWERS, **transformers_beit.TOWERS}
"""The vision towers read through a `Tower` (transformers_towers.py), by architecture."""
"""The key of `card.CITATIONS` for each family's paper."""

# Per-layer tensors: hubvit name -> (legacy on-disk name, v5 in-memory name), under `encoder.layer.{i}.` or
# `layers.{i}.` (ViT/DeiT in memory).
LAYER_NAMES = {
    "norm1": ("layernorm_before", "norm1"),
    "q": ("attention.attention.query", "attention.q_proj"),
    "k": ("attention.attention.key", "attention.k_proj"),
    "v": ("attention.attention.value", "attention.v_proj"),
    "attention.proj": ("attention.output.dense", "attention.o_proj"),
    "norm2": ("layernorm_after", "norm2"),
    "mlp.fc1": ("intermediate.dense", "mlp.fc1"),
    "mlp.fc2": ("output.dense", "mlp.fc2"),
}
POOLER_REASON = (
    "transformers' pooler (dense + tanh on [CLS]) is not a hubvit layer; hubvit's pooler_output is the normed [CLS] "
    "token (DeiT: mean of the normed [CLS] and distillation tokens)"
)


@dataclass(frozen=True)
class Options(ConversionOptions):
    """Convert a folder written by transformers' ViT, DeiT or DINOv2 `save_pretrained` (or a Hub repo id at
    `revision`) into a hubvit folder at OUT, after checking it against transformers' own forward (`verify`, within
    `tolerance` of the output scale)."""

    src: str = argument("SRC", "folder written by transformers' save_pretrained, or a Hub repo id")
    drop_head: bool = option(False, "convert only the body of a classifier (a headless hubvit folder)")
    revision: str | None = option(None, sources.REVISION_HELP)

    def __post_init__(self):
        super().__post_init__()
        settle(self, drop_head=flag(self.drop_head, "drop_head"), revision=text(self.revision, "revision"))


def run(options: Options) -> ConversionResult:
    return run_conversion(convert, options)


# ---------------------------------------------------------------------------------------------------------- reading


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConversionError(f"{path}: not valid JSON ({error})") from None


def read_folder_weights(src):
    """All tensors of a folder: model.safetensors, its sharded index, or pytorch_model.bin (no pickled code run)."""
    src = Path(src)
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (src / name).is_file():
            weights = {}
            for shard in shard_files(src / name):
                weights.update(read_weights(shard))
            return weights, src / name
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (src / name).is_file():
            return read_weights(src / name), src / name
    raise ConversionError(f"{src}: no model.safetensors, pytorch_model.bin or sharded index found")


def read_source_config(src):
    """(architecture, family, head, config dict with the transformers class defaults filled in); for a vision tower
    (`TOWERS`), (architecture, None, None, config.json as it is)."""
    path = Path(src) / "config.json"
    if not path.is_file():
        raise ConversionError(f"{src}: no config.json; expected a folder written by transformers' save_pretrained")
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ConversionError(f"{path}: expected a JSON object of config fields, got a JSON {type(raw).__name__}")
    architectures = raw.get("architectures") or []
    architecture = architectures[0] if architectures else None
    if architecture in TOWERS:
        return architecture, None, None, raw
    if architecture not in ARCHITECTURES:
        raise ConversionError(
            f"{path}: architectures={architectures!r} (model_type={raw.get('model_type')!r}) is not a transformers "
            f"class this converter reads; expected one of {sorted({*ARCHITECTURES, *TOWERS})}"
        )
    family, head = ARCHITECTURES[architecture]
    import transformers

    from ..limits import check_config_sizes

    defaults = getattr(transformers, CONFIG_CLASSES[family])().to_dict()
    check_config_sizes({**defaults, **raw}, str(path))
    return architecture, family, head, {**defaults, **raw}


def hubvit_settings(family, head, cfg):
    """HubViTConfig fields for a transformers config dict; refuses what hubvit cannot run."""
    if cfg.get("use_swiglu_ffn"):
        raise ConversionError(
            "use_swiglu_ffn=True (DINOv2 giant): hubvit's MLP is fc1 -> activation -> fc2 and has no SwiGLU; "
            "this checkpoint cannot be converted"
        )
    if cfg["hidden_act"] not in HIDDEN_ACTS:
        raise ConversionError(
            f"hidden_act={cfg['hidden_act']!r} is not supported by hubvit; expected one of {list(HIDDEN_ACTS)}"
        )
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    if cfg.get("head_dim") is not None and cfg["head_dim"] * heads != hidden:
        raise ConversionError(f"head_dim={cfg['head_dim']} x {heads} heads != hidden_size={hidden}; hubvit needs equal")
    if family in ("vit", "vit_msn", "vit_mae", "deit"):
        intermediate = cfg["intermediate_size"]
    else:
        intermediate = int(hidden * cfg["mlp_ratio"])
    settings = dict(
        image_size=cfg["image_size"],
        patch_size=cfg["patch_size"],
        num_channels=cfg["num_channels"],
        hidden_size=hidden,
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        intermediate_size=intermediate,
        hidden_act=cfg["hidden_act"],
        layer_norm_eps=cfg["layer_norm_eps"],
        qkv_bias=cfg["qkv_bias"],
        hidden_dropout_prob=cfg["hidden_dropout_prob"],
        attention_probs_dropout_prob=cfg["attention_probs_dropout_prob"],
        drop_path_rate=cfg.get("drop_path_rate", 0.0),
        initializer_range=cfg["initializer_range"],
        interpolation_mode="bicubic",
        interpolation_antialias=ANTIALIAS[family],
        interpolation_align_corners=False,
        pooling="cls",
    )
    if family == "deit":
        settings["distillation_token"] = True
        settings["distillation_head"] = head != "cls_only"
    if head == "cls_and_mean":
        settings["pooling"] = "cls_mean"
    if family.startswith("dinov2"):
        settings["layer_scale_init_value"] = cfg["layerscale_value"]
    if family == "dinov2_with_registers":
        settings["num_register_tokens"] = cfg["num_register_tokens"]
        settings["position_embedding_includes_prefix"] = False
    return settings


def label_names(cfg, num_labels):
    """(id2label, where the names came from): config.json's id2label, which must name every class of the head."""
    if not num_labels:
        return {}, "headless"
    id2label = {int(k): str(v) for k, v in (cfg.get("id2label") or {}).items()}
    if sorted(id2label) != list(range(num_labels)):
        raise ConversionError(f"config.json id2label has {len(id2label)} entries for a head of {num_labels} classes")
    return id2label, "config.json id2label"


def preprocessing(src, family):
    """SRC's own image processor (its preprocessor_config.json, e.g. DINOv2's resize and centre crop), else the
    family's default normalisation with a plain resize."""
    path = Path(src) / "preprocessor_config.json"
    mean, std, resample = DEFAULT_PREPROCESSING[family]
    if not path.is_file():
        note = f"No preprocessor_config.json in SRC: {family} defaults (mean {mean}, std {std}, {resample})"
        return Preprocessing(mean, std, resample, notes=[note])
    return preprocessing_of(src, mean, std, resample)


def preprocessing_of(src, mean, std, resample):
    """SRC's own image processor, its mean, std and resample read from preprocessor_config.json (the given ones
    where it has none)."""
    path = Path(src) / "preprocessor_config.json"
    raw = read_json(path)
    resample = resample_name(raw.get("resample", resample), f"{path}: resample")
    return Preprocessing(
        tuple(raw.get("image_mean", mean)), tuple(raw.get("image_std", std)), resample, processor=from_transformers(src)
    )


# ---------------------------------------------------------------------------------------------------------- mapping


def body_prefix(weights):
    """The key prefix before `embeddings.cls_token` ('' for base models, 'vit.' / 'deit.' / 'dinov2.' for heads)."""
    prefixes = {key[: -len("embeddings.cls_token")] for key in weights if key.endswith("embeddings.cls_token")}
    if len(prefixes) != 1:
        raise ConversionError(f"expected one `embeddings.cls_token` in the weights, found prefixes {sorted(prefixes)}")
    return prefixes.pop()


def spelling(mapping, candidates):
    """The first candidate key present in the source, else the first (reported as missing by the mapper)."""
    return next((key for key in candidates if mapping.has(key)), candidates[0])


def map_weights(weights, head, config, drop_head, description):
    """The strict mapper holding the folder's tensors translated to hubvit names (call `finish` for the state dict)."""
    mapping = StrictMapping(weights, description)
    p = body_prefix(weights)
    mapping.drop(rf"{re.escape(p)}pooler\.dense\.(weight|bias)", POOLER_REASON)
    mapping.drop(rf"{re.escape(p)}embeddings\.mask_token", "masked-image-modelling token of pre-training, unused here")
    mapping.drop(r"decoder\..+", "MAE's pixel decoder of pre-training, not part of the encoder")
    if drop_head:
        mapping.drop(r"(cls_|distillation_)?classifier\.(weight|bias)", "classification head (--drop-head)")

    embeddings = f"{p}embeddings."
    for part in ("weight", "bias"):
        mapping.map(f"embeddings.patch_embedding.{part}", f"{embeddings}patch_embeddings.projection.{part}")
    position, cls = f"{embeddings}position_embeddings", f"{embeddings}cls_token"
    if config.position_embedding_includes_prefix:
        mapping.map("embeddings.class_token", cls)
        mapping.map("embeddings.position_embedding", position)
    else:
        # DINOv2 with registers adds the table (cls row + patches) before inserting the registers; the cls row is
        # never resized, so folding it into the class token is exact at every resolution.
        mapping.combine("embeddings.class_token", [cls, position], lambda token, table: token + table[:, :1])
        mapping.map("embeddings.position_embedding", position, lambda table: table[:, 1:])
    if config.distillation_token:
        mapping.map("embeddings.distillation_token", f"{embeddings}distillation_token")
    if config.num_register_tokens:
        mapping.map("embeddings.register_tokens", f"{embeddings}register_tokens")

    for i in range(config.num_hidden_layers):
        roots = (f"{p}encoder.layer.{i}.", f"{p}layers.{i}.", f"encoder.layer.{i}.")  # last: ViTMSN's block 0 (5.25)
        target = f"encoder.layers.{i}."

        def source(name, part):
            return spelling(mapping, [f"{root}{leaf}.{part}" for leaf in LAYER_NAMES[name] for root in roots])

        for part in ("weight", "bias") if config.qkv_bias else ("weight",):
            qkv = [source(name, part) for name in ("q", "k", "v")]
            mapping.combine(f"{target}attention.qkv.{part}", qkv, lambda *t: torch.cat(t, dim=0))
        for name in ("norm1", "attention.proj", "norm2", "mlp.fc1", "mlp.fc2"):
            for part in ("weight", "bias"):
                mapping.map(f"{target}{name}.{part}", source(name, part))
        if config.layer_scale_init_value is not None:
            for n in (1, 2):
                key = spelling(mapping, [f"{root}layer_scale{n}.lambda1" for root in roots])
                mapping.map(f"{target}layer_scale{n}", key)
    for part in ("weight", "bias"):
        mapping.map(f"norm.{part}", f"{p}layernorm.{part}")
        if head == "classifier":
            mapping.map(f"classifier.{part}", f"classifier.{part}")
        elif head == "teacher":
            mapping.map(f"classifier.{part}", f"cls_classifier.{part}")
            mapping.map(f"distillation_classifier.{part}", f"distillation_classifier.{part}")
    if head in ("cls_only", "cls_and_mean"):
        for part in ("weight", "bias"):
            mapping.map(f"classifier.{part}", f"classifier.{part}")
    return mapping


# ---------------------------------------------------------------------------------------------------------- verify


def off_native_size(config):
    (h, w), (ph, pw) = config.image_size_2d, config.patch_size_2d
    return h + 2 * ph, w + 2 * pw


def reference(args, src, architecture, family, head, config):
    """transformers' own class loaded from SRC, at the native size and one size above it (its position-table
    resizing, `interpolate_pos_encoding`, included)."""
    import transformers

    if not args.verify:
        return Reference.unavailable("skipped (--no-verify)")
    unmasked = {"mask_ratio": 0.0} if family == "vit_mae" else {}  # MAE's encoder sees every patch, in order
    model, info = getattr(transformers, architecture).from_pretrained(str(src), output_loading_info=True, **unmasked)
    missing = [k for k in info["missing_keys"] if "pooler" not in k]
    if missing:
        raise ConversionError(f"transformers itself cannot load SRC completely (missing {missing}); nothing written")
    model = model.float().eval()
    kwargs = {} if architecture.startswith("Dinov2") else {"interpolate_pos_encoding": True}
    averaged = config.distillation_token and config.distillation_head

    def forward(pixels):
        if unmasked:  # noise that sorts to the identity: no patch shuffled
            (ph, pw), (h, w) = config.patch_size_2d, pixels.shape[-2:]
            kwargs["noise"] = torch.arange((h // ph) * (w // pw), dtype=torch.float32).expand(pixels.shape[0], -1)
        outputs = model(pixel_values=pixels, **kwargs)
        if head:
            return {"logits": outputs.logits}
        tokens = outputs.last_hidden_state
        pooled = (tokens[:, 0] + tokens[:, 1]) / 2 if averaged else tokens[:, 0]
        return {"last_hidden_state": tokens, "pooler_output": pooled}

    return Reference(
        f"transformers {transformers.__version__} `{architecture}` loaded from the source folder (position tables "
        f"resized as it does for {family}: bicubic, align_corners=False, antialias={ANTIALIAS[family]})",
        forward,
        sizes=(None, off_native_size(config)),
        tolerance=args.tolerance,
    )


# ---------------------------------------------------------------------------------------------------------- convert


def tower_reference(args, src, tower, architecture, config):
    """The tower's own transformers class loaded from SRC: `last_hidden_state` and `pooler_output` at the native
    size, and where the class runs at other sizes (`tower.resize_kwargs`), at one two patches larger."""
    import transformers

    if not args.verify:
        return Reference.unavailable("skipped (--no-verify)")
    model = tower.reference(src)
    run, native = tower.run_on_images(model), tuple(config.image_size_2d)

    def forward(pixels):
        kwargs = tower.resize_kwargs if tuple(pixels.shape[-2:]) != native else {}
        outputs = run(pixel_values=pixels, **kwargs)
        pooler_output = getattr(outputs, "pooler_output", None)  # GIT's and Idefics3's towers have none
        pooled = {} if pooler_output is None else {"pooler_output": pooler_output}
        return {"last_hidden_state": outputs.last_hidden_state, **pooled}

    return Reference(
        f"transformers {transformers.__version__} `{type(model).__name__}` loaded from the source folder",
        forward,
        sizes=(None,) if tower.resize_kwargs is None else (None, off_native_size(config)),
        tolerance=args.tolerance,
    )


def convert_tower(args, source, architecture, raw):
    """The `Conversion` of a vision tower folder (`transformers_towers.TOWERS`: DINOv3, SigLIP, CLIP, AIMv2, I-JEPA,
    BEiT, Data2Vec-vision; a dual encoder's vision tower)."""
    import transformers

    from ..limits import check_config_sizes

    tower, src = TOWERS[architecture], source.path
    cfg = vision_config(tower, raw)
    check_config_sizes(cfg, str(Path(src) / "config.json"))
    if args.drop_head:
        raise ConversionError(f"{architecture} has no classification head; --drop-head applies to classifiers")
    weights, weights_path = read_folder_weights(src)
    p = prefix_of(tower, weights)
    settings = tower.settings(cfg, {key[len(p) :] for key in weights if key.startswith(p)})
    try:
        config = HubViTConfig(**settings, num_labels=0)
    except ValueError as error:  # sizes that build no model, filled in with the class defaults where unset
        fields = f"{tower.nested} of " if tower.nested else ""
        raise ConversionError(
            f"{Path(src) / 'config.json'}: the {fields}{architecture} it describes (unset fields at "
            f"{tower.config_class}'s defaults) is no ViT hubvit can build: {error}"
        ) from None
    mapping = map_tower(tower, weights, config, cfg, f"transformers {architecture} folder ({weights_path})")
    mean, std, resample = tower.preprocessing
    if (Path(src) / "preprocessor_config.json").is_file():
        preprocessed = preprocessing_of(src, mean, std, resample)
    else:
        note = f"No preprocessor_config.json in SRC: {tower.family} defaults (mean {mean}, std {std}, {resample})"
        processor = tower.processor(cfg) if tower.processor is not None else None
        preprocessed = Preprocessing(mean, std, resample, processor=processor, notes=[note])
    name = Path(str(args.src)).name
    return Conversion(
        weights=mapping.finish(expected_shapes(config)),
        config=settings,
        preprocessing=preprocessed,
        labels={},
        reference=tower_reference(args, src, tower, architecture, config),
        provenance=f"Converted from a transformers {transformers.__version__} `{architecture}` folder"
        + (f" (its vision tower, `{p.rstrip('.')}`)." if p else "."),
        command=shlex.join(["hubvit", "convert", "transformers", str(args.src), str(args.out)]),
        family=tower.family,
        dropped=mapping.report(),
        citation_key=tower.citation_key,
        title=f"hubvit {name}" + ("" if name == architecture else f" ({architecture})"),
        source=source.record(),
    )


def convert(args):
    """The `Conversion` of a folder saved by transformers; `args` is an `Options`."""
    import transformers

    source = sources.resolve(args.src, revision=args.revision)
    src = source.path
    architecture, family, head, cfg = read_source_config(src)
    if architecture in TOWERS:
        return convert_tower(args, source, architecture, cfg)
    if args.drop_head:
        head = None
    settings = hubvit_settings(family, head, cfg)
    weights, weights_path = read_folder_weights(src)
    num_labels = 0
    if head in ("classifier", "cls_only", "cls_and_mean", "teacher"):
        key = "cls_classifier.weight" if head == "teacher" else "classifier.weight"
        num_labels = int(weights[key].shape[0]) if key in weights else 0
        if not num_labels:
            head = None  # saved with num_labels=0: an identity head
    labels, label_source = label_names(cfg, num_labels)
    config = HubViTConfig(**settings, num_labels=num_labels)
    mapping = map_weights(weights, head, config, args.drop_head, f"transformers {architecture} folder ({weights_path})")
    command = ["hubvit", "convert", "transformers", str(args.src), str(args.out)]
    name = Path(str(args.src)).name  # a Hub snapshot folder is named by its commit
    return Conversion(
        weights=mapping.finish(expected_shapes(config)),
        config=settings,
        preprocessing=preprocessing(src, family),
        labels=labels,
        reference=reference(args, src, architecture if head else BASE_MODELS[family], family, head, config),
        provenance=f"Converted from a transformers {transformers.__version__} `{architecture}` folder. Labels: "
        f"{label_source}.",
        command=shlex.join(command + (["--drop-head"] if args.drop_head else [])),
        family=family.replace("_", "-"),
        dropped=mapping.report(),
        citation_key=CITATION_KEYS.get(family),
        title=f"hubvit {name}" + ("" if name == architecture else f" ({architecture})"),
        source=source.record(),
    )
