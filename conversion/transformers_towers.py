"""The vision towers of transformers beyond ViT, DeiT and DINOv2, read into hubvit settings and weights: DINOv3 ViT
(and its backbone), AIMv2 and I-JEPA here; CLIP and SigLIP in transformers_clip.py; BEiT and Data2Vec-vision in
transformers_beit.py.

A `Tower` is one transformers class as hubvit reads it: its vision config (a dual encoder's `vision_config`), the
hubvit settings that config means, the tensor names of its folder (as `save_pretrained` writes them, with or
without a dual encoder's `vision_model.` prefix), and the class whose forward is the reference. transformers.py
looks a folder's `architectures[0]` up in `TOWERS` and runs the same conversion for every tower.
"""

import re
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..errors import listing
from ..modeling.layers_hubvit import NORM_KINDS
from .common import ConversionError
from .mapping import StrictMapping

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
OPENAI_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
MASK_TOKEN = "masked-image-modelling token of pre-training, unused at inference"


@dataclass(frozen=True)
class Tower:
    """One transformers vision class as hubvit reads it.

    `config_class`: the transformers config class of the vision part; `nested`: the dual encoder's key holding it
    (`vision_config`), None for a vision model. `settings(cfg, keys)`: HubViTConfig fields from the vision config
    dict (class defaults filled in) and the folder's tensor names (after the prefix). `map_weights(mapping, config,
    p, cfg)`: fills the mapper from tensors under prefix `p`. `marker`: a tensor name that every folder of the class
    has, to find the prefix. `reference(src)`: the source's own vision model in float32, loaded from SRC;
    `resize_kwargs`: what its forward takes to run at another size (None: only its native size). `preprocessing`:
    (mean, std, resample) when SRC has no preprocessor_config.json. `runner(model)`: the class called on whole
    images, where its forward takes something else (SigLIP 2's patch sequences); `processor(cfg)`: the class's own
    transformers image processor, for a SRC without one, where the fixed-size one would not serve it."""

    family: str
    config_class: str
    settings: Callable
    map_weights: Callable
    marker: str
    reference: Callable
    preprocessing: tuple
    nested: str | None = None
    resize_kwargs: dict | None = field(default_factory=dict)
    citation_key: str | None = None
    prefixes: tuple = ("",)
    runner: Callable | None = None
    processor: Callable | None = None

    def run_on_images(self, model):
        """`model` as a callable on (B, C, H, W) `pixel_values` (`runner`: for a class that takes other inputs)."""
        return model if self.runner is None else self.runner(model)


def vision_config(tower, raw):
    """The vision config dict of a folder's config.json, with the transformers class defaults filled in."""
    import transformers

    if tower.nested and tower.nested not in raw:
        raise ConversionError(
            f"config.json has no {tower.nested}: a {tower.config_class.removesuffix('Config')} tower is described "
            f"there (as save_pretrained writes it); expected a {tower.nested} object of the tower's fields"
        )
    part = raw.get(tower.nested) if tower.nested else raw
    if not isinstance(part, dict):
        raise ConversionError(f"config.json {tower.nested} is {type(part).__name__}, expected an object of fields")
    defaults = getattr(transformers, tower.config_class)().to_dict()
    return {**defaults, **{k: v for k, v in part.items() if k not in ("architectures", "model_type")}}


def prefix_of(tower, weights):
    """The key prefix of the vision tower: the first of `tower.prefixes` under which `tower.marker` exists."""
    for prefix in tower.prefixes:
        if f"{prefix}{tower.marker}" in weights:
            return prefix
    raise ConversionError(
        f"no `{tower.marker}` under any of the prefixes {list(tower.prefixes)}: not a {tower.family} folder"
    )


def vit_sizes(cfg, eps="layer_norm_eps"):
    """The fields every tower's vision config gives under the same names: sizes, activation and norm eps."""
    names = ("image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers", "num_attention_heads")
    return dict(
        **{name: cfg[name] for name in names},
        intermediate_size=cfg["intermediate_size"],
        hidden_act=cfg["hidden_act"],
        layer_norm_eps=cfg[eps],
    )


def same(*flags, names):
    """One value for flags hubvit holds as one (e.g. the query and value biases); refused naming them otherwise."""
    if len(set(flags)) != 1:
        listed = ", ".join(f"{n}={f}" for n, f in zip(names, flags))
        raise ConversionError(f"{listed}: hubvit has one setting for these and cannot express different values")
    return flags[0]


def map_params(mapping, target, key, bias=True):
    """A layer's weight (and bias) under `key` as hubvit's `target`."""
    for part in ("weight", "bias") if bias else ("weight",):
        mapping.map(f"{target}.{part}", f"{key}.{part}")


def map_qkv(mapping, target, keys, config):
    """Separate q, k, v projections (`keys`: their prefixes) into hubvit's fused qkv: one weight, and one bias, or
    the query and value biases alone (no key bias)."""
    mapping.combine(f"{target}.qkv.weight", [f"{k}.weight" for k in keys], lambda *w: torch.cat(w))
    if not config.qkv_bias:
        return
    if config.key_bias:
        mapping.combine(f"{target}.qkv.bias", [f"{k}.bias" for k in keys], lambda *b: torch.cat(b))
    else:
        mapping.map(f"{target}.q_bias", f"{keys[0]}.bias")
        mapping.map(f"{target}.v_bias", f"{keys[2]}.bias")


def map_gated(mapping, target, gate, value, bias):
    """A gated MLP's gate and value projections as hubvit's packed fc1, gate first."""
    for part in ("weight", "bias") if bias else ("weight",):
        mapping.combine(f"{target}.{part}", [f"{gate}.{part}", f"{value}.{part}"], lambda g, v: torch.cat([g, v]))


def loader(class_name, part=None):
    """The reference: transformers' `class_name` loaded from SRC in float32 (a dual encoder's `part`)."""

    def load(src):
        import transformers

        model, info = getattr(transformers, class_name).from_pretrained(
            str(src), output_loading_info=True, ignore_mismatched_sizes=True
        )
        mismatched = [
            f"{key} saved {tuple(saved)}, config.json gives {tuple(shape)}"
            for key, saved, shape in info.get("mismatched_keys", ())
        ]
        if mismatched:
            raise ConversionError(
                f"{src}: config.json and the weights disagree, so transformers' {class_name} cannot load the folder "
                f"to verify against:\n{listing(mismatched)}"
            )
        model = model.float().eval()
        return getattr(model, part) if part else model

    return load


# ------------------------------------------------------------------------------------------------------ DINOv3 ViT


def dinov3_settings(cfg, keys):
    qkv_bias = same(cfg["query_bias"], cfg["value_bias"], names=("query_bias", "value_bias"))
    if cfg["key_bias"] and not qkv_bias:
        raise ConversionError("key_bias=True without query and value biases: hubvit has no key bias alone")
    return dict(
        **vit_sizes(cfg),
        qkv_bias=qkv_bias,
        key_bias=bool(cfg["key_bias"]),
        proj_bias=cfg["proj_bias"],
        mlp_bias=cfg["mlp_bias"],
        mlp_type="gated" if cfg["use_gated_mlp"] else "mlp",
        layer_scale_init_value=cfg["layerscale_value"],
        num_register_tokens=cfg["num_register_tokens"],
        position_embedding_type="none",
        rope_type="dinov3",
        rope_temperature=float(cfg["rope_theta"]),
        rope_rotate_half=True,
        rope_shift_coords=cfg.get("pos_embed_shift"),
        rope_jitter_coords=cfg.get("pos_embed_jitter"),
        rope_rescale_coords=cfg.get("pos_embed_rescale"),
        drop_path_rate=cfg.get("drop_path_rate", 0.0),
        pooling="cls",
    )


def dinov3_weights(mapping, config, p, cfg):
    e = f"{p}embeddings."
    mapping.drop(rf"{e}mask_token", MASK_TOKEN)
    mapping.map("embeddings.class_token", f"{e}cls_token")
    if config.num_register_tokens:
        mapping.map("embeddings.register_tokens", f"{e}register_tokens")
    else:
        mapping.drop(rf"{e}register_tokens", "no register tokens (an empty tensor)")
    map_params(mapping, "embeddings.patch_embedding", f"{e}patch_embeddings", True)
    for i in range(config.num_hidden_layers):
        source, target = f"{p}layer.{i}.", f"encoder.layers.{i}."
        map_params(mapping, f"{target}norm1", f"{source}norm1")
        map_params(mapping, f"{target}norm2", f"{source}norm2")
        projections = [f"{source}attention.{n}_proj" for n in "qkv"]
        map_qkv(mapping, f"{target}attention", projections, config)
        map_params(mapping, f"{target}attention.proj", f"{source}attention.o_proj", config.proj_bias)
        for n in (1, 2):
            mapping.map(f"{target}layer_scale{n}", f"{source}layer_scale{n}.lambda1")
        if config.mlp_kind.gated:
            map_gated(mapping, f"{target}mlp.fc1", f"{source}mlp.gate_proj", f"{source}mlp.up_proj", config.mlp_bias)
        else:
            map_params(mapping, f"{target}mlp.fc1", f"{source}mlp.up_proj", config.mlp_bias)
        map_params(mapping, f"{target}mlp.fc2", f"{source}mlp.down_proj", config.mlp_bias)
    map_params(mapping, "norm", f"{p}norm")


DINOV3 = Tower(
    family="dinov3",
    config_class="DINOv3ViTConfig",
    settings=dinov3_settings,
    map_weights=dinov3_weights,
    marker="embeddings.cls_token",
    reference=loader("DINOv3ViTModel"),
    preprocessing=(*IMAGENET, "bilinear"),
    citation_key="dinov3",
    prefixes=("", "model."),
)


# ---------------------------------------------------------------------------------------------------------- InternVL


def internvl_settings(cfg, keys):
    """InternVL's vision tower (InternViT): a pre-norm ViT with layer scale, [CLS] with its table row resized bicubic
    without antialias, no pooled output; its final norm only where it does not mean-pool. Its q/k norm spans all
    heads at once, which hubvit's per-head norm is not: refused."""
    if cfg["use_qk_norm"]:
        raise ConversionError("use_qk_norm=True (one RMSNorm over all heads' queries and keys): hubvit norms each head")
    if NORM_KINDS[cfg["norm_type"]].make is not nn.LayerNorm and not cfg["use_mean_pooling"]:
        raise ConversionError(
            "norm_type='rms_norm' with use_mean_pooling=False: InternVL's final norm is then a LayerNorm after RMSNorm "
            "blocks; hubvit's final norm is of the blocks' kind"
        )
    if not cfg["use_absolute_position_embeddings"]:
        raise ConversionError("use_absolute_position_embeddings=False: InternVL's tower then has no positions at all")
    return dict(
        **vit_sizes(cfg),
        norm_type=cfg["norm_type"],
        qkv_bias=cfg["attention_bias"],
        layer_scale_init_value=cfg["layer_scale_init_value"],
        final_norm=not cfg["use_mean_pooling"],
        interpolation_mode="bicubic",
        interpolation_antialias=False,
        interpolation_align_corners=False,
        pooling="none",
    )


def internvl_weights(mapping, config, p, cfg):
    e = f"{p}embeddings."
    mapping.drop(rf"{e}mask_token", MASK_TOKEN)
    mapping.map("embeddings.class_token", f"{e}cls_token")
    mapping.map("embeddings.position_embedding", f"{e}position_embeddings")
    map_params(mapping, "embeddings.patch_embedding", f"{e}patch_embeddings.projection")
    for i in range(config.num_hidden_layers):
        source, target = f"{p}encoder.layer.{i}.", f"encoder.layers.{i}."
        with_bias = config.norm_kind.parameters_per_channel == 2
        map_params(mapping, f"{target}norm1", f"{source}layernorm_before", with_bias)
        map_params(mapping, f"{target}norm2", f"{source}layernorm_after", with_bias)
        map_qkv(mapping, f"{target}attention", [f"{source}attention.{n}_proj" for n in "qkv"], config)
        map_params(mapping, f"{target}attention.proj", f"{source}attention.projection_layer")
        for n in (1, 2):
            mapping.map(f"{target}layer_scale{n}", f"{source}lambda_{n}")
        map_params(mapping, f"{target}mlp.fc1", f"{source}mlp.fc1")
        map_params(mapping, f"{target}mlp.fc2", f"{source}mlp.fc2")
    if config.final_norm:
        map_params(mapping, "norm", f"{p}layernorm")


INTERNVL = Tower(
    family="internvl",
    config_class="InternVLVisionConfig",
    settings=internvl_settings,
    map_weights=internvl_weights,
    marker="embeddings.cls_token",
    reference=loader("InternVLVisionModel"),
    preprocessing=(*IMAGENET, "bicubic"),
    resize_kwargs={},
)


# ------------------------------------------------------------------------------------------------------------ AIMv2


def aimv2_settings(cfg, keys):
    if cfg.get("is_native"):
        raise ConversionError(
            "is_native=True (AIMv2's native-resolution sin-cos table, frequencies 1/10000^(i/(D/4))): hubvit's "
            "sincos_2d divides by D/4 - 1; only the fixed-resolution AIMv2 converts"
        )
    return dict(
        **vit_sizes(cfg, "rms_norm_eps"),
        norm_type="rms_norm",
        qkv_bias=cfg["qkv_bias"],
        proj_bias=cfg["qkv_bias"],
        mlp_bias=cfg["mlp_bias"],
        mlp_type="gated",
        patch_norm=True,
        class_token=False,
        position_embedding_includes_prefix=False,
        pooling="map" if cfg["use_head"] else "none",
        map_intermediate_size=1 if cfg["use_head"] else None,
    )


def aimv2_weights(mapping, config, p, cfg):
    e = f"{p}embeddings."
    map_params(mapping, "embeddings.patch_embedding", f"{e}patch_embed", True)
    mapping.map("embeddings.patch_norm.weight", f"{e}rms_norm.weight")
    mapping.map("embeddings.position_embedding", f"{e}position_embedding.weight", lambda t: t[None])
    bias = config.qkv_bias
    for i in range(config.num_hidden_layers):
        source, target = f"{p}encoder.layers.{i}.", f"encoder.layers.{i}."
        mapping.map(f"{target}norm1.weight", f"{source}rms_norm1.weight")
        mapping.map(f"{target}norm2.weight", f"{source}rms_norm2.weight")
        map_qkv(mapping, f"{target}attention", [f"{source}attention.{n}_proj" for n in "qkv"], config)
        map_params(mapping, f"{target}attention.proj", f"{source}attention.out_proj", config.proj_bias)
        map_gated(mapping, f"{target}mlp.fc1", f"{source}ffn.gate_proj", f"{source}ffn.up_proj", config.mlp_bias)
        map_params(mapping, f"{target}mlp.fc2", f"{source}ffn.down_proj", config.mlp_bias)
    mapping.map("norm.weight", f"{p}rms_norm.weight")
    if not config.pooling_kind.attention_pool:
        return
    # AIMv2's head attends with its learned query as it is (no query projection, no norm, no MLP after): hubvit's
    # MAP head with an identity query projection and an MLP whose output is zero computes exactly that.
    h, dim = f"{p}head.", config.hidden_size
    mapping.map("pooler.map_head.probe", f"{h}cls_token")
    mapping.create("pooler.map_head.q.weight", torch.eye(dim), "AIMv2's head has no query projection: identity")
    mapping.create("pooler.map_head.q.bias", torch.zeros(dim), "AIMv2's head has no query projection: zero bias")
    mapping.combine(
        "pooler.map_head.kv.weight", [f"{h}k_proj.weight", f"{h}v_proj.weight"], lambda k, v: torch.cat([k, v])
    )
    if bias:
        mapping.combine(
            "pooler.map_head.kv.bias", [f"{h}k_proj.bias", f"{h}v_proj.bias"], lambda k, v: torch.cat([k, v])
        )
    else:
        mapping.create(
            "pooler.map_head.kv.bias", torch.zeros(2 * dim), "AIMv2's head projects keys and values without bias"
        )
    map_params(mapping, "pooler.map_head.proj", f"{h}output_proj", True)
    mapping.create("pooler.map_head.norm.weight", torch.ones(dim), "AIMv2's head has no MLP: its norm is unused")
    mapping.create("pooler.map_head.mlp.fc1.weight", torch.zeros(1, dim), "AIMv2's head has no MLP: zero")
    mapping.create("pooler.map_head.mlp.fc2.weight", torch.zeros(dim, 1), "AIMv2's head has no MLP: zero")
    if config.mlp_bias:
        mapping.create("pooler.map_head.mlp.fc1.bias", torch.zeros(1), "AIMv2's head has no MLP: zero")
        mapping.create("pooler.map_head.mlp.fc2.bias", torch.zeros(dim), "AIMv2's head has no MLP: zero")


AIMV2 = Tower(
    family="aimv2",
    config_class="Aimv2VisionConfig",
    settings=aimv2_settings,
    map_weights=aimv2_weights,
    marker="embeddings.patch_embed.weight",
    reference=loader("Aimv2VisionModel"),
    preprocessing=(*OPENAI_CLIP, "bicubic"),
    resize_kwargs=None,
    citation_key="aimv2",
    prefixes=("", "vision_model."),
)


# ----------------------------------------------------------------------------------------------------------- I-JEPA


def ijepa_settings(cfg, keys):
    return dict(
        **vit_sizes(cfg),
        qkv_bias=cfg["qkv_bias"],
        class_token=False,
        position_embedding_includes_prefix=False,
        interpolation_mode="bicubic",
        interpolation_antialias=False,
        interpolation_align_corners=False,
        pooling="none",
    )


VIT_LAYER = {  # hubvit name -> the on-disk name under encoder.layer.{i}. of transformers' ViT, I-JEPA and BEiT
    "norm1": "layernorm_before",
    "attention.proj": "attention.output.dense",
    "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}


def ijepa_weights(mapping, config, p, cfg):
    e = f"{p}embeddings."
    mapping.drop(rf"{e}mask_token", MASK_TOKEN)
    mapping.drop(
        rf"{p}pooler\.dense\.(weight|bias)", "I-JEPA's optional dense + tanh pooler (not what IJepaModel returns)"
    )
    map_params(mapping, "embeddings.patch_embedding", f"{e}patch_embeddings.projection", True)
    mapping.map("embeddings.position_embedding", f"{e}position_embeddings")
    for i in range(config.num_hidden_layers):
        source, target = f"{p}encoder.layer.{i}.", f"encoder.layers.{i}."
        attention = [f"{source}attention.attention.{n}" for n in ("query", "key", "value")]
        map_qkv(mapping, f"{target}attention", attention, config)
        for ours, theirs in VIT_LAYER.items():
            map_params(mapping, f"{target}{ours}", f"{source}{theirs}", True)
    map_params(mapping, "norm", f"{p}layernorm")


IJEPA = Tower(
    family="ijepa",
    config_class="IJepaConfig",
    settings=ijepa_settings,
    map_weights=ijepa_weights,
    marker="embeddings.patch_embeddings.projection.weight",
    reference=loader("IJepaModel"),
    preprocessing=(*HALF, "bilinear"),
    resize_kwargs={"interpolate_pos_encoding": True},
    citation_key="ijepa",
    prefixes=("", "ijepa."),
)


TOWERS = {
    "DINOv3ViTModel": DINOV3,
    "DINOv3ViTBackbone": DINOV3,
    "Aimv2VisionModel": AIMV2,
    "IJepaModel": IJEPA,
    "InternVLVisionModel": INTERNVL,
}
"""Every transformers architecture read as a tower (transformers_clip.py and transformers_beit.py add theirs)."""


def map_tower(tower, weights, config, cfg, description):
    """The strict mapper holding the tower's tensors in hubvit names; everything outside the tower's prefix (a dual
    encoder's text tower, projections, temperature) is dropped with that reason."""
    mapping = StrictMapping(weights, description)
    p = prefix_of(tower, weights)
    if p:
        mapping.drop(rf"(?!{re.escape(p)}).*", f"outside the vision tower under '{p}'")
    tower.map_weights(mapping, config, p, cfg)
    return mapping
