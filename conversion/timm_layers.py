"""What timm's ViT families share, read off their modules the same way for each: activations, the patch
embedding, the norms and the final norm."""

from torch import nn

from ..modeling.layers_hubvit import MLP_KINDS
from .kinds import TIMM_GLOBAL_POOL, reading


def activation_name(module):
    """hubvit's `hidden_act` for a timm activation module, or None when hubvit has no exact equivalent."""
    from timm.layers import activations

    if isinstance(module, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_pytorch_tanh"}.get(module.approximate)
    exact = {
        activations.GELU: "gelu",
        activations.GELUTanh: "gelu_pytorch_tanh",
        activations.QuickGELU: "quick_gelu",
        nn.SiLU: "silu",
        activations.Swish: "silu",
        nn.ReLU: "relu",
    }
    return exact.get(type(module))


def patch_problems(patch):
    """What hubvit's patch embedding (a stride-P convolution) cannot be of timm's `patch_embed`."""
    from timm.layers import PatchEmbed

    if type(patch) is not PatchEmbed or not isinstance(getattr(patch, "proj", None), nn.Conv2d):
        return [f"patch embedding {type(patch).__name__} (hybrid stems are not supported; expected PatchEmbed)"]
    problems = []
    if tuple(patch.proj.kernel_size) != tuple(patch.proj.stride) or tuple(patch.proj.padding) != (0, 0):
        problems.append(f"patch convolution kernel {patch.proj.kernel_size} stride {patch.proj.stride}")
    return problems


def norm_settings(model, problems):
    """(eps, norm_type) of every norm in `model`: LayerNorms with weight and bias, or RMSNorms with a weight, all
    with one eps; anything else is added to `problems`."""
    from timm.layers import RmsNorm

    norms = [m for name, m in model.named_modules() if "norm" in name.split(".")[-1] and not isinstance(m, nn.Identity)]
    kinds = set()
    for module in norms:
        if isinstance(module, nn.LayerNorm) and module.weight is not None and module.bias is not None:
            kinds.add("layer_norm")
        elif isinstance(module, (RmsNorm, getattr(nn, "RMSNorm", RmsNorm))) and module.weight is not None:
            kinds.add("rms_norm")
        else:
            problems.append(
                f"normalisation {type(module).__name__} (hubvit has LayerNorm with weight and bias, RMSNorm)"
            )
            return None, None
    if len(kinds) > 1:
        problems.append("LayerNorms beside RMSNorms")
    eps = {float(m.eps) if m.eps is not None else 1e-6 for m in norms}
    if len(eps) > 1:
        problems.append(f"norms with different eps {sorted(eps)}")
    return (eps.pop() if eps else 1e-6), (kinds.pop() if kinds else "layer_norm")


def final_norm_problems(model, fc_norm, pool):
    """The final norm: before pooling (`norm`), after mean pooling (`fc_norm`), or none (RADIO)."""
    problems = []
    if fc_norm and pool != "avg":
        problems.append(f"fc_norm with global_pool={pool!r} (hubvit applies fc_norm to mean pooling only)")
    if fc_norm and not isinstance(model.norm, nn.Identity):
        problems.append("a final norm both before and after pooling")
    return problems


def mlp_settings(mlp, where, problems):
    """The MLP kind, its width, activation, biases and inner norm."""
    from timm.layers import GluMlp, Mlp, SwiGLU

    kinds = {SwiGLU: "gated", GluMlp: "gated", Mlp: "mlp"}
    if type(mlp) not in kinds or not isinstance(getattr(mlp, "fc2", None), nn.Linear):
        problems.append(f"{where}.mlp is {type(mlp).__name__} (expected Mlp, GluMlp or SwiGLU)")
        return {}
    if type(mlp) is GluMlp and mlp.chunk_dim != -1:
        problems.append(f"{where}.mlp is a convolutional GluMlp")
    return dict(
        mlp_type=kinds[type(mlp)],
        intermediate_size=mlp.fc2.in_features,
        hidden_act=activation_name(mlp.act),
        mlp_bias=mlp.fc2.bias is not None,
        mlp_inner_norm=not isinstance(mlp.norm, nn.Identity),
    )


COMMON_RENAMES = [
    (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embedding.\1"),
    (r"patch_embed\.norm\.(weight|bias)", r"embeddings.patch_norm.\1"),
    (r"cls_token", "embeddings.class_token"),
    (r"reg_token", "embeddings.register_tokens"),
    (r"pos_embed", "embeddings.position_embedding"),
    (r"norm_pre\.(weight|bias)", r"pre_norm.\1"),
    (r"blocks\.(\d+)\.norm([12])\.(weight|bias)", r"encoder.layers.\1.norm\2.\3"),
    (r"blocks\.(\d+)\.attn\.(qkv|proj|norm|q_norm|k_norm)\.(weight|bias)", r"encoder.layers.\1.attention.\2.\3"),
    (r"blocks\.(\d+)\.mlp\.(fc1|fc2|norm)\.(weight|bias)", r"encoder.layers.\1.mlp.\2.\3"),
    (r"norm\.(weight|bias)", r"norm.\1"),
    (r"fc_norm\.(weight|bias)", r"pooler.fc_norm.\1"),
    (r"attn_pool\.latent", "pooler.map_head.probe"),
    (r"attn_pool\.(q|kv|proj|norm|mlp\.fc1|mlp\.fc2)\.(weight|bias)", r"pooler.map_head.\1.\2"),
    (r"head\.(weight|bias)", r"classifier.\1"),
]
"""The names timm's ViT classes share; each reader adds those of its own attention and layer scale."""


def common_settings(model, blocks, eps, norm_type):
    """The config fields every timm ViT class gives the same way: sizes, norms, the patch embedding, and timm's
    position-table resize (bicubic, antialias, float32, as its `dynamic_img_size`)."""
    patch = model.patch_embed
    height, width = (int(v) for v in patch.img_size)
    ph, pw = (int(v) for v in patch.patch_size)
    return dict(
        image_size=height if height == width else [height, width],
        patch_size=ph if ph == pw else [ph, pw],
        num_channels=patch.proj.in_channels,
        hidden_size=model.embed_dim,
        num_hidden_layers=len(blocks),
        layer_norm_eps=eps,
        norm_type=norm_type,
        patch_bias=patch.proj.bias is not None,
        patch_norm=not isinstance(patch.norm, nn.Identity),
        interpolation_mode="bicubic",
        interpolation_antialias=True,
        interpolation_align_corners=False,
        dynamic_img_pad=bool(getattr(patch, "dynamic_img_pad", False)),
    )


GATED_MLP_KEYS = [r"blocks\.\d+\.mlp\.fc1_[gx]\.(weight|bias)"]
"""Source tensors `pack_gated_mlps` consumes (listed as known when a refusal lists the unknown ones)."""


def pack_gated_mlps(mapping, model):
    """Gated MLPs as hubvit's one packed fc1, gate first: SwiGLU's separate gate and value projections
    concatenated, and a GluMlp whose gate is its second half (`gate_last`) swapped. Call after the renames."""
    import torch
    from timm.layers import GluMlp

    for index, block in enumerate(model.blocks):
        mlp = getattr(block, "mlp", None)
        for part in ("weight", "bias"):
            target = f"encoder.layers.{index}.mlp.fc1.{part}"
            keys = [f"blocks.{index}.mlp.fc1_{half}.{part}" for half in "gx"]
            if hasattr(mlp, "fc1_g") and mapping.has(keys[0]):
                mapping.combine(target, keys, lambda gate, value: torch.cat([gate, value]))
            elif type(mlp) is GluMlp and mlp.gate_last and mapping.has(f"blocks.{index}.mlp.fc1.{part}"):
                mapping.combine(target, [f"blocks.{index}.mlp.fc1.{part}"], lambda w: torch.cat(w.chunk(2)[::-1]))


def map_settings(model, block, problems):
    """The MAP head's fields for timm's `AttentionPoolLatent` (`block`: the blocks' settings): its own head count
    and MLP width where they differ from the blocks' (Perception Encoder)."""
    from timm.layers import AttentionPoolLatent

    head = model.attn_pool
    if type(head) is not AttentionPoolLatent:
        problems.append(f"attention pool {type(head).__name__} (expected AttentionPoolLatent)")
        return {}
    if head.latent_len != 1 or head.pos_embed is not None or head.pool != "token" or head.mlp is None:
        problems.append("attention pool with several latents, its own position table or no MLP")
        return {}
    if not isinstance(head.q_norm, nn.Identity) or head.q.bias is None:
        problems.append("attention pool with qk-norm or no bias")
    if activation_name(head.mlp.act) != block.get("hidden_act"):
        problems.append("attention pool MLP activation unlike the blocks'")
    width = head.mlp.fc1.out_features
    settings = {}
    if head.num_heads != block.get("num_attention_heads"):
        settings["map_num_heads"] = head.num_heads
    if width != block.get("intermediate_size") or MLP_KINDS[block.get("mlp_type", "mlp")].gated:
        settings["map_intermediate_size"] = width
    return settings


def mlp_ratio(hidden_size, width):
    """The `mlp_ratio` for which timm's `int(hidden_size * mlp_ratio)` is `width` (the plain quotient can land a hair
    below it in floating point)."""
    ratio = width / hidden_size
    return ratio if int(hidden_size * ratio) == width else (width + 0.5) / hidden_size


def size_arguments(config):
    """The timm constructor arguments every family takes under the same names, from a hubvit config."""
    return dict(
        img_size=list(config.image_size_2d),
        patch_size=list(config.patch_size_2d),
        in_chans=config.num_channels,
        num_classes=config.num_labels,
        global_pool=TIMM_GLOBAL_POOL.get(config.pooling_kind, config.pooling),
        embed_dim=config.hidden_size,
        depth=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
    )


def block_settings(blocks, problems):
    """The settings all of timm's pre-norm `Block`s (or `ResPostBlock`s) share, with the `layer_scale` class name;
    what hubvit cannot express, or blocks that differ, go to `problems`."""
    from timm.layers import Attention, LayerScale
    from timm.models.vision_transformer import Block, ResPostBlock

    per_block = []
    for index, block in enumerate(blocks):
        where = f"blocks.{index}"
        if type(block) not in (Block, ResPostBlock):
            problems.append(f"{where} is {type(block).__name__} (expected the pre-norm Block or ResPostBlock)")
            continue
        attn, scale = block.attn, getattr(block, "ls1", nn.Identity())
        if type(attn) is not Attention:
            problems.append(f"{where}.attn is {type(attn).__name__} (expected plain multi-head Attention)")
            continue
        if type(scale) not in (LayerScale, nn.Identity):
            problems.append(f"{where} layer scale {type(scale).__name__}")
        per_block.append(
            dict(
                num_attention_heads=attn.num_heads,
                qkv_bias=attn.qkv.bias is not None,
                qk_norm=not isinstance(attn.q_norm, nn.Identity),
                attention_inner_norm=not isinstance(attn.norm, nn.Identity),
                proj_bias=attn.proj.bias is not None,
                layer_scale=type(scale).__name__,
                norm_placement="residual_post" if type(block) is ResPostBlock else "pre",
                **mlp_settings(block.mlp, where, problems),
            )
        )
    if per_block and any(settings != per_block[0] for settings in per_block):
        problems.append("blocks differ from blocks.0 (attention, MLP, heads or layer scale)")
    block = per_block[0] if per_block else {}
    if block.get("hidden_act", "gelu") is None:
        name = type(blocks[0].mlp.act).__name__
        problems.append(f"MLP activation {name} (hubvit has gelu, gelu_pytorch_tanh, quick_gelu, silu, relu)")
    return block


def head_settings(model, block, problems):
    """What follows the blocks of a timm ViT (`VisionTransformer`, `NaFlexVit`): the pooling, the MAP head, the
    final norm before or after pooling (and the norm before the blocks); what hubvit lacks goes to `problems`."""
    pool = model.global_pool
    prefix = model.num_prefix_tokens
    pooling = reading(TIMM_GLOBAL_POOL).get(pool) if pool else None
    if pooling is None:
        problems.append(f"global_pool={pool!r} (hubvit pools with 'token', 'avg' or 'map')")
    if pool == "avg" and model.pool_include_prefix and prefix:
        problems.append("avg pooling over prefix tokens too (pool_include_prefix=True)")
    pool_settings = {}
    if pool == "map":
        if prefix and not model.pool_include_prefix:
            problems.append(f"MAP pooling that skips {prefix} prefix tokens (hubvit's MAP head reads all tokens)")
        pool_settings = map_settings(model, block, problems)
    fc_norm = not isinstance(model.fc_norm, nn.Identity)
    problems += final_norm_problems(model, fc_norm, pool)
    return dict(
        final_norm=fc_norm or not isinstance(model.norm, nn.Identity),
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        pooling=pooling,
        fc_norm=fc_norm,
        **pool_settings,
    )
