"""HubViT: the Vision Transformer of Dosovitskiy et al. (2021) for transformers.

Reads top to bottom in the order of the paper: patch embedding (a stride-P convolution), prefix tokens ([CLS],
distillation, registers) and the position kind's embedding (positions_hubvit.py), a pre-norm encoder
(layers_hubvit.py), the final norm, a pooler (heads_hubvit.py), and the heads. The models here share one body and
one loop over the blocks; version shims live in compat_hubvit.py.

This file travels to the Hub next to every checkpoint: flat, relative imports only, no I/O.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import (
    BackboneOutput,
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    SemanticSegmenterOutput,
)

from .compat_hubvit import (
    BackboneMixin,
    TransformersKwargs,
    Unpack,
    can_return_tuple,
    check_kwargs,
    init,
    lecun_normal_,
    record_outputs,
    select_hidden_states,
)
from .configuration_hubvit import HubViTConfig, to_2tuple
from .fields_hubvit import check_types  # noqa: F401
from .body_hubvit import HubViTBody
from .heads_hubvit import HubViTMAPHead, HubViTPooler
from .layers_hubvit import (
    HubViTAttention,
    HubViTEmbeddings,
    NORM_MODULES,
    HubViTLayer,
    take_indices,
)
from .patch_resize_hubvit import check_resize_options, patch_pair, resize_patch_kernel

# every modeling file reached is imported directly (see configuration_hubvit.py)
from .naflex_hubvit import check_patch_sequence  # noqa: F401
from .positions_hubvit import POSITION_KINDS  # noqa: F401
from .resize_hubvit import resize_as_configured  # noqa: F401
from .rotary_hubvit import Positions  # noqa: F401
from .windows_hubvit import partition  # noqa: F401


class HubViTPreTrainedModel(PreTrainedModel):
    """Weights initialised as in the paper's code (google-research/vision_transformer): Xavier-uniform dense kernels
    and zero biases, LeCun-normal patch embedding, position table N(0, 0.02), zero [CLS], zero-initialised head."""

    config_class = HubViTConfig
    config: HubViTConfig
    base_model_prefix = "hubvit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["HubViTEmbeddings", "HubViTLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {"hidden_states": HubViTLayer, "attentions": HubViTAttention}

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path, *model_args, patch_size=None, patch_resize_method="pi", **kwargs
    ):
        """transformers' `from_pretrained`, plus `patch_size=P`: the checkpoint loaded as saved, then
        `resize_patch_embeddings(P, method=patch_resize_method)` (timm's `create_model(..., patch_size=P)`).

        Through the Auto classes `patch_size` reaches the config first; a config whose patch size differs from the
        saved one is put back and the model resized after loading, so both routes give the same model.
        """
        config = kwargs.get("config")
        if patch_size is None and config is not None and not isinstance(config, str) and pretrained_model_name_or_path:
            hub = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
            try:
                saved = config.__class__.from_pretrained(
                    pretrained_model_name_or_path, **{k: kwargs[k] for k in hub if k in kwargs}
                )
            except OSError:
                saved = config
            if to_2tuple(saved.patch_size, "patch_size") != to_2tuple(config.patch_size, "patch_size"):
                patch_size, config.patch_size = config.patch_size, saved.patch_size
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        if patch_size is not None:
            model = loaded[0] if isinstance(loaded, tuple) else loaded
            model.resize_patch_embeddings(patch_size, method=patch_resize_method)
        return loaded

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            heads = (getattr(self, "classifier", None), getattr(self, "distillation_classifier", None))
            if any(module is head for head in heads):
                init.zeros_(module.weight)
            else:
                init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Conv2d):
            lecun_normal_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, NORM_MODULES):
            init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, HubViTEmbeddings):
            module.position.init_weights(module, init)
            if module.class_token is not None:
                init.zeros_(module.class_token)
            for token in (module.distillation_token, module.register_tokens):
                if token is not None:
                    init.normal_(token, std=std)
        elif isinstance(module, HubViTAttention):
            module.position.init_attention(module, init)
            for bias in (module.q_bias, module.v_bias):
                if bias is not None:
                    init.zeros_(bias)
        elif isinstance(module, HubViTLayer):
            for scale in (module.layer_scale1, module.layer_scale2):
                if scale is not None:
                    init.constant_(scale, self.config.layer_scale_init_value)
        elif isinstance(module, HubViTMAPHead):
            init.xavier_uniform_(module.probe.view(1, -1))


class HubViTModel(HubViTBody, HubViTPreTrainedModel):
    """The ViT body: `last_hidden_state` after the final norm and `pooler_output`, the vector the classifier reads.

    `hidden_states` holds the encoder input (after `pre_norm`) and every block's output, before the final norm;
    like `attentions`, they are recorded by transformers' output capturing (`_can_record_outputs`), so
    `output_hidden_states=[0, 2]` selects layers.
    """

    def __init__(self, config: HubViTConfig):
        super().__init__(config)
        self.build_body(config)
        self.pooler = HubViTPooler(config)
        self.post_init()

    @record_outputs
    def forward(
        self,
        pixel_values=None,
        interpolate_pos_encoding=None,
        num_output_tokens=None,
        patch_size=None,
        pixel_attention_mask=None,
        spatial_shapes=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        """`interpolate_pos_encoding` is accepted for transformers compatibility: every input size is resized.
        `pixel_attention_mask` and `spatial_shapes` with (B, N, P * P * C) `pixel_values`: images at their own sizes
        as patch sequences (SigLIP 2's NaFlex, naflex_hubvit.py).

        `num_output_tokens` runs the last block for the first tokens only (keys and values still come from every
        token), so `last_hidden_state` holds just those: what a classifier reading the prefix tokens needs, in the
        spirit of transformers' `logits_to_keep`. The default computes every token.

        `patch_size` cuts the image into patches of that size with the stored kernel resized on the fly
        (`resize_patch_embeddings` explains the resize; gradients flow into the stored kernel), as FlexiViT trains.
        """
        check_kwargs(kwargs, self)
        hidden_states, grid, mask = self.embed(pixel_values, patch_size, pixel_attention_mask, spatial_shapes)
        if mask is not None:
            kwargs["attention_mask"] = mask
        hidden_states = self.encoder(hidden_states, grid, num_output_tokens, **kwargs)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        pooled = self.pooler(hidden_states, mask, grid)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=pooled)

    @torch.no_grad()
    def resize_position_embeddings(self, image_size):
        """Resize the position tables for a new native resolution (high-resolution fine-tuning, as in the paper)."""
        config = self.config
        ph, pw = config.patch_size_2d
        new_size = to_2tuple(image_size, "image_size")
        if new_size[0] < ph or new_size[1] < pw:
            raise ValueError(f"image_size={image_size!r} is smaller than one patch of patch_size={config.patch_size!r}")
        new_grid = (new_size[0] // ph, new_size[1] // pw)
        embeddings = self.embeddings
        embeddings.position.resize(embeddings, new_grid)
        for layer in self.encoder.layers:
            layer.attention.position.resize_attention(layer.attention, new_grid)
        config.image_size = new_size[0] if new_size[0] == new_size[1] else list(new_size)
        embeddings.grid_size = new_grid
        return self

    @torch.no_grad()
    def resize_patch_embeddings(
        self, patch_size, method="pi", interpolation="bicubic", antialias=True, image_size=None
    ):
        """Serve another patch size from this checkpoint (FlexiViT, Beyer et al., 2023): the kernel resized, the
        position tables resized to the new grid with the checkpoint's own method, the config updated.

        `method="pi"`: w_hat = pinv(B^T) w for B the pixel resize (`interpolation` "bicubic" or "bilinear", with or
        without `antialias`, as `torch.nn.functional.interpolate` computes it), so an image whose every patch was
        resized by B gives the same embeddings as the original. `method="interpolate"`: the kernel resized as an
        image, the plain baseline. `image_size`: the new native resolution (default: the current one, so the grid
        changes with the patch); `(P, kP)` with `image_size` k times larger keeps the grid and the tables as they are.
        """
        config, embeddings = self.config, self.embeddings
        check_resize_options(method, interpolation, antialias)
        new_patch = patch_pair(patch_size)
        new_size = to_2tuple(config.image_size if image_size is None else image_size, "image_size")
        if new_size[0] % new_patch[0] or new_size[1] % new_patch[1]:
            raise ValueError(
                f"patch_size={patch_size!r} does not divide image_size={list(new_size)}; pass an image_size it divides"
            )
        old = embeddings.patch_embedding
        old_patch = tuple(old.kernel_size)
        conv = nn.Conv2d(
            old.in_channels,
            old.out_channels,
            kernel_size=new_patch,
            stride=new_patch,
            bias=old.bias is not None,
            device=old.weight.device,
            dtype=old.weight.dtype,
        )
        conv.weight.copy_(resize_patch_kernel(old.weight, new_patch, method, interpolation, antialias))
        if old.bias is not None:
            conv.bias.copy_(old.bias)
        embeddings.patch_embedding = conv
        embeddings.patch_size = new_patch
        config.patch_size = new_patch[0] if new_patch[0] == new_patch[1] else list(new_patch)
        self.resize_position_embeddings(new_size)
        previous = config.patch_resize or {}
        config.patch_resize = {
            "from_patch_size": previous.get("from_patch_size", list(old_patch)),
            "method": method,
            "interpolation": interpolation,
            "antialias": antialias,
        }
        embeddings.patch_resize_options = {"method": "pi", "interpolation": interpolation, "antialias": antialias}
        return self

    def prune_intermediate_layers(self, indices=1):
        """timm's `prune_intermediate_layers`: drop the blocks after the last of `indices` (as `forward_intermediates`
        reads them), so the model computes only what those intermediates need; returns the block indices.

        The config follows (`num_hidden_layers`, and the backbone stages of those blocks), so the pruned model saves
        and reloads as it is. Unlike timm it keeps the final norm and the pooler: they are part of the saved model.
        """
        take, last = take_indices(len(self.encoder.layers), indices)
        self.encoder.layers = self.encoder.layers[: last + 1]
        self.config.num_hidden_layers = last + 1
        self.config.out_indices = sorted({i + 1 for i in take})
        return take


@dataclass
class HubViTImageClassifierOutput(ImageClassifierOutput):
    """`logits` plus, for DeiT-distilled models, the two heads' logits whose mean `logits` is."""

    cls_logits: torch.FloatTensor | None = None
    distillation_logits: torch.FloatTensor | None = None


class HubViTForImageClassification(HubViTPreTrainedModel):
    """ViT with a linear head on the pooled vector (and DeiT's second head on the distillation token).

    `num_labels=0` gives an identity head: `logits` are then the features. With a distillation token the two heads
    are averaged, as DeiT does at inference.
    """

    def __init__(self, config: HubViTConfig):
        super().__init__(config)
        if not config.pooling_kind.pools and config.num_labels > 0:
            raise ValueError("pooling='none' has no vector to classify; use HubViTModel or another pooling")
        self.num_labels = config.num_labels
        self.hubvit = HubViTModel(config)
        features = config.pooled_size
        self.pre_logits = None
        if config.representation_size is not None:
            self.pre_logits = nn.Sequential(nn.Linear(features, config.representation_size), nn.Tanh())
            features = config.representation_size
        self.classifier = nn.Linear(features, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.distillation_classifier = (
            nn.Linear(features, config.num_labels)
            if config.distillation_token and config.distillation_head and config.num_labels > 0
            else None
        )
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values=None,
        labels=None,
        interpolate_pos_encoding=None,
        num_output_tokens=None,
        patch_size=None,
        pixel_attention_mask=None,
        spatial_shapes=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        """Logits (and the loss for `labels`, chosen by transformers' `loss_function` from `problem_type`).

        `num_output_tokens` is passed to the body: with the number of tokens the head reads
        (`self.hubvit.pooler.num_tokens_read`), the last block skips the patch tokens for the same logits.
        """
        check_kwargs(kwargs, self)
        outputs = self.hubvit(
            pixel_values,
            num_output_tokens=num_output_tokens,
            patch_size=patch_size,
            pixel_attention_mask=pixel_attention_mask,
            spatial_shapes=spatial_shapes,
            **kwargs,
        )
        cls_logits = distillation_logits = None
        if self.distillation_classifier is not None:
            tokens = outputs.last_hidden_state
            cls_logits = self.classifier(tokens[:, 0])
            distillation_logits = self.distillation_classifier(tokens[:, 1])
            logits = (cls_logits + distillation_logits) / 2
        else:
            features = outputs.pooler_output
            if self.pre_logits is not None:
                features = self.pre_logits(features)
            logits = self.classifier(features)
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        return HubViTImageClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cls_logits=cls_logits,
            distillation_logits=distillation_logits,
        )

    def resize_position_embeddings(self, image_size):
        self.hubvit.resize_position_embeddings(image_size)
        return self

    def resize_patch_embeddings(
        self, patch_size, method="pi", interpolation="bicubic", antialias=True, image_size=None
    ):
        self.hubvit.resize_patch_embeddings(patch_size, method, interpolation, antialias, image_size)
        return self


class HubViTBackbone(BackboneMixin, HubViTBody, HubViTPreTrainedModel):
    """The ViT body as a transformers backbone (`AutoBackbone`), what Depth Anything, DPT, UperNet and Mask2Former
    load from a `backbone_config`: stages `stem` (the encoder input) and `stage1` ... `stageN` (each block's output),
    chosen by the config's `out_features` / `out_indices`, normed by the final norm (`apply_layernorm`) and shaped
    as (batch, D, rows, columns) maps without prefix tokens (`reshape_hidden_states`), as `Dinov2Backbone` does.

    Its weights have the body's names, so it loads from any hubvit folder (a classifier's head and the pooler are
    left out). It runs no block after the last one asked for unless hidden states or attentions are wanted.
    """

    _keys_to_ignore_on_load_unexpected = [
        r"^(hubvit\.)?pooler\.",
        r"^classifier\.",
        r"^distillation_classifier\.",
        r"^pre_logits\.",
    ]

    def __init__(self, config: HubViTConfig):
        super().__init__(config)
        if "__init__" not in vars(BackboneMixin):  # before 5.0 a backbone initialises its stages itself
            self._init_backbone(config)
        self.num_features = [config.hidden_size] * (config.num_hidden_layers + 1)
        self.build_body(config)
        self.post_init()

    def forward(
        self,
        pixel_values=None,
        output_hidden_states=None,
        output_attentions=None,
        return_dict=None,
        patch_size=None,
        pixel_attention_mask=None,
        spatial_shapes=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        """`BackboneOutput`: `feature_maps` for the chosen stages, `hidden_states` (every stage, before the norm)
        and `attentions` when asked for. Any input size whose sides divide by the patch (and any `patch_size`); for
        patch sequences (`spatial_shapes`), each stage's maps are a tuple of each image's map at its own grid."""
        check_kwargs(kwargs, self)
        config = self.config
        hidden = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        want_attentions = bool(config.output_attentions if output_attentions is None else output_attentions)
        return_dict = getattr(config, "return_dict", True) if return_dict is None else return_dict
        stages = list(self.stage_names)
        positions = [stages.index(name) for name in self.out_features]
        last_block = len(self.encoder.layers) - 1 if hidden or want_attentions else max(positions) - 1
        states, grid, attentions = self.run_blocks(
            pixel_values, last_block, patch_size, want_attentions, pixel_attention_mask, spatial_shapes
        )
        feature_maps = []
        for position in positions:
            state = self.final_norm(states[position]) if config.apply_layernorm else states[position]
            reshape = config.reshape_hidden_states
            feature_maps.append(self.to_feature_map(state, grid, spatial_shapes) if reshape else state)
        hidden_states = select_hidden_states(states, hidden) if hidden else None
        outputs = BackboneOutput(
            feature_maps=tuple(feature_maps),
            hidden_states=hidden_states,
            attentions=tuple(attentions) if want_attentions else None,
        )
        return outputs if return_dict else outputs.to_tuple()


class HubViTForSemanticSegmentation(HubViTPreTrainedModel):
    """A linear decoder on the patch tokens: one `nn.Linear` classifies each normed last-block token, giving logits on
    the patch grid (batch, num_labels, rows, columns) that the loss and the image processor upsample bilinearly to
    the pixels, as `SegformerImageProcessor.post_process_semantic_segmentation` does.

    The linear probe of DINOv2 (Oquab et al., 2023) and Segmenter's linear baseline (Strudel et al., 2021): the
    smallest head that shows what the encoder's tokens hold, cheap enough to train on a CPU, and one plain `nn.Linear`
    like the classifier (quantizable, LoRA-able). Pixels labelled `config.semantic_loss_ignore_index` (255 unless
    set, transformers' convention) do not count in the loss. The head is `decode_head` (transformers' name for
    segmentation heads), so a classifier's folder gives the body and never its image classifier as the head.

    With `config.decode_head_pixels` the same `nn.Linear` gives num_labels x patch x patch outputs per token, the
    logits of every pixel of its patch (SETR-style pixel shuffle, no upsampling): logits at the image's resolution,
    so strokes thinner than a patch can be told apart from their background at the patch sizes a CPU can afford.
    """

    _keys_to_ignore_on_load_unexpected = [r"^classifier\.", r"^distillation_classifier\.", r"^pre_logits\."]

    def __init__(self, config: HubViTConfig):
        super().__init__(config)
        if config.num_labels < 1:
            raise ValueError(f"num_labels={config.num_labels}: a segmentation head needs at least one class")
        self.num_labels = config.num_labels
        self.hubvit = HubViTModel(config)
        self.pixel_head = config.decode_head_pixels
        outputs = config.num_labels * (math.prod(config.patch_size_2d) if self.pixel_head else 1)
        self.decode_head = nn.Linear(config.hidden_size, outputs)
        self.post_init()

    @can_return_tuple
    def forward(self, pixel_values=None, labels=None, patch_size=None, **kwargs: Unpack[TransformersKwargs]):
        """Logits on the patch grid (on the pixels with `config.decode_head_pixels`), and with `labels` (batch,
        height, width) of class indices the pixel-wise cross-entropy of the logits upsampled to the labels' size."""
        check_kwargs(kwargs, self)
        body = self.hubvit
        if self.pixel_head and patch_size is not None and patch_pair(patch_size) != tuple(self.config.patch_size_2d):
            raise ValueError(
                f"patch_size={patch_size!r}: a decode_head_pixels head classifies the pixels of "
                f"{self.config.patch_size_2d} patches and runs only at that patch size"
            )
        outputs = body(pixel_values, patch_size=patch_size, **kwargs)
        height, width = pixel_values.shape[-2:]
        (ph, pw) = self.config.patch_size_2d if patch_size is None else patch_pair(patch_size)
        grid = (-(-height // ph), -(-width // pw))  # dynamic_img_pad pads to whole patches
        logits = body.to_feature_map(self.decode_head(outputs.last_hidden_state), grid)
        if self.pixel_head:  # (batch, labels * ph * pw, rows, columns) -> (batch, labels, rows * ph, columns * pw)
            batch, rows, columns = logits.shape[0], grid[0], grid[1]
            logits = logits.reshape(batch, self.num_labels, ph, pw, rows, columns).permute(0, 1, 4, 2, 5, 3)
            logits = logits.reshape(batch, self.num_labels, rows * ph, columns * pw)[..., :height, :width]
        loss = None
        if labels is not None:
            if labels.ndim != 3 or labels.shape[0] != logits.shape[0]:
                raise ValueError(
                    f"labels must be (batch, height, width) class indices for {logits.shape[0]} images, "
                    f"got shape {tuple(labels.shape)}"
                )
            upsampled = F.interpolate(logits, size=labels.shape[-2:], mode="bilinear", align_corners=False)
            ignore = self.config.semantic_loss_ignore_index
            loss = F.cross_entropy(upsampled.float(), labels.long(), ignore_index=ignore)
        return SemanticSegmenterOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


HubViTConfig.register_for_auto_class()
HubViTModel.register_for_auto_class("AutoModel")
HubViTForImageClassification.register_for_auto_class("AutoModelForImageClassification")
HubViTBackbone.register_for_auto_class("AutoBackbone")
HubViTForSemanticSegmentation.register_for_auto_class("AutoModelForSemanticSegmentation")

__all__ = [
    "HubViTModel",
    "HubViTForImageClassification",
    "HubViTBackbone",
    "HubViTForSemanticSegmentation",
    "HubViTPreTrainedModel",
]
