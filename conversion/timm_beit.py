"""timm's `Beit` (beit.py: BEiT, BEiT v2) read into hubvit settings and weights.

BEiT's relative position bias is hubvit's `relative_2d_class` kind: timm stores each block's biases as one table of
(2 gh - 1)(2 gw - 1) patch offsets, row-major over (dy, dx), then three rows for the class token (to the patches,
from the patches, to itself), one column per head; hubvit keeps the offsets as an (H, 2 gh - 1, 2 gw - 1) grid (what
resizes to another grid) and the class token's three beside it. A table shared by all blocks
(`use_shared_rel_pos_bias`) is copied into each.
"""

from torch import nn

from .kinds import ABSOLUTE_TABLES, BEIT_RELATIVE_BIAS, TIMM_GLOBAL_POOL, reading
from .timm_layers import (
    COMMON_RENAMES,
    GATED_MLP_KEYS,
    size_arguments,
    common_settings,
    final_norm_problems,
    mlp_ratio,
    mlp_settings,
    norm_settings,
    pack_gated_mlps,
    patch_problems,
)

RENAMES = COMMON_RENAMES + [
    (r"blocks\.(\d+)\.attn\.(q|v)_bias", r"encoder.layers.\1.attention.\2_bias"),
    (r"blocks\.(\d+)\.gamma_([12])", r"encoder.layers.\1.layer_scale\2"),
]

COMBINED = [
    *GATED_MLP_KEYS,
    r"blocks\.\d+\.attn\.relative_position_bias_table",
    r"rel_pos_bias\.relative_position_bias_table",
]
"""Source tensors `combine` consumes (listed as known when a refusal lists the unknown ones)."""

DROPS = [(r"(blocks\.\d+\.attn|rel_pos_bias)\.relative_position_index", "index buffer, rebuilt from the grid")]


def split_table(table, grid):
    """timm's ((2gh-1)(2gw-1) + 3, H) table as hubvit's (H, 2gh-1, 2gw-1) offsets and (H, 3) class biases."""
    rows, columns = 2 * grid[0] - 1, 2 * grid[1] - 1
    offsets = table[: rows * columns].t().reshape(-1, rows, columns)
    return offsets, table[rows * columns :].t()


def combine(mapping, model):
    """Gated MLPs packed, and each block's relative bias table split (or the shared one copied into each block)."""
    pack_gated_mlps(mapping, model)
    grid = tuple(model.patch_embed.grid_size)
    shared = "rel_pos_bias.relative_position_bias_table"
    for index in range(len(model.blocks)):
        own = f"blocks.{index}.attn.relative_position_bias_table"
        keys = [key for key in (own, shared) if mapping.has(key)]
        if not keys:
            continue
        target = f"encoder.layers.{index}.attention.relative_position_"
        mapping.combine(target + "bias", keys, lambda *tables: split_table(sum(tables), grid)[0])
        mapping.combine(target + "class_bias", keys, lambda *tables: split_table(sum(tables), grid)[1])


def read_settings(model, architecture):
    """(HubViTConfig kwargs, []) describing `model`, a timm `Beit` on the meta device, or (None, what hubvit lacks)."""
    from timm.models.beit import Attention, Block

    problems = patch_problems(model.patch_embed)
    blocks = list(model.blocks)
    per_block = []
    for index, block in enumerate(blocks):
        where = f"blocks.{index}"
        if type(block) is not Block or type(block.attn) is not Attention:
            problems.append(f"{where} is {type(block).__name__} (expected BEiT's Block and Attention)")
            continue
        attn = block.attn
        if attn.proj.in_features != model.embed_dim:
            problems.append(f"{where}.attn has its own head width (attn_head_dim)")
        per_block.append(
            dict(
                num_attention_heads=attn.num_heads,
                qkv_bias=attn.q_bias is not None,
                relative=attn.relative_position_bias_table is not None,
                layer_scale=block.gamma_1 is not None,
                **mlp_settings(block.mlp, where, problems),
            )
        )
    if per_block and any(settings != per_block[0] for settings in per_block):
        problems.append("blocks differ from blocks.0 (attention, MLP, heads, relative bias or layer scale)")
    block = per_block[0] if per_block else {}
    relative = block.get("relative") or model.rel_pos_bias is not None
    if relative and model.pos_embed is not None:
        problems.append("an absolute position table beside the relative bias (use_abs_pos_emb with use_rel_pos_bias)")
    eps, norm_type = norm_settings(model, problems)
    pool = model.global_pool
    pooling = reading(TIMM_GLOBAL_POOL).get(pool, "cls")
    fc_norm = not isinstance(model.fc_norm, nn.Identity)
    problems += final_norm_problems(model, fc_norm, pool)
    if problems:
        return None, list(dict.fromkeys(__import__("re").sub(r"blocks\.\d+", "blocks.*", p) for p in problems))
    if relative:
        position = "relative_2d_class"
    else:
        position = "learned" if model.pos_embed is not None else "none"
    settings = dict(
        **common_settings(model, blocks, eps, norm_type),
        key_bias=not block["qkv_bias"],
        layer_scale_init_value=float(getattr(blocks[0], "init_values", None) or 0.1) if block["layer_scale"] else None,
        class_token=True,
        position_embedding_type=position,
        pooling=pooling,
        fc_norm=fc_norm,
        final_norm=fc_norm or not isinstance(model.norm, nn.Identity),
        **{k: v for k, v in block.items() if k not in ("layer_scale", "relative")},
    )
    return settings, []


EXPORT_ENTRY_POINTS = {("layer_norm", 1e-6): ["beit_base_patch16_224"]}
"""Entry points by the norm layer their code sets; every other argument is given explicitly."""


def export_arguments(config):
    """(candidate entry points, model_args) building timm's `Beit` for `config` with a table per block (never the shared one:
    hubvit keeps one per block), or ([], why); decided by reading it back (`read_settings`)."""
    entries = EXPORT_ENTRY_POINTS.get((config.norm_type, config.layer_norm_eps))
    if entries is None:
        return [], f"norm_type={config.norm_type!r} with eps {config.layer_norm_eps:g} (timm's BEiT: LayerNorm 1e-6)"
    return entries, dict(
        **size_arguments(config),
        qkv_bias=config.qkv_bias,
        mlp_ratio=mlp_ratio(config.hidden_size, config.intermediate_size),
        swiglu_mlp=config.mlp_kind.gated,
        scale_mlp=config.mlp_inner_norm,
        init_values=config.layer_scale_init_value,
        use_abs_pos_emb=config.position_kind in ABSOLUTE_TABLES,
        use_rel_pos_bias=config.position_kind in BEIT_RELATIVE_BIAS,
        use_shared_rel_pos_bias=False,
        use_fc_norm=config.fc_norm,
    )
