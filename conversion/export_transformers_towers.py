"""`hubvit export transformers` for the folders transformers' ViT cannot express: back to the vision tower class they
would have been converted from (DINOv3 ViT, SigLIP, SigLIP 2 NaFlex, CLIP, AIMv2, I-JEPA, BEiT).

As for the timm families (export_timm.py), a class is taken only when the converter's own reading of the config it
builds (`Tower.settings`) gives the folder's config back, field by field, and the weights are the converter's mapping
run backwards (`mapping.inverse`) on the tensor names transformers' `save_pretrained` writes for that config.
Tensors the converter creates rather than reads (AIMv2's identity query) must hold exactly those values.
"""

import tempfile
from pathlib import Path

import torch

from ..folder import expected_shapes
from ..modeling.heads_hubvit import MeanPooling
from ..modeling.rotary_hubvit import DinoV3Rotary
from .common import ConversionError, read_back_problems
from .kinds import ABSOLUTE_TABLES, BEIT_RELATIVE_BIAS
from .mapping import inverse
from .transformers_beit import TOWERS as BEIT
from .transformers_clip import TOWERS as CLIP
from .transformers_towers import AIMV2, DINOV3, IJEPA, map_tower


def sizes(config):
    return dict(
        image_size=config.image_size,
        patch_size=config.patch_size,
        num_channels=config.num_channels,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
    )


def dinov3_fields(config):
    return dict(
        **sizes(config),
        layer_norm_eps=config.layer_norm_eps,
        query_bias=config.qkv_bias,
        key_bias=config.qkv_bias and config.key_bias,
        value_bias=config.qkv_bias,
        proj_bias=config.proj_bias,
        mlp_bias=config.mlp_bias,
        use_gated_mlp=config.mlp_kind.gated,
        layerscale_value=config.layer_scale_init_value if config.layer_scale_init_value is not None else 1.0,
        num_register_tokens=config.num_register_tokens,
        rope_theta=DinoV3Rotary.default_temperature if config.rope_base is None else config.rope_base,
        pos_embed_shift=config.rope_shift_coords,
        pos_embed_jitter=config.rope_jitter_coords,
        pos_embed_rescale=config.rope_rescale_coords,
    )


def aimv2_fields(config):
    return dict(
        **sizes(config),
        rms_norm_eps=config.layer_norm_eps,
        qkv_bias=config.qkv_bias,
        mlp_bias=config.mlp_bias,
        use_head=config.pooling_kind.attention_pool,
    )


def beit_fields(config):
    return dict(
        **sizes(config),
        layer_norm_eps=config.layer_norm_eps,
        use_relative_position_bias=config.position_kind in BEIT_RELATIVE_BIAS,
        use_absolute_position_embeddings=config.position_kind in ABSOLUTE_TABLES,
        layer_scale_init_value=config.layer_scale_init_value or 0.0,
        use_mean_pooling=config.pooling_kind is MeanPooling,
    )


def siglip2_fields(config):
    (rows, columns), fields = config.grid_size, sizes(config)
    del fields["image_size"]
    return dict(
        **fields,
        num_patches=rows * columns if rows == columns else -1,
        layer_norm_eps=config.layer_norm_eps,
        vision_use_head=config.pooling_kind.attention_pool,
    )


EXPORTS = [  # (transformers class, its Tower, the config fields for a hubvit config), in the order tried
    ("DINOv3ViTModel", DINOV3, dinov3_fields),
    ("SiglipVisionModel", CLIP["SiglipVisionModel"], lambda c: dict(**sizes(c), layer_norm_eps=c.layer_norm_eps)),
    ("Siglip2VisionModel", CLIP["Siglip2VisionModel"], siglip2_fields),
    ("CLIPVisionModel", CLIP["CLIPVisionModel"], lambda c: dict(**sizes(c), layer_norm_eps=c.layer_norm_eps)),
    ("Aimv2VisionModel", AIMV2, aimv2_fields),
    ("IJepaModel", IJEPA, lambda c: dict(**sizes(c), layer_norm_eps=c.layer_norm_eps, qkv_bias=c.qkv_bias)),
    ("BeitModel", BEIT["BeitModel"], beit_fields),
]


def candidate(architecture, tower, fields, config):
    """(transformers config, []) when the converter reads the class built from `fields(config)` back as `config`,
    else (None, the fields that differ)."""
    import transformers

    model_class = getattr(transformers, architecture)
    try:
        theirs = model_class.config_class(**fields(config))
    except (TypeError, ValueError) as error:
        return None, [f"{architecture} cannot be configured so: {error}"]
    theirs.architectures = [architecture]
    with torch.device("meta"):
        keys = set(model_class(theirs).state_dict())
    try:
        settings = tower.settings(theirs.to_dict(), keys)
    except ConversionError as error:
        return None, [str(error)]
    problems = read_back_problems(config, settings, f"transformers' {architecture} built from its config")
    if problems:
        return None, problems
    resize = ("interpolation_mode", "interpolation_antialias", "interpolation_align_corners")
    return theirs, [name for name in resize if settings.get(name, getattr(config, name)) != getattr(config, name)]


def choose(config):
    """(architecture, tower, transformers config) of the first class that reads back as `config`, preferring one
    that also resizes its position table as the folder does (SigLIP 2's bilinear over SigLIP's bicubic), or the list
    of what the closest class reads back differently."""
    closest, fallback = None, None
    for architecture, tower, fields in EXPORTS:
        theirs, problems = candidate(architecture, tower, fields, config)
        if theirs is not None and not problems:
            return architecture, tower, theirs
        if theirs is not None:
            fallback = fallback or (architecture, tower, theirs)
        elif closest is None or len(problems) < len(closest):
            closest = problems
    return fallback or closest


def build(architecture, tower, theirs, config, hubvit_weights, description):
    """transformers' `architecture` holding `hubvit_weights`: a model of that config saved by transformers, its
    tensors refilled by the converter's mapping run backwards, and loaded again with `from_pretrained`."""
    import transformers
    from safetensors.torch import save_file

    from .transformers import read_folder_weights

    model_class = getattr(transformers, architecture)
    cfg = theirs.to_dict()
    created, shapes = {}, expected_shapes(config)

    def forward(source):
        mapping = map_tower(tower, source, config, cfg, description)
        weights = mapping.finish(shapes)
        created.update({key: weights[key] for key in mapping.created})
        return {key: value for key, value in weights.items() if key not in mapping.created}

    with tempfile.TemporaryDirectory() as folder:
        model_class(theirs).save_pretrained(folder)
        template, path = read_folder_weights(folder)
        target = {key: hubvit_weights[key] for key in shapes if key in hubvit_weights}
        forward(template)  # learns which tensors the converter creates
        target = {key: value for key, value in target.items() if key not in created}
        state, filled = inverse(forward, template, target, description)
        fixed = [key for key, value in created.items() if not torch.equal(hubvit_weights[key].float(), value)]
        if fixed:
            raise ConversionError(
                f"{description}: {', '.join(sorted(fixed))} must hold what {architecture} implies (the converter "
                "creates them: identity or zero); this folder's differ"
            )
        save_file({key: value.contiguous() for key, value in state.items()}, str(Path(path)), metadata={"format": "pt"})
        model = model_class.from_pretrained(folder).float().eval()
    return model, [f"mapped {len(target)} hubvit tensors onto {len(filled)} tensors of {architecture}"]
