"""timm's `VisionTransformerRelPos` (vision_transformer_relpos.py: the relpos and srelpos ViTs) read into hubvit
settings and weights.

Their position information is a bias on the attention logits from a small MLP of log-spaced patch offsets
(`RelPosMlp` in its `cr` mode): hubvit's `relative_2d_mlp` kind. A bias MLP shared by every block (`srelpos`) is
copied into each; the residual post-norm blocks (`rpn`) are hubvit's `norm_placement="residual_post"`.
"""

from torch import nn

from .kinds import TIMM_GLOBAL_POOL, reading
from .timm_layers import (
    COMMON_RENAMES,
    size_arguments,
    common_settings,
    final_norm_problems,
    mlp_ratio,
    mlp_settings,
    norm_settings,
    patch_problems,
)

RENAMES = COMMON_RENAMES + [
    (
        r"blocks\.(\d+)\.attn\.rel_pos\.mlp\.(fc[12])\.(weight|bias)",
        r"encoder.layers.\1.attention.relative_position_mlp.\2.\3",
    ),
    (r"blocks\.(\d+)\.ls([12])\.gamma", r"encoder.layers.\1.layer_scale\2"),
]

COMBINED = [r"shared_rel_pos\.mlp\.fc[12]\.(weight|bias)"]
"""Source tensors `combine` consumes (listed as known when a refusal lists the unknown ones)."""


def combine(mapping, model):
    """The shared bias MLP (`srelpos`) copied into every block's attention."""
    for index in range(len(model.blocks)):
        for layer in ("fc1", "fc2"):
            for part in ("weight", "bias"):
                key = f"shared_rel_pos.mlp.{layer}.{part}"
                if mapping.has(key):
                    target = f"encoder.layers.{index}.attention.relative_position_mlp.{layer}.{part}"
                    mapping.combine(target, [key])


def bias_mlp_problems(module, where):
    from timm.layers.pos_embed_rel import RelPosMlp

    if type(module) is not RelPosMlp:
        return [f"{where} is {type(module).__name__} (hubvit has RelPosMlp)"]
    if module.mode != "cr" or not isinstance(module.bias_act, nn.Identity):
        return [f"{where} is a RelPosMlp in mode {module.mode!r} (hubvit has its 'cr' log-coordinate mode)"]
    if module.mlp.fc2.bias is None or not isinstance(module.mlp.act, nn.ReLU):
        return [f"{where} has an MLP without an output bias or ReLU"]
    return []


def read_settings(model, architecture):
    """(HubViTConfig kwargs, []) describing `model`, a timm `VisionTransformerRelPos` on the meta device, or (None,
    what hubvit lacks)."""
    from timm.layers import LayerScale
    from timm.models.vision_transformer_relpos import RelPosAttention, RelPosBlock, ResPostRelPosBlock

    problems = patch_problems(model.patch_embed)
    blocks = list(model.blocks)
    shared = model.shared_rel_pos
    if shared is not None:
        problems += bias_mlp_problems(shared, "shared_rel_pos")
    per_block = []
    for index, block in enumerate(blocks):
        where = f"blocks.{index}"
        if type(block) not in (RelPosBlock, ResPostRelPosBlock) or type(block.attn) is not RelPosAttention:
            problems.append(f"{where} is {type(block).__name__} (expected RelPosBlock or ResPostRelPosBlock)")
            continue
        attn = block.attn
        bias_mlp = attn.rel_pos if attn.rel_pos is not None else shared
        if bias_mlp is None:
            problems.append(f"{where}.attn has no relative position bias")
        elif attn.rel_pos is not None:
            problems += bias_mlp_problems(attn.rel_pos, f"{where}.attn.rel_pos")
        if attn.rel_pos is not None and shared is not None:
            problems.append(f"{where}.attn has a bias MLP of its own beside the shared one")
        per_block.append(
            dict(
                num_attention_heads=attn.num_heads,
                qkv_bias=attn.qkv.bias is not None,
                qk_norm=not isinstance(attn.q_norm, nn.Identity),
                relative_position_hidden_size=bias_mlp.mlp.fc1.out_features if bias_mlp is not None else None,
                layer_scale=type(getattr(block, "ls1", None)) is LayerScale,
                norm_placement="residual_post" if type(block) is ResPostRelPosBlock else "pre",
                **mlp_settings(block.mlp, where, problems),
            )
        )
    if per_block and any(settings != per_block[0] for settings in per_block):
        problems.append("blocks differ from blocks.0 (attention, MLP, heads, bias MLP or layer scale)")
    block = per_block[0] if per_block else {}
    eps, norm_type = norm_settings(model, problems)
    pool = model.global_pool
    pooling = reading(TIMM_GLOBAL_POOL)[pool]
    fc_norm = not isinstance(model.fc_norm, nn.Identity)
    problems += final_norm_problems(model, fc_norm, pool)
    if problems:
        return None, list(dict.fromkeys(__import__("re").sub(r"blocks\.\d+", "blocks.*", p) for p in problems))
    scale = blocks[0].ls1.gamma if block["layer_scale"] else None
    settings = dict(
        **common_settings(model, blocks, eps, norm_type),
        layer_scale_init_value=1e-5 if scale is not None else None,
        class_token=model.cls_token is not None,
        position_embedding_type="relative_2d_mlp",
        pooling=pooling,
        fc_norm=fc_norm,
        final_norm=fc_norm or not isinstance(model.norm, nn.Identity),
        **{k: v for k, v in block.items() if k != "layer_scale"},
    )
    return settings, []


EXPORT_ENTRY_POINTS = {
    ("layer_norm", 1e-6, "pre"): ["vit_relpos_base_patch16_224"],
    ("layer_norm", 1e-6, "residual_post"): ["vit_relpos_base_patch16_rpn_224"],
}
"""Entry points by the norm layer and block class their code sets (neither fits in `model_args`)."""


def export_arguments(config):
    """(candidate entry points, model_args) building timm's `VisionTransformerRelPos` for `config` with a bias MLP per block,
    or ([], why); decided by reading it back (`read_settings`)."""
    entries = EXPORT_ENTRY_POINTS.get((config.norm_type, config.layer_norm_eps, config.norm_placement))
    if entries is None:
        return [], (
            f"norm_type={config.norm_type!r} with eps {config.layer_norm_eps:g}, norm_placement="
            f"{config.norm_placement!r} (timm's relpos ViTs: LayerNorm 1e-6, pre or residual_post blocks)"
        )
    return entries, dict(
        **size_arguments(config),
        mlp_ratio=mlp_ratio(config.hidden_size, config.intermediate_size),
        qkv_bias=config.qkv_bias,
        qk_norm=config.qk_norm,
        init_values=config.layer_scale_init_value,
        class_token=config.class_token,
        fc_norm=config.fc_norm,
        rel_pos_type="mlp",
        rel_pos_dim=config.relative_position_hidden_size,
        shared_rel_pos=False,
    )
