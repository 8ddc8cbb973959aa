"""`hubvit convert timm`: a timm Vision Transformer checkpoint as a hubvit folder.

The timm architecture is built on the meta device and its modules are read for the true settings (no guessing from
names); every setting hubvit cannot express is refused. Tensors go through the shared `StrictMapping`, and the
result is checked against timm's own forward on the same weights before anything is written.
"""

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from ..modeling import HubViTConfig
from ..card import CITATIONS
from . import sources, timm_beit, timm_eva, timm_naflex, timm_relpos, timm_sam
from ..errors import HubViTError
from ..options import argument, option, settle, text
from .common import (
    ConversionError,
    Conversion,
    ConversionOptions,
    ConversionResult,
    Reference,
    StrictMapping,
    listing,
    read_weights,
)
from ..folder import expected_shapes
from .folder import run_conversion
from .sources import REVISION_HELP
from .preprocessing import timm_preprocessing
from .timm_layers import (
    COMMON_RENAMES,
    GATED_MLP_KEYS,
    block_settings,
    common_settings,
    head_settings,
    norm_settings,
    pack_gated_mlps,
    patch_problems,
)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

RENAMES = COMMON_RENAMES + [
    (r"dist_token", "embeddings.distillation_token"),
    (r"blocks\.(\d+)\.ls([12])\.gamma", r"encoder.layers.\1.layer_scale\2"),
    (r"head_dist\.(weight|bias)", r"distillation_classifier.\1"),
]

DROPS = [
    (r"(optimizer|optim|lr_scheduler|scheduler|scaler|amp_scaler)(\..*)?", "training state (optimizer, schedule, AMP)"),
    (r"(epoch|step|global_step|version|metric|arch|args)", "training metadata, not weights"),
    (r"(state_dict_ema|model_ema)(\..*)?", "EMA copy stored beside the weights; the main weights are converted"),
    (r"mask_token", "masked-image-modelling token of DINOv2/iBOT pre-training, unused at inference"),
]


@dataclass(frozen=True)
class Options(ConversionOptions):
    """Convert the timm checkpoint SRC (a folder written by `timm.models.save_for_hf`, a weights file with
    `architecture`, or a Hub repo id at `revision`) into a hubvit folder at OUT, after checking the converted model
    against timm's own forward on the same weights (`verify`, within `tolerance` of the output scale)."""

    src: str = argument("SRC", "timm Hub-layout folder (config.json + weights), a weights file, or a Hub repo id")
    architecture: str | None = option(None, "timm model name, needed for a single weights file")
    model_args: dict | str | None = option(
        None, "timm model kwargs on top of the folder's own: a dict, or its JSON text, e.g. '{\"img_size\": 384}'"
    )
    revision: str | None = option(None, REVISION_HELP)

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.model_args, (dict, str, type(None))):
            raise HubViTError(f"model_args={self.model_args!r}; expected a dict of timm kwargs or its JSON text")
        settle(
            self,
            architecture=text(self.architecture, "architecture"),
            model_args=json.dumps(self.model_args) if isinstance(self.model_args, dict) else self.model_args,
            revision=text(self.revision, "revision"),
        )


def run(options: Options) -> ConversionResult:
    return run_conversion(convert, options)


def import_timm():
    try:
        import timm
    except ImportError:
        raise ConversionError("converting timm checkpoints needs timm: pip install 'hubvit[timm]'") from None
    return timm


def read_source(src, architecture, model_args):
    """(architecture, model_args, hub config or None, weights path) of a folder or a single file."""
    src = Path(src)
    if src.is_dir():
        config_path = src / "config.json"
        if not config_path.is_file():
            raise ConversionError(f"{src}: a timm folder needs config.json (written by timm.models.save_for_hf)")
        try:
            hub_config = json.loads(config_path.read_text())
        except (ValueError, UnicodeDecodeError) as error:
            raise ConversionError(f"{config_path}: not valid JSON ({error})") from None
        if not isinstance(hub_config, dict) or "architecture" not in hub_config:
            raise ConversionError(f"{config_path}: no 'architecture' field; is this a timm checkpoint folder?")
        if architecture and architecture != hub_config["architecture"]:
            raise ConversionError(
                f"--architecture {architecture} disagrees with {config_path}: "
                f"architecture={hub_config['architecture']!r}"
            )
        weights = next((src / name for name in WEIGHT_FILES if (src / name).is_file()), None)
        if weights is None:
            raise ConversionError(f"{src}: no weights file; expected one of {list(WEIGHT_FILES)}")
        if not isinstance(hub_config.get("model_args") or {}, dict):
            raise ConversionError(
                f"{config_path}: model_args={hub_config['model_args']!r}; expected a JSON object of timm kwargs"
            )
        args = dict(hub_config.get("model_args") or {})
        args.setdefault("num_classes", hub_config.get("num_classes", args.get("num_classes")))
        return hub_config["architecture"], {**args, **model_args}, hub_config, weights
    if not src.exists():
        raise ConversionError(f"{src}: no such file or folder")
    if not architecture:
        raise ConversionError(f"{src} is a single weights file: say which timm model it is with --architecture NAME")
    return architecture, dict(model_args), None, src


def pair(value):
    """timm's sizes as [height, width]: most patch embeddings keep a pair, some an int (XCiT's `ConvPatchEmbed`)."""
    return [value, value] if isinstance(value, int) else list(value)


def check_timm_sizes(meta_model, architecture):
    """The size budget of `hubvit.limits` for the timm model about to be built on the CPU (as the reference)."""
    from ..limits import check_config_sizes

    embed = getattr(meta_model, "patch_embed", None)
    sizes = {
        "hidden_size": getattr(meta_model, "embed_dim", None),
        "num_hidden_layers": len(getattr(meta_model, "blocks", [])) or None,
        "image_size": pair(getattr(embed, "img_size", None) or 224),
        "patch_size": pair(getattr(embed, "patch_size", None) or 16),
    }
    check_config_sizes({k: v for k, v in sizes.items() if v is not None}, f"{architecture} model_args")


def parse_model_args(text):
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConversionError(f"--model-args is not valid JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise ConversionError(f"--model-args must be a JSON object of timm kwargs, got {text!r}")
    return value


def create_timm_model(architecture, model_args, device="meta", **extra):
    timm = import_timm()
    if not timm.is_model(architecture.split(".")[0]):
        raise ConversionError(f"timm {timm.__version__} has no model named {architecture!r}")
    try:
        with torch.device(device):
            return timm.create_model(architecture, pretrained=False, **{**model_args, **extra}).eval()
    except (TypeError, AssertionError, ValueError, RuntimeError) as error:
        raise ConversionError(f"timm could not build {architecture} with model_args {model_args}: {error}") from None


def reader_of(model):
    """The module reading the timm class that built `model` (its settings, names and combined tensors): timm_eva.py
    for `Eva` (EVA-02, DINOv3, PE, the RoPE ViTs), timm_beit.py for `Beit`, timm_relpos.py for
    `VisionTransformerRelPos`, timm_naflex.py for `NaFlexVit`, timm_sam.py for `VisionTransformerSAM`; None for
    `VisionTransformer`, read here."""
    from timm.models.beit import Beit
    from timm.models.eva import Eva
    from timm.models.naflexvit import NaFlexVit
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    readers = {
        Eva: timm_eva,
        Beit: timm_beit,
        VisionTransformerRelPos: timm_relpos,
        NaFlexVit: timm_naflex,
        VisionTransformerSAM: timm_sam,
    }
    return readers.get(type(model))


def read_settings(model, architecture):
    """(HubViTConfig kwargs, []) describing `model`, a timm ViT on the meta device, or (None, what hubvit lacks)."""
    from timm.layers import LayerScale
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    if reader_of(model) is not None:
        return reader_of(model).read_settings(model, architecture)
    if type(model) not in (VisionTransformer, VisionTransformerDistilled):
        raise ConversionError(
            f"{architecture} builds timm's {type(model).__name__}; hubvit converts VisionTransformer, "
            "VisionTransformerDistilled (ViT, DeiT, DINO, DINOv2, CLIP, SigLIP), Eva (EVA-02, DINOv3, PE, RoPE ViTs), "
            "Beit (BEiT, BEiT v2), VisionTransformerRelPos (relpos ViTs), NaFlexVit (NaFlex, SigLIP 2, C-RADIO) and "
            "VisionTransformerSAM (Segment Anything)"
        )
    problems = []
    blocks = list(model.blocks)
    first = blocks[0]
    patch = model.patch_embed
    problems += patch_problems(patch)
    eps, norm_type = norm_settings(model, problems)
    block = block_settings(blocks, problems)
    head = head_settings(model, block, problems)
    distilled = getattr(model, "dist_token", None) is not None
    if distilled and model.num_reg_tokens:
        problems.append("register tokens in a distilled model (timm ignores them there)")
    if problems:
        return None, list(dict.fromkeys(re.sub(r"blocks\.\d+", "blocks.*", p) for p in problems))
    height, width = (int(v) for v in patch.img_size)
    ph, pw = (int(v) for v in patch.patch_size)
    settings = dict(
        **common_settings(model, blocks, eps, norm_type),
        layer_scale_init_value=float(first.ls1.init_values)
        if isinstance(getattr(first, "ls1", None), LayerScale)
        else None,
        class_token=model.cls_token is not None,
        num_register_tokens=model.num_reg_tokens,
        distillation_token=distilled,
        position_embedding_type="learned" if model.pos_embed is not None else "none",
        position_embedding_includes_prefix=not model.no_embed_class,
        **{k: v for k, v in block.items() if k != "layer_scale"},
        **head,
    )
    return settings, []


def open_clip_image_tower(weights, architecture, model_args):
    """(timm's tensors, lines naming what was left out) for an open_clip state dict, else (`weights`, []).

    A timm trunk (`visual.trunk.*`) is that timm model's own tensors; its projection into the joint embedding space
    (`visual.head.*`) and the text tower are left out. OpenAI CLIP's own tower (`visual.class_embedding`, ...) goes
    through timm's checkpoint filter, which keeps the projection as the head, as timm's `*_clip_*` models do."""
    trunk = "visual.trunk."
    if any(key.startswith(trunk) for key in weights):
        kept = {key.removeprefix(trunk): value for key, value in weights.items() if key.startswith(trunk)}
        left = sorted(key for key in weights if not key.startswith(trunk))
    elif "visual.class_embedding" in weights:
        from timm.models.vision_transformer import checkpoint_filter_fn

        projection = weights.get("visual.proj")
        classes = int(projection.shape[1]) if isinstance(projection, torch.Tensor) else 0
        model = create_timm_model(architecture, {**model_args, "num_classes": classes})
        kept = checkpoint_filter_fn(dict(weights), model)
        left = sorted(key for key in weights if not key.startswith("visual."))
    else:
        return weights, []
    shown = ", ".join(left[:6]) + (" ..." if len(left) > 6 else "")
    return kept, [f"dropped {len(left)} open_clip tensors outside the image tower ({shown})"] if left else []


def clean_state_dict(weights):
    """Strip DistributedDataParallel's `module.` prefix when every key carries it."""
    if weights and all(isinstance(k, str) and k.startswith("module.") for k in weights):
        return {k.removeprefix("module."): v for k, v in weights.items()}
    return dict(weights)


def map_weights(weights, description, model=None):
    """The strict mapper holding a timm state dict translated to hubvit names (call `finish` for the state dict);
    `model` (the architecture on the meta device) picks the family's names."""
    mapping = StrictMapping(weights, description)
    for pattern, reason in DROPS:
        mapping.drop(pattern, reason)
    reader = reader_of(model) if model is not None else None
    if reader is not None:
        for pattern, reason in getattr(reader, "DROPS", []):
            mapping.drop(pattern, reason)
        mapping.rename(reader.RENAMES)
        reader.combine(mapping, model)
    else:
        mapping.rename(RENAMES)
        if model is not None:
            pack_gated_mlps(mapping, model)
    return mapping


def label_names(hub_config, num_classes):
    """(id2label, where the names came from): the checkpoint's own labels, else timm's ImageNet names for
    ImageNet-sized heads, else LABEL_i."""
    if not num_classes:
        return {}, "headless (num_classes=0)"
    hub_config = hub_config or {}
    names = hub_config.get("label_names")
    if names:
        if isinstance(names, dict):
            names = {int(k): v for k, v in names.items()}
        else:
            names = dict(enumerate(names))
        if sorted(names) != list(range(num_classes)):
            raise ConversionError(f"label_names has {len(names)} entries for a head of {num_classes} classes")
        descriptions = hub_config.get("label_descriptions") or {}
        return {i: str(descriptions.get(n, n)) for i, n in names.items()}, "the checkpoint's label_names"
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset({"num_classes": num_classes})
    if subset:
        info = ImageNetInfo(subset)
        return {i: info.index_to_description(i) for i in range(num_classes)}, f"timm's {subset} class names"
    return {i: f"LABEL_{i}" for i in range(num_classes)}, "no names in the checkpoint (LABEL_i)"


def pretrained_cfg(hub_config, model):
    """timm's pretrained_cfg of the model, updated by the folder's own."""
    cfg = dict(model.pretrained_cfg or {})
    if hub_config is not None:
        cfg.update(hub_config.get("pretrained_cfg") or {})
    return cfg


def preprocessing(cfg, hub_config, image_size):
    """The `Preprocessing` of timm's pretrained_cfg (mean, std, interpolation, crop_pct, crop_mode), at the folder's
    input size, or at the model's resolution for a bare weights file."""
    size = tuple(cfg.get("input_size", (3, *image_size)))[-2:] if hub_config is not None else tuple(image_size)
    return timm_preprocessing(cfg, size)


def family_of(architecture, tag):
    """The checkpoint family the card cites by its paper (`CITATIONS`), from the timm name and tag."""
    tag = tag or ""
    for family, names in (
        ("eva_clip", ("eva02_", "clip")),
        ("eva02", ("eva02",)),
        ("dinov3", ("dinov3",)),
        ("perception_encoder", ("_pe_",)),
        ("rope_vit", ("_rope_",)),
        ("beitv2", ("beitv2",)),
        ("beit3", ("beit3",)),
        ("beit", ("beit",)),
        ("aimv2", ("aimv2",)),
        ("sam", ("samvit",)),
    ):
        if all(name in architecture for name in names):
            return family
    for family in ("siglip", "clip", "dinov2", "deit3", "deit"):
        if family in architecture:
            return family
    if "dino" in tag:
        return "dino"
    return "augreg" if tag.startswith("augreg") else "vit"


def reference(args, architecture, model_args, weights, mapping, name):
    """timm's own model on the source weights: pooled features before the head, and logits when it has a head."""
    import timm

    if not args.verify:
        return Reference.unavailable("skipped (--no-verify)")
    timm_model = create_timm_model(architecture, model_args, device="cpu")
    timm_model.load_state_dict({k: v for k, v in weights.items() if k not in mapping.dropped}, strict=True)
    return timm_reference(timm_model, f"timm {timm.__version__} `{name}`", args.tolerance)


def timm_reference(timm_model, description, tolerance):
    """timm's own forward (pooled features, and logits where there is a head) as the `Reference` to verify against."""

    def forward(pixels):
        try:
            features = timm_model.forward_features(pixels)
        except AssertionError as error:  # timm's own input checks (`_assert`): the source cannot run this model
            raise ConversionError(
                f"{description} cannot run a {pixels.shape[-2]}x{pixels.shape[-1]} image to verify against: {error}; "
                "expected model_args (img_size, patch_size) timm itself can run"
            ) from None
        outputs = {"pooler_output": timm_model.forward_head(features, pre_logits=True)}
        if timm_model.num_classes:
            outputs["logits"] = timm_model.forward_head(features)
        return outputs

    return Reference(description, forward, tolerance=tolerance)


def refuse(architecture, problems, weights, model=None):
    """ConversionError listing the settings hubvit lacks and the source tensors no rule knows."""
    reader = reader_of(model) if model is not None else None
    if reader is not None:
        known = [p for p, _ in reader.RENAMES + DROPS + getattr(reader, "DROPS", [])] + reader.COMBINED
    else:
        known = [p for p, _ in RENAMES + DROPS] + GATED_MLP_KEYS
    unknown = sorted(k for k in weights if not any(re.fullmatch(p, k) for p in known))
    listed = "".join(f"\n    {p}" for p in problems)
    if unknown:
        listed += f"\n  source tensors hubvit has no place for ({len(unknown)}):\n{listing(unknown)}"
    return ConversionError(f"timm {architecture} uses settings hubvit cannot express; nothing was written.{listed}")


def convert(args):
    """The `Conversion` of a timm folder or weights file; `args` is an `Options`."""
    timm = import_timm()
    model_args = parse_model_args(args.model_args)
    source = sources.resolve(args.src, revision=args.revision)
    architecture, model_args, hub_config, weights_path = read_source(source.path, args.architecture, model_args)
    weights, foreign = open_clip_image_tower(clean_state_dict(read_weights(weights_path)), architecture, model_args)
    if hub_config is None and "num_classes" not in model_args:
        head = weights.get("head.weight")
        model_args["num_classes"] = int(head.shape[0]) if isinstance(head, torch.Tensor) else 0
    classes = model_args.get("num_classes")
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int) or classes < 0):
        raise ConversionError(f"num_classes={classes!r} (config.json or --model-args); expected an integer >= 0")
    meta_model = create_timm_model(architecture, model_args)
    settings, problems = read_settings(meta_model, architecture)  # the class and its parts first: the real reason
    if problems:
        raise refuse(architecture, problems, weights, meta_model)
    check_timm_sizes(meta_model, architecture)
    labels, label_source = label_names(hub_config, meta_model.num_classes)
    mapping = map_weights(weights, f"timm {architecture} checkpoint ({weights_path})", meta_model)
    config = HubViTConfig(**settings, num_labels=len(labels))
    state_dict = mapping.finish(expected_shapes(config))
    cfg = pretrained_cfg(hub_config, meta_model)
    tag = cfg.get("tag")
    name = f"{architecture}.{tag}" if tag else architecture
    family = family_of(architecture, tag)
    command = shlex.join(
        ["hubvit", "convert", "timm", str(args.src), str(args.out)]
        + (["--architecture", args.architecture] if args.architecture else [])
        + (["--model-args", args.model_args] if args.model_args else [])
    )
    evaluation = preprocessing(cfg, hub_config, config.image_size_2d)
    return Conversion(
        weights=state_dict,
        config=settings,
        preprocessing=evaluation,
        labels=labels,
        reference=reference(args, architecture, model_args, weights, mapping, name),
        provenance=f"Converted from the timm checkpoint `{name}` with timm {timm.__version__}.\n\n"
        f"timm model_args: `{json.dumps(model_args, sort_keys=True)}`. Labels: {label_source}. The image processor "
        f"is timm's eval transform (crop_pct={evaluation.crop_pct}, crop_mode={evaluation.crop_mode}, "
        f"{evaluation.resample}). At other resolutions "
        "the position table is resized as timm's `dynamic_img_size=True` does (bicubic, antialias, float32).",
        command=command,
        family=family,
        dropped=foreign + mapping.report(),
        license=cfg.get("license"),
        citation_key=family if family in CITATIONS else None,
        title=f"hubvit {name}",
        source=source.record(),
    )
