"""transformers' CLIP and SigLIP vision towers (`CLIPVisionModel`, `SiglipVisionModel`, and the vision tower of the
dual encoders `CLIPModel` and `SiglipModel`, which fixed-resolution SigLIP 2 checkpoints use too; SigLIP 2's NaFlex
`Siglip2VisionModel` and `Siglip2Model`) as `Tower`s.

Both run the same encoder layers (`self_attn.{q,k,v,out}_proj`, `layer_norm1/2`, `mlp.fc1/fc2`). SigLIP has no
[CLS]: a patch-only table, every token normed by `post_layernorm`, then a MAP head (`nn.MultiheadAttention` with one
learned probe, then a residual MLP), hubvit's `map` pooling. CLIP has [CLS] and a table row for it, a norm before the
encoder (`pre_layrnorm`), no patch bias, and `post_layernorm` on the pooled [CLS] alone (`last_hidden_state` is not
normed): hubvit's `fc_norm` with `cls` pooling.
"""

from dataclasses import replace

import torch

from .common import ConversionError, linear_patch_kernel
from .transformers_towers import HALF, OPENAI_CLIP, Tower, loader, map_params, map_qkv, vit_sizes


def encoder_settings(cfg):
    """The fields both towers read the same way from their vision config."""
    return dict(
        **vit_sizes(cfg),
        interpolation_mode="bicubic",
        interpolation_antialias=False,
        interpolation_align_corners=False,
    )


def map_encoder(mapping, config, p):
    for i in range(config.num_hidden_layers):
        source, target = f"{p}encoder.layers.{i}.", f"encoder.layers.{i}."
        map_params(mapping, f"{target}norm1", f"{source}layer_norm1")
        map_params(mapping, f"{target}norm2", f"{source}layer_norm2")
        map_qkv(mapping, f"{target}attention", [f"{source}self_attn.{n}_proj" for n in "qkv"], config)
        map_params(mapping, f"{target}attention.proj", f"{source}self_attn.out_proj")
        map_params(mapping, f"{target}mlp.fc1", f"{source}mlp.fc1")
        map_params(mapping, f"{target}mlp.fc2", f"{source}mlp.fc2")


# ----------------------------------------------------------------------------------------------------------- SigLIP


def siglip_settings(cfg, keys):
    head = cfg.get("vision_use_head", True)
    return dict(**encoder_settings(cfg), class_token=False, pooling="map" if head else "none")


def siglip_weights(mapping, config, p, cfg, patches=True):
    e = f"{p}embeddings."
    if patches:
        map_params(mapping, "embeddings.patch_embedding", f"{e}patch_embedding")
    mapping.map("embeddings.position_embedding", f"{e}position_embedding.weight", lambda t: t[None])
    map_encoder(mapping, config, p)
    map_params(mapping, "norm", f"{p}post_layernorm")
    if not config.pooling_kind.attention_pool:
        return
    h, dim = f"{p}head.", config.hidden_size
    mapping.map("pooler.map_head.probe", f"{h}probe")
    for part in ("weight", "bias"):
        mapping.map(f"pooler.map_head.q.{part}", f"{h}attention.in_proj_{part}", lambda t: t[:dim])
        mapping.map(f"pooler.map_head.kv.{part}", f"{h}attention.in_proj_{part}", lambda t: t[dim:])
    map_params(mapping, "pooler.map_head.proj", f"{h}attention.out_proj")
    map_params(mapping, "pooler.map_head.norm", f"{h}layernorm")
    map_params(mapping, "pooler.map_head.mlp.fc1", f"{h}mlp.fc1")
    map_params(mapping, "pooler.map_head.mlp.fc2", f"{h}mlp.fc2")


def siglip(reference, nested=None):
    return Tower(
        family="siglip",
        config_class="SiglipVisionConfig",
        settings=siglip_settings,
        map_weights=siglip_weights,
        marker="embeddings.patch_embedding.weight",
        reference=reference,
        preprocessing=(*HALF, "bicubic"),
        nested=nested,
        resize_kwargs={"interpolate_pos_encoding": True},
        citation_key=["siglip", "siglip2"],
        prefixes=("", "vision_model."),
    )


def idefics3_settings(cfg, keys):
    """Idefics3's and SmolVLM's vision encoder: SigLIP's tower without its head (`post_layernorm` on every token, no
    pooler). Its positions are bucketed from each image's patch grid, which is the table itself at the native size
    only, so the reference runs there alone."""
    return dict(**encoder_settings(cfg), class_token=False, pooling="none")


idefics3 = Tower(
    family="idefics3",
    config_class="Idefics3VisionConfig",
    settings=idefics3_settings,
    map_weights=siglip_weights,
    marker="embeddings.patch_embedding.weight",
    reference=None,
    preprocessing=(*HALF, "bilinear"),
    resize_kwargs=None,
    citation_key=["siglip"],
    prefixes=("",),
)


# ------------------------------------------------------------------------------------------------- SigLIP 2 NaFlex


def siglip2_settings(cfg, keys):
    """SigLIP's tower with a linear patch embedding over (row, column, channel) pixels and a square table of
    `num_patches` rows, resized to each image's grid bilinearly with antialias (transformers' Siglip2VisionEmbeddings)."""
    side = int(round(cfg["num_patches"] ** 0.5))
    if side * side != cfg["num_patches"]:
        raise ConversionError(f"num_patches={cfg['num_patches']} is not a square grid; hubvit reads a square table")
    fields = dict(cfg, image_size=side * cfg["patch_size"])
    return dict(
        siglip_settings(fields, keys),
        interpolation_mode="bilinear",
        interpolation_antialias=True,
        interpolation_align_corners=False,
    )


def siglip2_weights(mapping, config, p, cfg):
    e, size, channels = f"{p}embeddings.", config.patch_size_2d, config.num_channels
    kernel = lambda weight: linear_patch_kernel(weight, size, channels)  # noqa: E731
    mapping.map("embeddings.patch_embedding.weight", f"{e}patch_embedding.weight", kernel)
    mapping.map("embeddings.patch_embedding.bias", f"{e}patch_embedding.bias")
    siglip_weights(mapping, config, p, cfg, patches=False)


class WholeImages:
    """transformers' `Siglip2VisionModel` called on whole (B, C, H, W) images, each one patch sequence of its full
    grid with nothing padded: the reference for the converter's parity check, at any size."""

    def __init__(self, model):
        self.model, self.patch_size = model, model.config.patch_size

    def __call__(self, pixel_values):
        b, c, h, w = pixel_values.shape
        p = self.patch_size
        rows, columns = h // p, w // p
        patches = pixel_values[:, :, : rows * p, : columns * p].reshape(b, c, rows, p, columns, p)
        patches = patches.permute(0, 2, 4, 3, 5, 1).reshape(b, rows * columns, p * p * c)
        mask = torch.ones(b, rows * columns, dtype=torch.long)
        shapes = torch.tensor([[rows, columns]] * b)
        return self.model(pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes)


def siglip2_processor(cfg):
    """SigLIP 2's own processor at the tower's patch size, its table's patch count as the budget, converting
    grayscale, RGBA and palette images to RGB (transformers' default leaves that off)."""
    from transformers import Siglip2ImageProcessor

    return Siglip2ImageProcessor(patch_size=cfg["patch_size"], max_num_patches=cfg["num_patches"], do_convert_rgb=True)


def siglip2(reference, nested=None):
    return replace(
        siglip(reference, nested),
        family="siglip2",
        config_class="Siglip2VisionConfig",
        settings=siglip2_settings,
        map_weights=siglip2_weights,
        citation_key="siglip2",
        resize_kwargs={},
        preprocessing=(*HALF, "bilinear"),
        runner=WholeImages,
        processor=siglip2_processor,
    )


# ------------------------------------------------------------------------------------------------------------- CLIP


def clip_settings(cfg, keys):
    return dict(**encoder_settings(cfg), patch_bias=False, pre_norm=True, pooling="cls", fc_norm=True)


def clip_weights(mapping, config, p, cfg, post_norm="pooler.fc_norm"):
    e = f"{p}embeddings."
    mapping.map("embeddings.class_token", f"{e}class_embedding", lambda t: t.reshape(1, 1, -1))
    mapping.map("embeddings.patch_embedding.weight", f"{e}patch_embedding.weight")
    mapping.map("embeddings.position_embedding", f"{e}position_embedding.weight", lambda t: t[None])
    mapping.drop(rf"{e}position_ids", "index buffer")
    map_params(mapping, "pre_norm", f"{p}pre_layrnorm")
    map_encoder(mapping, config, p)
    map_params(mapping, post_norm, f"{p}post_layernorm")


def git_settings(cfg, keys):
    """GIT's image encoder: CLIP's tower with `post_layernorm` on every token (its `last_hidden_state`), no pooler:
    hubvit's final norm, the [CLS] as `pooler_output`."""
    return dict(**encoder_settings(cfg), patch_bias=False, pre_norm=True, pooling="cls")


def git_weights(mapping, config, p, cfg):
    clip_weights(mapping, config, p, cfg, post_norm="norm")


def clip(
    reference, nested=None, config_class="CLIPVisionConfig", family="clip", settings=clip_settings, weights=clip_weights
):
    """CLIP's tower (MetaCLIP 2 runs the same one under its own config class; GIT's normalises every token)."""
    return Tower(
        family=family,
        config_class=config_class,
        settings=settings,
        map_weights=weights,
        marker="embeddings.class_embedding",
        reference=reference,
        preprocessing=(*OPENAI_CLIP, "bicubic"),
        nested=nested,
        resize_kwargs={"interpolate_pos_encoding": True},
        citation_key="clip",
        prefixes=("", "vision_model."),
    )


TOWERS = {
    "SiglipVisionModel": siglip(loader("SiglipVisionModel")),
    "Siglip2VisionModel": siglip2(loader("Siglip2VisionModel")),
    "Siglip2Model": siglip2(loader("Siglip2Model", "vision_model"), nested="vision_config"),
    "SiglipModel": siglip(loader("SiglipModel", "vision_model"), nested="vision_config"),
    "CLIPVisionModel": clip(loader("CLIPVisionModel")),
    "CLIPVisionModelWithProjection": clip(loader("CLIPVisionModelWithProjection", "vision_model")),
    "CLIPModel": clip(loader("CLIPModel", "vision_model"), nested="vision_config"),
    "MetaClip2VisionModel": clip(loader("MetaClip2VisionModel"), config_class="MetaClip2VisionConfig"),
    "MetaClip2VisionModelWithProjection": clip(
        loader("MetaClip2VisionModelWithProjection", "vision_model"), config_class="MetaClip2VisionConfig"
    ),
    "MetaClip2Model": clip(
        loader("MetaClip2Model", "vision_model"), nested="vision_config", config_class="MetaClip2VisionConfig"
    ),
    "GitVisionModel": clip(
        loader("GitVisionModel"),
        config_class="GitVisionConfig",
        family="git",
        settings=git_settings,
        weights=git_weights,
    ),
    "Idefics3VisionTransformer": replace(idefics3, reference=loader("Idefics3VisionTransformer")),
    "SmolVLMVisionTransformer": replace(
        idefics3, reference=loader("SmolVLMVisionTransformer"), config_class="SmolVLMVisionConfig", family="smolvlm"
    ),
}
