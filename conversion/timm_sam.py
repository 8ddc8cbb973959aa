"""timm's `VisionTransformerSAM` (vision_transformer_sam.py: the Segment Anything image encoders) read into hubvit
settings and weights.

Its blocks attend within 14 x 14 windows except a few global ones, each with decomposed relative positions
(hubvit's `attention_window_size`, `global_attention_blocks`, `decomposed_relative_position`); the position table
is stored as a (1, rows, columns, D) map; the encoder ends in the convolutional neck (`neck_size`) whose map is
averaged, or, without a neck, in a channel norm before the average (hubvit's final norm).
"""

from torch import nn

from .timm_layers import (
    COMMON_RENAMES,
    common_settings,
    mlp_ratio,
    mlp_settings,
    norm_settings,
    patch_problems,
    size_arguments,
)

RENAMES = [(pattern, target) for pattern, target in COMMON_RENAMES if pattern != "pos_embed"] + [
    (r"blocks\.(\d+)\.attn\.rel_pos_h", r"encoder.layers.\1.attention.relative_position_rows"),
    (r"blocks\.(\d+)\.attn\.rel_pos_w", r"encoder.layers.\1.attention.relative_position_columns"),
    (r"blocks\.(\d+)\.ls([12])\.gamma", r"encoder.layers.\1.layer_scale\2"),
    (r"neck\.0\.weight", "pooler.neck.reduce.weight"),
    (r"neck\.1\.(weight|bias)", r"pooler.neck.norm1.\1"),
    (r"neck\.2\.weight", "pooler.neck.mix.weight"),
    (r"neck\.3\.(weight|bias)", r"pooler.neck.norm2.\1"),
    (r"neck\.(weight|bias)", r"norm.\1"),
    (r"head\.fc\.(weight|bias)", r"classifier.\1"),
]

COMBINED = [r"pos_embed"]
"""Source tensors `combine` consumes (listed as known when a refusal lists the unknown ones)."""


def combine(mapping, model):
    """The (1, rows, columns, D) position map as hubvit's (1, rows * columns, D) table."""
    if mapping.has("pos_embed"):
        mapping.combine("embeddings.position_embedding", ["pos_embed"], lambda table: table.flatten(1, 2))


def neck_settings(model, problems):
    """(neck_size, final_norm, eps of its norms) of timm's `neck`: SAM's convolutions and channel norms, or one
    channel norm (the final norm, before the average)."""
    from timm.layers import LayerNorm2d

    neck = model.neck
    if type(neck) is LayerNorm2d:
        return None, True, [float(neck.eps)]
    parts = list(neck) if isinstance(neck, nn.Sequential) else []
    kinds = [type(part) for part in parts]
    if kinds != [nn.Conv2d, LayerNorm2d, nn.Conv2d, LayerNorm2d]:
        problems.append(f"neck {type(neck).__name__} {kinds} (hubvit has SAM's conv, norm, conv, norm or a norm)")
        return None, False, []
    reduce, mix = parts[0], parts[2]
    shapes = (reduce.kernel_size, mix.kernel_size, mix.padding) != ((1, 1), (3, 3), (1, 1))
    if shapes or reduce.bias is not None or mix.bias is not None:
        problems.append("neck convolutions other than SAM's 1x1 and padded 3x3 without biases")
    return reduce.out_channels, False, [float(parts[1].eps), float(parts[3].eps)]


def read_settings(model, architecture):
    """(HubViTConfig kwargs, []) describing `model`, a timm `VisionTransformerSAM` on the meta device, or (None,
    what hubvit lacks)."""
    from timm.layers import ClassifierHead, LayerScale
    from timm.models.vision_transformer_sam import Attention, Block

    problems = patch_problems(model.patch_embed)
    blocks = list(model.blocks)
    per_block, windows = [], []
    for index, block in enumerate(blocks):
        where = f"blocks.{index}"
        if type(block) is not Block or type(block.attn) is not Attention:
            problems.append(f"{where} is {type(block).__name__} (expected SAM's Block and Attention)")
            continue
        attn = block.attn
        if attn.rope is not None:
            problems.append(f"{where}.attn rotates with separate window and global rotary tables (use_rope)")
        windows.append(block.window_size)
        per_block.append(
            dict(
                num_attention_heads=attn.num_heads,
                qkv_bias=attn.qkv.bias is not None,
                qk_norm=not isinstance(attn.q_norm, nn.Identity),
                decomposed_relative_position=bool(attn.use_rel_pos),
                layer_scale=type(block.ls1) is LayerScale,
                **mlp_settings(block.mlp, where, problems),
            )
        )
    if per_block and any(settings != per_block[0] for settings in per_block):
        problems.append("blocks differ from blocks.0 (attention, MLP, heads, relative positions or layer scale)")
    if len(set(w for w in windows if w)) > 1:
        problems.append(f"windows of different sides {sorted(set(w for w in windows if w))}")
    eps, norm_type = norm_settings(model, problems)
    neck_size, final_norm, neck_eps = neck_settings(model, problems)
    if len(set(neck_eps)) > 1:
        problems.append(f"neck norms with different eps {sorted(set(neck_eps))}")
    head = model.head
    if type(head) is not ClassifierHead or head.global_pool.pool_type != "avg":
        pool = getattr(getattr(head, "global_pool", None), "pool_type", None)
        problems.append(f"head {type(head).__name__} pooling {pool!r} (hubvit has ClassifierHead with 'avg')")
    if problems:
        return None, list(dict.fromkeys(__import__("re").sub(r"blocks\.\d+", "blocks.*", p) for p in problems))
    block = per_block[0]
    window = max(windows)
    settings = dict(
        **common_settings(model, blocks, eps, norm_type),
        layer_scale_init_value=float(blocks[0].ls1.init_values) if block["layer_scale"] else None,
        class_token=False,
        position_embedding_type="learned" if model.pos_embed is not None else "none",
        attention_window_size=window,
        global_attention_blocks=[i for i, w in enumerate(windows) if not w] if window else None,
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        pooling="mean",
        final_norm=final_norm,
        final_layer_norm_eps=neck_eps[0] if neck_eps and neck_eps[0] != eps else None,
        neck_size=neck_size,
        **{k: v for k, v in block.items() if k != "layer_scale"},
    )
    return settings, []


EXPORT_ENTRY_POINTS = {("layer_norm", 1e-5, "gelu"): ["samvit_base_patch16"]}
"""Entry points by the norm layer and activation their code sets (neither is a JSON argument of this class)."""


def export_arguments(config):
    """(candidate entry points, model_args) building timm's `VisionTransformerSAM` for `config`, or ([], why);
    decided by reading it back (`read_settings`)."""
    entries = EXPORT_ENTRY_POINTS.get((config.norm_type, config.layer_norm_eps, config.hidden_act))
    if entries is None:
        return [], (
            f"norm_type={config.norm_type!r} with eps {config.layer_norm_eps:g}, hidden_act={config.hidden_act!r} "
            "(timm's SAM ViTs: LayerNorm 1e-5, GELU)"
        )
    window = config.attention_window_size
    return entries, dict(
        **size_arguments(config),
        mlp_ratio=mlp_ratio(config.hidden_size, config.intermediate_size),
        qkv_bias=config.qkv_bias,
        qk_norm=config.qk_norm,
        init_values=config.layer_scale_init_value,
        pre_norm=config.pre_norm,
        use_abs_pos=config.position_kind.adds_table,
        use_rel_pos=config.decomposed_relative_position,
        window_size=window,
        global_attn_indexes=list(config.global_attention_blocks or []) if window else [],
        neck_chans=config.neck_size or 0,  # timm's create_model drops None arguments: 0 is its 'no neck'
    )
