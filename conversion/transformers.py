"""`hubvit convert transformers` and `hubvit export transformers`: interop with transformers' own ViT family.

Convert: a folder saved by transformers' ViT, DeiT, DINOv2 or DINOv2-with-registers becomes a hubvit folder. Both
key spellings are read: the legacy names `save_pretrained` still writes on disk (`encoder.layer.{i}.attention.
attention.query`, `layernorm_before`, `intermediate.dense`, ...) and the v5 in-memory names (`layers.{i}.attention.
q_proj`, `mlp.fc1`, ...). The result is checked against transformers' own forward before anything is written.

Export: a hubvit folder that transformers' built-in ViT can express becomes a `ViTForImageClassification` (or
`ViTModel` when headless) folder written by transformers' own `save_pretrained`; anything else is refused with the
list of offending settings.
"""

import json
import re
import shlex
from pathlib import Path

import torch

from ..modeling import HubViTConfig, HubViTForImageClassification
from ..modeling.configuration_hubvit import HIDDEN_ACTS
from .card import CardInfo
from . import sources
from .common import ConversionError, StrictMapping, read_weights
from .folder import build_model, expected_shapes, make_image_processor, staged_folder, write_folder
from .preprocessing import from_transformers

TOLERANCE = 1e-5

# architecture -> (family, head); the family names transformers' config class and interpolation.
ARCHITECTURES = {
    "ViTModel": ("vit", None),
    "ViTForImageClassification": ("vit", "classifier"),
    "DeiTModel": ("deit", None),
    "DeiTForImageClassification": ("deit", "cls_only"),
    "DeiTForImageClassificationWithTeacher": ("deit", "teacher"),
    "Dinov2Model": ("dinov2", None),
    "Dinov2ForImageClassification": ("dinov2", "cls_and_mean"),
    "Dinov2WithRegistersModel": ("dinov2_with_registers", None),
    "Dinov2WithRegistersForImageClassification": ("dinov2_with_registers", "cls_and_mean"),
}
BASE_MODELS = {
    "vit": "ViTModel",
    "deit": "DeiTModel",
    "dinov2": "Dinov2Model",
    "dinov2_with_registers": "Dinov2WithRegistersModel",
}
CONFIG_CLASSES = {
    "vit": "ViTConfig",
    "deit": "DeiTConfig",
    "dinov2": "Dinov2Config",
    "dinov2_with_registers": "Dinov2WithRegistersConfig",
}
# How each family resizes its position table in `interpolate_pos_encoding` (transformers 5.24):
# all bicubic with align_corners=False; only DINOv2-with-registers antialiases.
ANTIALIAS = {"vit": False, "deit": False, "dinov2": False, "dinov2_with_registers": True}
# Image processing when SRC has no preprocessor_config.json: (mean, std, resample) of the family's processor.
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
DEFAULT_PREPROCESSING = {
    "vit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear"),
    "deit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bicubic"),
    "dinov2": (*IMAGENET, "bicubic"),
    "dinov2_with_registers": (*IMAGENET, "bicubic"),
}
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}
CITATIONS = {"deit": "deit", "dinov2": "dinov2", "dinov2_with_registers": "dinov2"}

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


def add_arguments(parser):
    parser.add_argument("src", metavar="SRC", help="folder written by transformers' save_pretrained, or a Hub repo id")
    parser.add_argument("out", metavar="OUT", help="hubvit folder to write")
    parser.add_argument(
        "--keep-pooler",
        action="store_true",
        help="refused: the ViT/DeiT pooler (dense + tanh) has no hubvit layer; without it the pooler is dropped",
    )
    parser.add_argument(
        "--drop-head",
        action="store_true",
        help="convert only the body of a classifier (a headless hubvit folder)",
    )
    parser.add_argument("--no-verify", dest="verify", action="store_false", help="skip the check against transformers")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="relative tolerance of the check (1e-5)")
    sources.add_arguments(parser)  # SRC may be a Hub repo id


def add_export_arguments(parser):
    parser.add_argument("src", metavar="SRC", help="hubvit folder (config.json + model.safetensors)")
    parser.add_argument("out", metavar="OUT", help="folder for transformers' ViTForImageClassification / ViTModel")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="relative tolerance of the check (1e-5)")


# ---------------------------------------------------------------------------------------------------------- reading


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ConversionError(f"{path}: not valid JSON ({error})") from None


def read_folder_weights(src):
    """All tensors of a folder: model.safetensors, its sharded index, or pytorch_model.bin (no pickled code run)."""
    src = Path(src)
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (src / name).is_file():
            shards = sorted(set(read_json(src / name).get("weight_map", {}).values()))
            weights = {}
            for shard in shards:
                weights.update(read_weights(src / shard))
            return weights, src / name
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (src / name).is_file():
            return read_weights(src / name), src / name
    raise ConversionError(f"{src}: no model.safetensors, pytorch_model.bin or sharded index found")


def read_source_config(src):
    """(architecture, family, head, config dict with the transformers class defaults filled in)."""
    path = Path(src) / "config.json"
    if not path.is_file():
        raise ConversionError(f"{src}: no config.json; expected a folder written by transformers' save_pretrained")
    raw = read_json(path)
    architectures = raw.get("architectures") or []
    architecture = architectures[0] if architectures else None
    if architecture not in ARCHITECTURES:
        raise ConversionError(
            f"{path}: architectures={architectures!r} (model_type={raw.get('model_type')!r}) is not a transformers "
            f"class this converter reads; expected one of {sorted(ARCHITECTURES)}"
        )
    family, head = ARCHITECTURES[architecture]
    import transformers

    defaults = getattr(transformers, CONFIG_CLASSES[family])().to_dict()
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
    if family in ("vit", "deit"):
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
    if not num_labels:
        return {}
    id2label = {int(k): str(v) for k, v in (cfg.get("id2label") or {}).items()}
    if sorted(id2label) != list(range(num_labels)):
        raise ConversionError(f"config.json id2label has {len(id2label)} entries for a head of {num_labels} classes")
    return id2label


def preprocessing(src, family, config):
    """(mean, std, resample, notes) from SRC/preprocessor_config.json, else the family's defaults."""
    path = Path(src) / "preprocessor_config.json"
    if not path.is_file():
        mean, std, resample = DEFAULT_PREPROCESSING[family]
        note = f"No preprocessor_config.json in SRC: {family} defaults (mean {mean}, std {std}, {resample})"
        return mean, std, resample, [note]
    raw = read_json(path)
    mean, std, resample = DEFAULT_PREPROCESSING[family]
    mean, std = raw.get("image_mean", mean), raw.get("image_std", std)
    value = raw.get("resample", resample)
    resample = RESAMPLE_NAMES.get(value, value) if isinstance(value, int) else str(value).lower()
    if resample not in RESAMPLE_NAMES.values():
        raise ConversionError(f"{path}: resample={value!r}; expected nearest, bilinear, bicubic or lanczos (0-3)")
    return mean, std, resample, [f"Image processor: SRC's own {raw.get('image_processor_type', '')}".rstrip()]


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
    """hubvit state dict (through the shared strict mapper) and the mapper itself."""
    mapping = StrictMapping(weights, description)
    p = body_prefix(weights)
    mapping.drop(rf"{re.escape(p)}pooler\.dense\.(weight|bias)", POOLER_REASON)
    mapping.drop(rf"{re.escape(p)}embeddings\.mask_token", "masked-image-modelling token of pre-training, unused here")
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
        roots = (f"{p}encoder.layer.{i}.", f"{p}layers.{i}.")
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
    return mapping.finish(expected_shapes(config)), mapping


# ---------------------------------------------------------------------------------------------------------- verify


def off_native_size(config):
    (h, w), (ph, pw) = config.image_size_2d, config.patch_size_2d
    return h + 2 * ph, w + 2 * pw


@torch.no_grad()
def compare(reference_model, model, architecture, head, size, tolerance):
    """Lines `max |Δ| (scale)` for transformers vs hubvit at `size`, and the names of outputs beyond tolerance."""
    pixels = torch.randn(2, model.config.num_channels, *size, generator=torch.Generator().manual_seed(0))
    kwargs = {} if architecture.startswith("Dinov2") else {"interpolate_pos_encoding": True}
    reference = reference_model(pixel_values=pixels, **kwargs)
    ours = model(pixel_values=pixels)
    if head in ("classifier", "cls_only", "cls_and_mean", "teacher"):
        pairs = {"logits": (reference.logits, ours.logits)}
    else:
        tokens = reference.last_hidden_state
        pooled = tokens[:, 0]
        if model.config.distillation_token and model.config.distillation_head:
            pooled = (tokens[:, 0] + tokens[:, 1]) / 2
        body = model.hubvit(pixel_values=pixels)
        pairs = {"last_hidden_state": (tokens, body.last_hidden_state), "pooler_output": (pooled, body.pooler_output)}
    lines, failed, worst = [], [], 0.0
    for name, (a, b) in pairs.items():
        diff, scale = (a - b).abs().max().item(), a.abs().max().item()
        worst = max(worst, diff)
        lines.append(f"max |Δ{name}| = {diff:.2e} (max |{name}| = {scale:.3g})")
        if not diff <= tolerance * scale:
            failed.append(f"{name} at {size[0]}x{size[1]}: max |difference| {diff:.3g} > {tolerance:g} x {scale:.3g}")
    return worst, lines, failed


def verify(src, architecture, head, model, tolerance):
    """Run transformers' own class on SRC and the converted model at the native size and one size above it."""
    import transformers

    reference, info = getattr(transformers, architecture).from_pretrained(str(src), output_loading_info=True)
    missing = [k for k in info["missing_keys"] if "pooler" not in k]
    if missing:
        raise ConversionError(f"transformers itself cannot load SRC completely (missing {missing}); nothing written")
    reference = reference.float().eval()
    sizes = [model.config.image_size_2d, off_native_size(model.config)]
    results = [compare(reference, model, architecture, head, size, tolerance) for size in sizes]
    failed = [f for _, _, fails in results for f in fails]
    if failed:
        raise ConversionError(
            f"the converted model does not reproduce transformers' {architecture}; nothing was written.\n"
            + "\n".join(f"    {f}" for f in failed)
        )
    text = "; ".join(f"{h}x{w}: " + ", ".join(lines) for (h, w), (_, lines, _) in zip(sizes, results))
    return max(worst for worst, _, _ in results), text


# ---------------------------------------------------------------------------------------------------------- convert


def main(args):
    if getattr(args, "keep_pooler", False):
        raise ConversionError(
            "--keep-pooler is not supported: transformers' ViT/DeiT pooler (dense + tanh on [CLS]) has no hubvit "
            "layer, and hubvit's pooler_output is the normed [CLS] token. Convert without --keep-pooler; the pooler "
            "weights are then dropped with a printed reason."
        )
    source = sources.resolve(args)
    src = source.path
    architecture, family, head, cfg = read_source_config(src)
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
    reference_architecture = architecture if head else BASE_MODELS[family]
    id2label = label_names(cfg, num_labels)
    config = HubViTConfig(
        **settings,
        num_labels=num_labels,
        id2label=id2label or None,
        label2id={v: k for k, v in id2label.items()} or None,
    )
    if not num_labels:
        config.id2label, config.label2id = {}, {}
    state_dict, mapping = map_weights(
        weights, head, config, args.drop_head, f"transformers {architecture} folder ({weights_path})"
    )
    model = build_model(config, state_dict)
    notes = []
    mean, std, resample, processor_notes = preprocessing(src, family, config)
    notes += processor_notes
    for line in mapping.report() + notes:
        print(line)

    import transformers

    verification, max_abs_diff = None, None
    if args.verify:
        max_abs_diff, text = verify(src, reference_architecture, head, model, args.tolerance)
        print(f"verify: {text}")
        verification = (
            f"transformers {transformers.__version__} `{reference_architecture}` loaded from the source folder and "
            "this model, same weights, one random float32 batch of 2 images (transformers with "
            f"interpolate_pos_encoding at the larger size): {text}. Tolerance {args.tolerance:g} relative to the "
            f"output scale. Position tables are resized as transformers does for {family}: bicubic, "
            f"align_corners=False, antialias={ANTIALIAS[family]}."
        )
    command = ["hubvit", "convert", "transformers", str(args.src), str(args.out)]
    card = CardInfo(
        source=source.record(),
        provenance=f"Converted from a transformers {transformers.__version__} `{architecture}` folder.\n\n"
        + " ".join(note if note.endswith(".") else f"{note}." for note in notes),
        command=shlex.join(command + (["--drop-head"] if args.drop_head else [])),
        family=family.replace("_", "-"),
        verification=verification,
        max_abs_diff=max_abs_diff,
        dropped=mapping.report()[1:],
        citation_key=CITATIONS.get(family),
        title=f"hubvit {Path(args.src).name}" + (f" ({architecture})" if Path(args.src).name != architecture else ""),
    )
    image_processor = from_transformers(src)  # SRC's own eval transform (hubvit.conversion.preprocessing)
    if image_processor is None:
        image_processor = make_image_processor(config, mean, std, resample)
    out = write_folder(model, args.out, image_processor, card, overwrite=getattr(args, "overwrite", False))
    print(f"wrote {out}")
    return out


# ---------------------------------------------------------------------------------------------------------- export

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
            config.position_embedding_type != "learned",
            f"position_embedding_type={config.position_embedding_type!r} (ViT has a learned 1D table)",
        ),
        (config.pooling != "cls", f"pooling={config.pooling!r} (ViT classifies the [CLS] token)"),
        (config.fc_norm, "fc_norm=True (ViT norms before pooling)"),
        (config.layer_scale_init_value is not None, "layer_scale_init_value set (ViT has no layer scale)"),
        (config.pre_norm, "pre_norm=True (ViT has no LayerNorm before the encoder)"),
        (config.representation_size is not None, f"representation_size={config.representation_size} (no pre-logits)"),
        (config.dynamic_img_pad, "dynamic_img_pad=True (ViT does not pad inputs)"),
        (config.hidden_act not in ACT2FN, f"hidden_act={config.hidden_act!r} (not in transformers' ACT2FN)"),
    ]
    return [text for bad, text in checks if bad]


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
    if not config.patch_bias:
        notes.append("patch_bias=False: ViT's patch convolution gets a zero bias (same outputs)")
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
        image_size=config.image_size,
        patch_size=config.patch_size,
        num_channels=config.num_channels,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
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
        mapping.map(f"{patch}bias", f"{ours}patch_embedding.weight", lambda w: w.new_zeros(w.shape[0]))
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


def export_main(args):
    from transformers import ViTImageProcessor

    src, out = Path(args.src), Path(args.out)
    raw = read_json(src / "config.json") if (src / "config.json").is_file() else {}
    if raw.get("model_type") != HubViTConfig.model_type:
        raise ConversionError(
            f"{src}: not a hubvit folder (config.json model_type={raw.get('model_type')!r}, expected 'hubvit')"
        )
    config = HubViTConfig.from_pretrained(str(src))
    problems = export_problems(config)
    if problems:
        raise ConversionError(
            "transformers' ViT cannot express this hubvit model; nothing was written. Offending settings:\n"
            + "\n".join(f"    {p}" for p in problems)
        )
    weights, weights_path = read_folder_weights(src)
    if not any(key.startswith("hubvit.") for key in weights):
        weights = {f"hubvit.{key}": value for key, value in weights.items()}
    model, mapping = build_vit(config, weights, f"hubvit folder ({weights_path})")
    notes = [line.replace("hubvit tensors", "ViT tensors") for line in mapping.report()] + export_notes(config)

    hubvit_model = build_model(config, weights)
    pixels = torch.randn(2, config.num_channels, *config.image_size_2d, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if config.num_labels:
            field, theirs, ours = "logits", model(pixel_values=pixels).logits, hubvit_model(pixel_values=pixels).logits
        else:
            field = "last_hidden_state"
            theirs = model(pixel_values=pixels).last_hidden_state
            ours = hubvit_model.hubvit(pixel_values=pixels).last_hidden_state
    diff, scale = (theirs - ours).abs().max().item(), ours.abs().max().item()
    notes.append(f"verify: max |Δ{field}| = {diff:.2e} (max |{field}| = {scale:.3g})")
    if not diff <= args.tolerance * scale:
        raise ConversionError(
            f"the exported ViT does not reproduce hubvit: max |Δ{field}| {diff:.3g} > {args.tolerance:g} x {scale:.3g}"
        )
    for line in notes:
        print(line)

    with staged_folder(out, getattr(args, "overwrite", False)) as staging:
        model.save_pretrained(staging)
        if (src / "preprocessor_config.json").is_file():
            ViTImageProcessor.from_pretrained(str(src)).save_pretrained(staging)
        else:
            make_image_processor(config).save_pretrained(staging)
    print(f"wrote {out} ({type(model).__name__})")
    return out


# ---------------------------------------------------------------------------------------------------------- measure


@torch.no_grad()
def measure_differences(image_size=224, patch_size=16, width=384, depth=12, heads=6, larger=384, seed=0):
    """Same timm-like weights (ViT-S/16, truncated normal 0.02, eps 1e-6, bicubic + antialias resizing) run by hubvit
    and by transformers' ViT: what transformers' default eps and its position-table resizing change."""
    config = HubViTConfig(
        image_size=image_size, patch_size=patch_size, hidden_size=width, num_hidden_layers=depth,
        num_attention_heads=heads, intermediate_size=4 * width, num_labels=1000,
    )
    model = HubViTForImageClassification(config).eval()
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" not in name:
            param.copy_(torch.randn(param.shape, generator=generator).mul_(0.02).clamp_(-0.04, 0.04))
    x = torch.randn(2, 3, image_size, image_size, generator=generator)
    big = torch.randn(2, 3, larger, larger, generator=generator)
    ours = model(pixel_values=x).logits
    vit, _ = build_vit(config, model.state_dict(), "measurement")
    results = {f"ViT eps=1e-6, {image_size}px": (vit(pixel_values=x).logits - ours).abs().max().item()}
    theirs = vit(pixel_values=big, interpolate_pos_encoding=True).logits
    for antialias in (True, False):
        config.interpolation_antialias = antialias
        difference = (model(pixel_values=big).logits - theirs).abs().max().item()
        results[f"ViT interpolate_pos_encoding vs hubvit antialias={antialias}, {larger}px"] = difference
    for module in vit.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = 1e-12
    results[f"ViT eps=1e-12 (its default), {image_size}px"] = (vit(pixel_values=x).logits - ours).abs().max().item()
    return ours.abs().max().item(), results


if __name__ == "__main__":
    scale, results = measure_differences()
    print(f"same weights, max |logits| = {scale:.3g}")
    for what, diff in results.items():
        print(f"{what}: max |Δlogits| = {diff:.2e}")
