"""timm's `Eva` family (eva.py: EVA-02, DINOv3, the RoPE ViTs, Perception Encoder, EVA-CLIP towers) read into hubvit
settings and weights.

As for timm's `VisionTransformer` (timm.py), the model is built on the meta device and its modules are read for
the true settings; every setting hubvit cannot express is refused by name. The rotary module decides the rotary
kind: `RotaryEmbeddingCat` is `axial`, `RotaryEmbeddingDinoV3` is `dinov3`, `RotaryEmbeddingMixed` is `mixed`.
"""

from torch import nn

from .kinds import ABSOLUTE_TABLES, TIMM_GLOBAL_POOL, TIMM_ROPE_TYPE, reading
from .timm_layers import (
    COMMON_RENAMES,
    GATED_MLP_KEYS,
    size_arguments,
    common_settings,
    final_norm_problems,
    map_settings,
    mlp_ratio,
    mlp_settings,
    norm_settings,
    pack_gated_mlps,
    patch_problems,
)

RENAMES = COMMON_RENAMES + [
    (r"blocks\.(\d+)\.attn\.(q|v)_bias", r"encoder.layers.\1.attention.\2_bias"),
    (r"blocks\.(\d+)\.attn\.(q|k|v)_proj\.(weight|bias)", r"encoder.layers.\1.attention.\2.\3"),
    (r"blocks\.(\d+)\.gamma_([12])", r"encoder.layers.\1.layer_scale\2"),
]
"""One-to-one names; SwiGLU's split fc1 and RoPE-Mixed's stacked frequencies are `combine`d (below)."""

COMBINED = [*GATED_MLP_KEYS, r"rope\.freqs"]
"""Source tensors `combine` consumes, so a refusal does not list them as tensors hubvit has no place for."""


def combine(mapping, model):
    """Gated MLPs packed (`pack_gated_mlps`), and RoPE-Mixed's (2, depth, H, d/2) frequencies split into each
    block's attention. Call after the renames."""
    pack_gated_mlps(mapping, model)
    if mapping.has("rope.freqs"):
        for index in range(len(model.blocks)):
            target = f"encoder.layers.{index}.attention.rope_frequencies"
            mapping.combine(target, ["rope.freqs"], lambda freqs, i=index: freqs[:, i])


def rotary_settings(rope, problems):
    """The `rope_*` config fields of timm's rotary module, or None without one."""
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed

    if rope is None:
        return {}
    if type(rope) is RotaryEmbeddingCat:
        if rope.in_pixels or rope.grid_type != "index" or rope.linear_bands:
            problems.append("rotary embedding in pixel bands (RotaryEmbeddingCat in_pixels=True)")
        ref = rope.ref_feat_shape
        settings = dict(
            rope_type="axial",
            rope_temperature=float(rope.temperature),
            rope_rotate_half=bool(rope.rotate_half),
            rope_grid_offset=float(rope.grid_offset),
            rope_grid_indexing=rope.grid_indexing,
            rope_reference_grid=[int(v) for v in ref] if ref is not None else None,
        )
    elif type(rope) is RotaryEmbeddingDinoV3:
        if rope.min_period is not None or rope.max_period is not None:
            problems.append("DINOv3 rotary periods from min_period/max_period (hubvit takes the temperature)")
        settings = dict(
            rope_type="dinov3",
            rope_temperature=float(rope.temperature),
            rope_rotate_half=bool(rope.rotate_half),
            rope_grid_offset=float(rope.grid_offset),
            rope_grid_indexing=rope.grid_indexing,
            rope_normalize_coords=rope.normalize_coords,
        )
    elif type(rope) is RotaryEmbeddingMixed:
        settings = dict(
            rope_type="mixed", rope_temperature=float(rope.temperature), rope_grid_indexing=rope.grid_indexing
        )
    else:
        problems.append(f"rotary embedding {type(rope).__name__} (hubvit has RotaryEmbeddingCat, DinoV3 and Mixed)")
        return {}
    for name in ("shift_coords", "jitter_coords", "rescale_coords"):
        value = getattr(rope, name, None)
        if value is not None:
            settings[f"rope_{name}"] = float(value)
    return settings


def attention_settings(attn, where, problems):
    """Projection layout and biases of an `EvaAttention` or `AttentionRope`."""
    from timm.layers import AttentionRope
    from timm.models.eva import EvaAttention

    if type(attn) not in (EvaAttention, AttentionRope):
        problems.append(f"{where}.attn is {type(attn).__name__} (expected EvaAttention or AttentionRope)")
        return {}
    if getattr(attn, "gate", None) is not None:
        problems.append(f"{where}.attn has a sigmoid gate on its output (gated attention)")
    if attn.proj.in_features != attn.proj.out_features or attn.head_dim * attn.num_heads != attn.proj.in_features:
        problems.append(f"{where}.attn has its own head width (attn_head_dim)")
    fused = attn.qkv is not None
    if fused:
        q_and_v = getattr(attn, "q_bias", None) is not None
        qkv_bias = q_and_v or attn.qkv.bias is not None
        key_bias = attn.qkv.bias is not None
    else:
        qkv_bias = attn.q_proj.bias is not None
        key_bias = attn.k_proj.bias is not None
        if attn.v_proj.bias is None and qkv_bias:
            problems.append(f"{where}.attn has a query bias without a value bias")
    return dict(
        qkv_fused=fused,
        qkv_bias=qkv_bias,
        key_bias=key_bias or not qkv_bias,
        qk_norm=not isinstance(attn.q_norm, nn.Identity),
        attention_inner_norm=not isinstance(attn.norm, nn.Identity),
        proj_bias=attn.proj.bias is not None,
    )


def key_value_heads(counts, heads):
    """`num_key_value_heads` for timm's per-block `num_kv_heads`: None where every block has one per query head, one
    int where all blocks share a count, else the list (Sapiens2 groups its middle blocks only)."""
    if all(count == heads for count in counts):
        return None
    return counts[0] if len(set(counts)) == 1 else list(counts)


def eva_block_settings(blocks, problems):
    """(the settings every `EvaBlock` / `EvaBlockPostNorm` shares, with its `layer_scale` pair, and each block's
    key/value head count); what hubvit cannot express, or blocks that differ, go to `problems`. Timm's `Eva` and
    its NaFlexVit with rotary positions build these blocks."""
    from timm.models.eva import EvaBlock, EvaBlockPostNorm

    per_block, kv_heads = [], []
    for index, block in enumerate(blocks):
        where = f"blocks.{index}"
        if type(block) not in (EvaBlock, EvaBlockPostNorm):
            problems.append(f"{where} is {type(block).__name__} (expected EvaBlock or EvaBlockPostNorm)")
            continue
        settings = {**attention_settings(block.attn, where, problems), **mlp_settings(block.mlp, where, problems)}
        gammas = (getattr(block, "gamma_1", None), getattr(block, "gamma_2", None))
        settings["layer_scale"] = tuple(gamma is not None for gamma in gammas)
        settings["norm_placement"] = "residual_post" if type(block) is EvaBlockPostNorm else "pre"
        settings["num_attention_heads"] = block.attn.num_heads
        per_block.append(settings)
        kv_heads.append(getattr(block.attn, "num_kv_heads", block.attn.num_heads))
    if per_block and any(settings != per_block[0] for settings in per_block):
        problems.append("blocks differ from blocks.0 (attention, MLP, heads or layer scale)")
    block = per_block[0] if per_block else {}
    if block.get("hidden_act", "gelu") is None:
        problems.append(f"MLP activation {type(blocks[0].mlp.act).__name__}")
    if block.get("layer_scale") == (False, True):
        problems.append("layer scale on the MLP only")
    return block, kv_heads


def eva_block_fields(blocks, block, kv_heads):
    """The config fields of `eva_block_settings`' reading: layer scale, key/value heads, the block's components."""
    scale = getattr(blocks[0], "init_values", None)
    return dict(
        layer_scale_init_value=float(scale or 1e-5) if block["layer_scale"][0] else None,
        scale_attention_branch_only=block["layer_scale"] == (True, False),
        num_key_value_heads=key_value_heads(kv_heads, block["num_attention_heads"]),
        **{k: v for k, v in block.items() if k != "layer_scale"},
    )


def rope_fields(rope, blocks, problems):
    """`rotary_settings` of the model's rotary module, checked against the blocks' pairing of channels."""
    rotary = rotary_settings(rope, problems)
    if rotary and blocks and bool(blocks[0].attn.rotate_half) != rotary.get("rope_rotate_half", False):
        problems.append("the blocks pair channels for rotation unlike the rotary module (rotate_half)")
    return rotary


def read_settings(model, architecture):
    """(HubViTConfig kwargs, []) describing `model`, a timm `Eva` on the meta device, or (None, what hubvit lacks)."""
    problems = patch_problems(model.patch_embed)
    blocks = list(model.blocks)
    block, kv_heads = eva_block_settings(blocks, problems)
    eps, norm_type = norm_settings(model, problems)
    pool = model.global_pool
    pooling = reading(TIMM_GLOBAL_POOL).get(pool)
    if pooling is None:
        problems.append(f"global_pool={pool!r} (hubvit pools with 'token', 'avg', 'map' or none)")
    pool_settings = map_settings(model, block, problems) if pool == "map" else {}
    fc_norm = not isinstance(model.fc_norm, nn.Identity)
    problems += final_norm_problems(model, fc_norm, pool)
    rotary = rope_fields(model.rope, blocks, problems)
    if problems:
        return None, list(dict.fromkeys(__import__("re").sub(r"blocks\.\d+", "blocks.*", p) for p in problems))
    settings = dict(
        **common_settings(model, blocks, eps, norm_type),
        **eva_block_fields(blocks, block, kv_heads),
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        class_token=model.cls_token is not None,
        num_register_tokens=int(model.reg_token.shape[1]) if model.reg_token is not None else 0,
        position_embedding_type="learned" if model.pos_embed is not None else "none",
        position_embedding_includes_prefix=not model.no_embed_class,
        pooling=pooling,
        fc_norm=fc_norm,
        final_norm=fc_norm or not isinstance(model.norm, nn.Identity),
        **rotary,
        **pool_settings,
    )
    return settings, []


EXPORT_ENTRY_POINTS = {
    ("layer_norm", 1e-6): ["eva_giant_patch14_224", "eva02_tiny_patch14_224", "vit_base_patch16_rope_224"],
    ("layer_norm", 1e-5): ["vit_small_patch16_dinov3", "vit_pe_core_tiny_patch16_384", "vit_pe_lang_large_patch14_448"],
    ("rms_norm", 1e-6): ["vit_base_patch16_sapiens2"],
}
"""Entry points by the norm layer their code sets (config.json's `model_args` cannot carry a norm layer). Every
other argument is given explicitly, but timm's `create_model` drops arguments that are None, so what an entry point
sets (layer scale, EVA's reference grid) cannot be unset: the candidates of a norm cover those on and off, and the
first that reads back as the folder's config is taken."""


def export_arguments(config):
    """(candidate entry points, model_args) building timm's `Eva` for `config`, or ([], why) for a norm no entry
    point has. Whether a candidate gives the same model is decided by reading it back (`read_settings`)."""
    entries = EXPORT_ENTRY_POINTS.get((config.norm_type, config.layer_norm_eps))
    if entries is None:
        return [], f"norm_type={config.norm_type!r} with eps {config.layer_norm_eps:g} (timm's Eva entry points " + (
            "set " + ", ".join(f"{kind} {eps:g}" for kind, eps in EXPORT_ENTRY_POINTS) + ")"
        )
    rotary = config.rotary_kind
    width = config.map_width
    args = dict(
        **size_arguments(config),
        num_kv_heads=None
        if config.norm_placement_kind.norms_branch_output
        else tuple(config.key_value_heads(i) for i in range(config.num_hidden_layers)),
        qkv_bias=config.qkv_bias,
        qkv_fused=config.qkv_fused,
        qk_norm=config.qk_norm,
        mlp_ratio=mlp_ratio(config.hidden_size, config.intermediate_size),
        swiglu_mlp=config.mlp_kind.gated,
        swiglu_align_to=0,
        scale_mlp=config.mlp_inner_norm,
        scale_attn_inner=config.attention_inner_norm,
        attn_type="rope" if config.qkv_bias and config.key_bias else "eva",
        init_values=config.layer_scale_init_value,
        attn_only_layer_scale=config.scale_attention_branch_only,
        class_token=config.class_token,
        num_reg_tokens=config.num_register_tokens,
        no_embed_class=not config.position_embedding_includes_prefix,
        use_abs_pos_emb=config.position_kind in ABSOLUTE_TABLES,
        use_rot_pos_emb=rotary is not None,
        use_post_norm=config.norm_placement_kind.norms_branch_output,
        use_pre_transformer_norm=config.pre_norm,
        use_post_transformer_norm=config.final_norm and not config.fc_norm,
        use_fc_norm=config.fc_norm,
        attn_pool_num_heads=config.map_heads,
        attn_pool_mlp_ratio=mlp_ratio(config.hidden_size, width),
        dynamic_img_pad=config.dynamic_img_pad,
    )
    if rotary is not None:
        args.update(
            rope_type=TIMM_ROPE_TYPE[config.rotary_kind],
            rope_temperature=config.rope_base,
            rope_rotate_half=bool(config.rope_pairs_halves),
            rope_grid_offset=config.rope_grid_offset,
            rope_grid_indexing=config.rope_grid_indexing,
            ref_feat_shape=config.rope_reference_grid,
            **{
                f"rope_{name}": getattr(config, f"rope_{name}")
                for name in ("shift_coords", "jitter_coords", "rescale_coords")
            },
        )
    return entries, args
