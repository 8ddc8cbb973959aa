"""What turns the encoder's tokens into one vector: the poolers ([CLS], mean, MAP, first token, [CLS] + mean) and
multihead attention pooling as big_vision and SigLIP build it.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import torch
from torch import nn

from .layers_hubvit import (
    HubViTMLP,
    attention_function,
    make_norm,
    split_into_heads,
)


class HubViTMAPHead(nn.Module):
    """Multihead attention pooling (Lee et al., 2019) as in big_vision/SigLIP: a learned probe attends to all tokens,
    then a residual MLP; the probe's output is the pooled vector. Its heads and MLP width are the blocks' unless
    `map_num_heads` / `map_intermediate_size` say otherwise (Perception Encoder)."""

    def __init__(self, config):
        super().__init__()
        dim = config.hidden_size
        split_into_heads(self, config)
        self.num_heads, self.head_dim = config.map_heads, dim // config.map_heads
        self.scaling = self.head_dim**-0.5
        self.probe = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = make_norm(config)
        self.mlp = HubViTMLP(config, inner_norm=False, width=config.map_width)

    def forward(self, hidden_states, attention_mask=None):
        """`attention_mask`: (B, 1, 1, N) additive, keeping the probe from padding tokens."""
        batch_size, num_tokens, dim = hidden_states.shape[0], hidden_states.shape[1], hidden_states.shape[2]
        query = self.q(self.probe).reshape(1, 1, self.num_heads, self.head_dim).transpose(1, 2)
        query = query.expand(batch_size, -1, -1, -1)
        kv = self.kv(hidden_states).reshape(batch_size, num_tokens, 2, self.num_heads, self.head_dim)
        key, value = kv.permute(2, 0, 3, 1, 4).unbind(0)
        attend = attention_function(self.config, False)
        output, _ = attend(self, query, key, value, attention_mask, scaling=self.scaling, dropout=0.0)
        output = self.proj(output.reshape(batch_size, 1, dim))
        output = output + self.mlp(self.norm(output))
        return output[:, 0]


class HubViTNeck(nn.Module):
    """Segment Anything's neck on the patch map: a 1x1 convolution to `neck_size` channels, a norm over the channels,
    a 3x3 convolution, a norm over the channels; no biases (timm's `vision_transformer_sam` `neck`)."""

    def __init__(self, config):
        super().__init__()
        width = config.neck_size
        self.reduce = nn.Conv2d(config.hidden_size, width, kernel_size=1, bias=False)
        self.norm1 = nn.LayerNorm(width, eps=config.final_norm_eps)
        self.mix = nn.Conv2d(width, width, kernel_size=3, padding=1, bias=False)
        self.norm2 = nn.LayerNorm(width, eps=config.final_norm_eps)

    @classmethod
    def check(cls, config):
        """The neck's map is pooled by its mean, with no norm after it."""
        neck = config.neck_size
        if neck is not None and (neck <= 0 or config.pooling_kind is not MeanPooling or config.fc_norm):
            raise ValueError(
                f"neck_size={neck!r} with pooling={config.pooling!r}, fc_norm={config.fc_norm}: the neck's map is "
                "pooled by its mean; expected a positive neck_size, pooling='mean' and fc_norm=False"
            )

    def forward(self, feature_map):
        """(B, D, rows, columns) -> (B, neck_size, rows, columns)."""
        mapped = self.norm1(self.reduce(feature_map).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.norm2(self.mix(mapped).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


POOLING_KINDS = {}


class PoolingKind:
    """The base of every pooling kind (`config.pooling` names one): how the pooler turns the tokens into one vector,
    and the facts the config, the converters and `hubvit info` ask instead of comparing names. A subclass with a
    `name` enters `POOLING_KINDS` by being defined, so a new pooling is one class here."""

    name = None
    description = ""
    pools = True  # gives a vector (False: `pooler_output` is None, nothing to classify)
    needs_class_token = False
    reads_distillation_token = False  # averages [CLS] and DeiT's distillation token where the two heads are kept
    attention_pool = False  # a learned probe attends to the tokens (`HubViTMAPHead`)
    takes_fc_norm = False  # `fc_norm` may norm its pooled vector
    width_factor = 1  # `pooler_output` is this many times `hidden_size` wide
    own_fields = ()  # config fields only this kind reads: set beside another kind, they are refused

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name is not None:
            POOLING_KINDS[cls.name] = cls

    @classmethod
    def tokens_read(cls, pooler):
        """How many leading tokens the pooled vector depends on; None when it depends on all of them."""
        return None

    @classmethod
    def pool(cls, pooler, hidden_states, attention_mask):
        raise NotImplementedError


class ClassTokenPooling(PoolingKind):
    name = "cls"
    description = "the [CLS] token (the paper); with DeiT's two heads, [CLS] and distillation averaged"
    needs_class_token = reads_distillation_token = takes_fc_norm = True

    @classmethod
    def tokens_read(cls, pooler):
        return 2 if pooler.distillation_token else 1

    @classmethod
    def pool(cls, pooler, hidden_states, attention_mask):
        if pooler.distillation_token:
            return (hidden_states[:, 0] + hidden_states[:, 1]) / 2
        return hidden_states[:, 0]


class FirstTokenPooling(PoolingKind):
    name = "first"
    description = "the first token, without a class token (big_vision `0`)"
    takes_fc_norm = True

    @classmethod
    def tokens_read(cls, pooler):
        return 1

    @classmethod
    def pool(cls, pooler, hidden_states, attention_mask):
        return hidden_states[:, 0]


class MeanPooling(PoolingKind):
    name = "mean"
    description = "the mean of the patch tokens (big_vision `gap`, timm `avg`)"
    takes_fc_norm = True

    @classmethod
    def pool(cls, pooler, hidden_states, attention_mask):
        return pooler.patch_mean(hidden_states, attention_mask)


class AttentionPooling(PoolingKind):
    name = "map"
    description = "multihead attention pooling by a learned probe (SigLIP, big_vision `map`)"
    attention_pool = True
    own_fields = ("map_num_heads", "map_intermediate_size")

    @classmethod
    def pool(cls, pooler, hidden_states, attention_mask):
        return pooler.map_head(hidden_states, attention_mask)


class ClassTokenAndMeanPooling(PoolingKind):
    name = "cls_mean"
    description = "[CLS] beside the mean of the patch tokens (transformers' `Dinov2ForImageClassification`)"
    needs_class_token = True
    width_factor = 2

    @classmethod
    def pool(cls, pooler, hidden_states, attention_mask):
        return torch.cat([hidden_states[:, 0], pooler.patch_mean(hidden_states, attention_mask)], dim=-1)


class NoPooling(PoolingKind):
    name = "none"
    description = "no pooled vector"
    pools = False


class HubViTPooler(nn.Module):
    """Turns the token sequence into the one vector the classifier reads (no extra dense layer), by the configured
    pooling kind (`config.pooling_kind`), then `fc_norm` where set; with SAM's neck, the mean of the neck's map."""

    def __init__(self, config):
        super().__init__()
        self.kind = config.pooling_kind
        self.distillation_token = config.distillation_token and config.distillation_head
        self.num_prefix_tokens = config.num_prefix_tokens
        self.fc_norm = make_norm(config, eps=config.final_norm_eps) if config.fc_norm else None
        self.map_head = HubViTMAPHead(config) if self.kind.attention_pool else None
        self.neck = HubViTNeck(config) if config.neck_size is not None else None

    @property
    def num_tokens_read(self):
        """How many leading tokens the pooled vector depends on; None when it depends on all of them."""
        return self.kind.tokens_read(self)

    def patch_mean(self, hidden_states, attention_mask=None):
        """The mean of the patch tokens; with `attention_mask`, of each image's own patches only."""
        patches = hidden_states[:, self.num_prefix_tokens :]
        if attention_mask is None:
            return patches.mean(dim=1)
        weights = (attention_mask[:, 0, 0, self.num_prefix_tokens :] == 0).to(patches.dtype)[..., None]
        return (patches * weights).sum(dim=1) / weights.sum(dim=1)

    def forward(self, hidden_states, attention_mask=None, grid=None):
        """`attention_mask` (B, 1, 1, N), additive, for a batch of patch sequences: padding takes no part in the
        pooled vector. With a neck, the mean of its map over the `grid` of patches."""
        if not self.kind.pools:
            return None
        if self.neck is not None:
            patches = hidden_states[:, self.num_prefix_tokens :]
            feature_map = patches.reshape(patches.shape[0], grid[0], grid[1], -1).permute(0, 3, 1, 2)
            return self.neck(feature_map).mean(dim=(-2, -1))
        pooled = self.kind.pool(self, hidden_states, attention_mask)
        return self.fc_norm(pooled) if self.fc_norm is not None else pooled
