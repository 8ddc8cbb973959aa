"""transformers' BEiT and Data2Vec-vision (`BeitModel`, `Data2VecVisionModel`) as `Tower`s.

Both keep BEiT's relative position bias as one table per block (and optionally one shared by all blocks, added to
each): (2 gh - 1)(2 gw - 1) patch offsets row-major over (dy, dx), then three rows for the class token (to the
patches, from the patches, to itself), one column per head: hubvit's `relative_2d_class`, resized bilinear as
transformers does. With `use_mean_pooling` the last hidden state is not normed and the pooler norms the mean of the
patch tokens (hubvit's `fc_norm`); a Data2Vec model saved without its pooler has no final norm at all.
"""

from .common import ConversionError
from .kinds import ABSOLUTE_TABLES, BEIT_RELATIVE_BIAS
from .timm_beit import split_table
from .transformers_towers import HALF, MASK_TOKEN, VIT_LAYER, Tower, loader, map_params, map_qkv, vit_sizes

TABLE = "relative_position_bias.relative_position_bias_table"


def beit_settings(cfg, keys):
    relative = cfg["use_relative_position_bias"] or cfg["use_shared_relative_position_bias"]
    absolute = cfg["use_absolute_position_embeddings"]
    size = cfg["image_size"]
    if relative and absolute:
        raise ConversionError(
            "use_absolute_position_embeddings=True beside a relative position bias: transformers resizes the two "
            "differently (bicubic, bilinear) and hubvit has one position kind"
        )
    if relative and isinstance(size, (list, tuple)) and len(set(size)) > 1:
        raise ConversionError(
            f"image_size={size} is not square: transformers' BEiT swaps height and width when it builds the relative "
            "bias, so its own bias at this size is not the table's (hubvit would not reproduce it)"
        )
    if relative:
        position = dict(position_embedding_type="relative_2d_class", interpolation_mode="bilinear")
    else:
        position = dict(position_embedding_type="learned" if absolute else "none", interpolation_mode="bicubic")
    if not cfg["use_mean_pooling"]:
        pooling = dict(pooling="cls")
    elif "pooler.layernorm.weight" in keys:
        pooling = dict(pooling="mean", fc_norm=True)
    else:
        pooling = dict(pooling="none", final_norm=False)
    scale = cfg["layer_scale_init_value"]
    return dict(
        **vit_sizes(cfg),
        key_bias=False,
        layer_scale_init_value=scale if scale and scale > 0 else None,
        drop_path_rate=cfg.get("drop_path_rate", 0.0),
        interpolation_antialias=False,
        interpolation_align_corners=False,
        **position,
        **pooling,
    )


def beit_weights(mapping, config, p, cfg):
    e = f"{p}embeddings."
    mapping.drop(rf"{e}mask_token", MASK_TOKEN)
    mapping.drop(r".*relative_position_index", "index buffer, rebuilt from the grid")
    mapping.map("embeddings.class_token", f"{e}cls_token")
    map_params(mapping, "embeddings.patch_embedding", f"{e}patch_embeddings.projection")
    if config.position_kind in ABSOLUTE_TABLES:
        mapping.map("embeddings.position_embedding", f"{e}position_embeddings")
    grid = tuple(config.grid_size)
    shared = f"{p}encoder.{TABLE}"
    for i in range(config.num_hidden_layers):
        source, target = f"{p}encoder.layer.{i}.", f"encoder.layers.{i}."
        attention = [f"{source}attention.attention.{n}" for n in ("query", "key", "value")]
        map_qkv(mapping, f"{target}attention", attention, config)
        for ours, theirs in VIT_LAYER.items():
            map_params(mapping, f"{target}{ours}", f"{source}{theirs}")
        if config.layer_scale_init_value is not None:
            mapping.map(f"{target}layer_scale1", f"{source}lambda_1")
            mapping.map(f"{target}layer_scale2", f"{source}lambda_2")
        if config.position_kind in BEIT_RELATIVE_BIAS:
            tables = [key for key in (f"{source}attention.attention.{TABLE}", shared) if mapping.has(key)]
            bias = f"{target}attention.relative_position_"
            mapping.combine(f"{bias}bias", tables, lambda *t: split_table(sum(t), grid)[0])
            mapping.combine(f"{bias}class_bias", tables, lambda *t: split_table(sum(t), grid)[1])
    if config.fc_norm:
        map_params(mapping, "pooler.fc_norm", f"{p}pooler.layernorm")
    elif config.final_norm:
        map_params(mapping, "norm", f"{p}layernorm")


def beit(family, model_class, citation_key):
    return Tower(
        family=family,
        config_class=model_class.replace("Model", "Config"),
        settings=beit_settings,
        map_weights=beit_weights,
        marker="embeddings.cls_token",
        reference=loader(model_class),
        preprocessing=(*HALF, "bicubic"),
        resize_kwargs={"interpolate_pos_encoding": True},
        citation_key=citation_key,
    )


TOWERS = {
    "BeitModel": beit("beit", "BeitModel", "beit"),
    "Data2VecVisionModel": beit("data2vec-vision", "Data2VecVisionModel", "data2vec"),
}
