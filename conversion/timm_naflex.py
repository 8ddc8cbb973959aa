"""timm's `NaFlexVit` (naflexvit.py: NaFlex ViTs, SigLIP 2 NaFlex towers, C-RADIO) read into hubvit settings and
weights.

Its blocks and head are timm's ViT ones (read as for `VisionTransformer`, timm.py); what differs is the patch
embedding, `embeds`: a linear projection of each patch's pixels in (row, column, channel) order (hubvit's stride-P
kernel, reordered), an NHWC position table with no rows for the prefix tokens, resized per image by the table's own
mode, antialias and corner alignment (`pos_embed_ar_preserving`: to a square of the longer side, then cropped, hubvit's
`interpolation_keep_aspect`).
"""

from torch import nn

from . import timm_eva
from .common import linear_patch_kernel
from .timm_layers import COMMON_RENAMES, block_settings, head_settings, norm_settings

RENAMES = [
    (r"embeds\.cls_token", "embeddings.class_token"),
    (r"embeds\.reg_token", "embeddings.register_tokens"),
    (r"embeds\.proj\.bias", "embeddings.patch_embedding.bias"),
    (r"embeds\.norm\.(weight|bias)", r"embeddings.patch_norm.\1"),
    *COMMON_RENAMES,
    (r"blocks\.(\d+)\.ls([12])\.gamma", r"encoder.layers.\1.layer_scale\2"),
    *timm_eva.RENAMES[len(COMMON_RENAMES) :],
]
"""One-to-one names (EVA blocks' too, which the rotary NaFlexViTs build); the patch kernel and the NHWC table are
`combine`d (below), with EVA's gated MLPs and mixed frequencies."""

COMBINED = [r"embeds\.proj\.weight", r"embeds\.pos_embed", *timm_eva.COMBINED]


def combine(mapping, model):
    """The linear patch projection as a stride-P kernel, and the (1, H, W, D) table as (1, H * W, D); EVA blocks'
    gated MLPs and RoPE-Mixed frequencies as for `Eva`."""
    timm_eva.combine(mapping, model)
    size, channels = model.embeds.patch_size, model.embeds.in_chans
    kernel = lambda weight: linear_patch_kernel(weight, size, channels)  # noqa: E731
    mapping.combine("embeddings.patch_embedding.weight", ["embeds.proj.weight"], kernel)
    if mapping.has("embeds.pos_embed"):
        mapping.combine("embeddings.position_embedding", ["embeds.pos_embed"], lambda t: t.flatten(1, 2))


def embedding_problems(embeds):
    problems = []
    if not embeds.is_linear or not embeds.channels_last or embeds.enable_patch_interpolator:
        problems.append("a patch embedding other than a linear projection of (row, column, channel) pixels")
    if embeds.pos_embed_y is not None:
        problems.append(f"pos_embed={embeds.pos_embed_type!r} (hubvit has a learned 2D table or none)")
    if embeds.pos_embed_use_grid_sample:
        problems.append("position table sampled with grid_sample (pos_embed_use_grid_sample)")
    if embeds.norm_input is not None:
        problems.append("a norm over the patch pixels before the projection (input_norm_layer)")
    return problems


def read_settings(model, architecture):
    """(HubViTConfig kwargs, []) describing `model`, a timm `NaFlexVit` on the meta device, or (None, what hubvit
    lacks)."""
    import re

    from timm.layers import LayerScale

    from timm.models.eva import EvaBlock

    embeds, blocks, problems = model.embeds, list(model.blocks), []
    problems += embedding_problems(embeds)
    eps, norm_type = norm_settings(model, problems)
    eva = bool(blocks) and type(blocks[0]) is EvaBlock  # rotary positions, SwiGLU, grouped heads: EVA blocks
    if eva:
        block, kv_heads = timm_eva.eva_block_settings(blocks, problems)
        rotary = timm_eva.rope_fields(model.rope, blocks, problems)
    else:
        block, rotary = block_settings(blocks, problems), {}
    head = head_settings(model, block, problems)
    if problems:
        return None, list(dict.fromkeys(re.sub(r"blocks\.\d+", "blocks.*", p) for p in problems))
    if eva:
        block_fields = timm_eva.eva_block_fields(blocks, block, kv_heads)
    else:
        scale = getattr(blocks[0], "ls1", None)
        block_fields = dict(
            layer_scale_init_value=float(scale.init_values) if isinstance(scale, LayerScale) else None,
            **{k: v for k, v in block.items() if k != "layer_scale"},
        )
    (ph, pw), (gh, gw) = embeds.patch_size, embeds.pos_embed_grid_size
    settings = dict(
        image_size=gh * ph if (gh * ph == gw * pw) else [gh * ph, gw * pw],
        patch_size=ph if ph == pw else [ph, pw],
        num_channels=embeds.in_chans,
        hidden_size=model.embed_dim,
        num_hidden_layers=len(blocks),
        layer_norm_eps=eps,
        norm_type=norm_type,
        patch_bias=embeds.proj.bias is not None,
        patch_norm=not isinstance(embeds.norm, nn.Identity),
        interpolation_mode=embeds.pos_embed_interp_mode,
        interpolation_antialias=bool(embeds.pos_embed_antialias),
        interpolation_align_corners=bool(embeds.pos_embed_align_corners),
        interpolation_keep_aspect=bool(embeds.pos_embed_ar_preserving),
        dynamic_img_pad=bool(embeds.dynamic_img_pad),
        class_token=embeds.cls_token is not None,
        num_register_tokens=embeds.num_reg_tokens,
        position_embedding_type="learned" if embeds.pos_embed is not None else "none",
        position_embedding_includes_prefix=False,
        **block_fields,
        **rotary,
        **head,
    )
    return settings, []
