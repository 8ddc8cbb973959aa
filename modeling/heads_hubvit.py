"""What turns the encoder's tokens into one vector: the poolers ([CLS], mean, MAP, first token, [CLS] + mean) and
multihead attention pooling as big_vision and SigLIP build it.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import torch
from torch import nn

from .layers_hubvit import (
    HubViTMLP,
    attention_function,
    linear_parameters,
    make_norm,
    norm_parameters,
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
        if config.map_num_heads is not None:
            self.num_heads, self.head_dim = config.map_num_heads, dim // config.map_num_heads
            self.scaling = self.head_dim**-0.5
        self.probe = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = make_norm(config)
        self.mlp = HubViTMLP(config, inner_norm=False, width=config.map_intermediate_size)

    @classmethod
    def parameters_of(cls, config):
        d = config.hidden_size
        attention = d + linear_parameters(d, d) + linear_parameters(d, 2 * d) + linear_parameters(d, d)
        return (
            attention
            + norm_parameters(config)
            + sum(
                count
                for _, count in HubViTMLP.parameter_parts(config, inner_norm=False, width=config.map_intermediate_size)
            )
        )

    @classmethod
    def macs(cls, config, tokens):
        d = config.hidden_size
        return (
            d * d
            + tokens * 2 * d * d
            + 2 * tokens * d
            + d * d
            + HubViTMLP.macs(config, 1, config.map_intermediate_size)
        )

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
    def parameters_of(cls, config):
        d, width = config.hidden_size, config.neck_size
        return d * width + 9 * width * width + 4 * width

    @classmethod
    def macs(cls, config, patches):
        return patches * config.neck_size * (config.hidden_size + 9 * config.neck_size)

    def forward(self, feature_map):
        """(B, D, rows, columns) -> (B, neck_size, rows, columns)."""
        mapped = self.norm1(self.reduce(feature_map).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.norm2(self.mix(mapped).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class HubViTPooler(nn.Module):
    """Turns the token sequence into the one vector the classifier reads (no extra dense layer)."""

    def __init__(self, config):
        super().__init__()
        self.pooling = config.pooling
        self.distillation_token = config.distillation_token and config.distillation_head
        self.num_prefix_tokens = config.num_prefix_tokens
        self.fc_norm = make_norm(config, eps=config.final_norm_eps) if config.fc_norm else None
        self.map_head = HubViTMAPHead(config) if config.pooling == "map" else None
        self.neck = HubViTNeck(config) if config.neck_size is not None else None

    @property
    def num_tokens_read(self):
        """How many leading tokens the pooled vector depends on; None when it depends on all of them."""
        if self.pooling in ("cls", "first"):
            return 2 if self.distillation_token else 1
        return None

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
        if self.pooling == "none":
            return None
        if self.neck is not None:
            patches = hidden_states[:, self.num_prefix_tokens :]
            feature_map = patches.reshape(patches.shape[0], grid[0], grid[1], -1).permute(0, 3, 1, 2)
            return self.neck(feature_map).mean(dim=(-2, -1))
        if self.pooling == "map":
            return self.map_head(hidden_states, attention_mask)
        if self.pooling == "cls_mean":
            return torch.cat([hidden_states[:, 0], self.patch_mean(hidden_states, attention_mask)], dim=-1)
        if self.pooling == "mean":
            pooled = self.patch_mean(hidden_states, attention_mask)
        elif self.distillation_token:
            pooled = (hidden_states[:, 0] + hidden_states[:, 1]) / 2
        else:
            pooled = hidden_states[:, 0]
        return self.fc_norm(pooled) if self.fc_norm is not None else pooled
