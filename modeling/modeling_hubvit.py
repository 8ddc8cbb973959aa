"""HubViT: the Vision Transformer of Dosovitskiy et al. (2021) for transformers.

Reads top to bottom in the order of the paper: patch embedding (a stride-P
convolution), prefix tokens ([CLS], distillation, registers), position
embeddings (resized on the fly to any grid), a pre-norm encoder, the final
norm, a pooler, and the classification head.

This file travels to the Hub next to every checkpoint: flat, relative imports
only, no I/O.
"""

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Optional, TypedDict

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    BackboneOutput,
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    SemanticSegmenterOutput,
)

from .configuration_hubvit import HubViTConfig, to_2tuple
from .patch_resize_hubvit import check_resize_options, patch_pair, resize_patch_kernel

# --- what the installed transformers offers ------------------------------------------------------------------------
# A checkpoint freezes this file, and its users run whatever transformers they have: every name below is looked up
# and, where a release lacks it, replaced by a local equivalent that computes the same numbers (4.46 to newest).

try:
    from typing import Unpack
except ImportError:  # Python 3.10; typing_extensions comes with torch
    from typing_extensions import Unpack

try:
    from transformers.backbone_utils import BackboneMixin  # 5.25
except ImportError:  # 4.46 to 5.24 (5.25 still has this path, with a deprecation warning)
    from transformers.utils.backbone_utils import BackboneMixin

try:
    from transformers import initialization as init  # 5.0: initialisers that skip weights loaded from a checkpoint
except ImportError:  # 4.x initialises only the weights a checkpoint lacks, so torch's own functions do the same job
    init = nn.init

try:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # 4.48
except ImportError:
    ALL_ATTENTION_FUNCTIONS = None

try:
    from transformers.modeling_layers import GradientCheckpointingLayer  # 4.52
except ImportError:

    class GradientCheckpointingLayer(nn.Module):
        """What transformers' layer does: `gradient_checkpointing_enable()` sets the flag and the function."""

        gradient_checkpointing = False

        def __call__(self, *args, **kwargs):
            if self.gradient_checkpointing and self.training:
                return self._gradient_checkpointing_func(functools.partial(super().__call__, **kwargs), *args)
            return super().__call__(*args, **kwargs)


try:
    from transformers.utils import TransformersKwargs  # 4.54
except ImportError:

    class TransformersKwargs(TypedDict, total=False):
        output_hidden_states: Optional[bool]
        output_attentions: Optional[bool]
        num_items_in_batch: Optional[torch.Tensor]


def wants_tuple(model, kwargs):
    """Pops `return_dict`; True when the caller (or the config) asked for a plain tuple."""
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(model.config, "return_dict", True)
    return not return_dict


try:
    from transformers.utils.generic import can_return_tuple  # 4.50
except ImportError:

    def can_return_tuple(forward):
        @functools.wraps(forward)
        def wrapper(self, *args, **kwargs):
            as_tuple = wants_tuple(self, kwargs)
            outputs = forward(self, *args, **kwargs)
            return outputs.to_tuple() if as_tuple else outputs

        return wrapper


try:
    from transformers.utils.output_capturing import capture_outputs  # 5.2
except ImportError:
    capture_outputs = None
try:
    from transformers.utils.output_capturing import selected_hidden_states as _selection_support  # noqa: F401

    SELECTS_HIDDEN_STATES = capture_outputs is not None
except ImportError:
    SELECTS_HIDDEN_STATES = False

MISSING = [
    feature
    for feature, present in (
        (
            "the attention-function registry (only eager and sdpa attention run; no flash, flex or paged attention)",
            ALL_ATTENTION_FUNCTIONS is not None,
        ),
    )
    if not present
]
if MISSING:
    warnings.warn(
        f"HubViT on transformers {transformers.__version__} lacks {'; '.join(MISSING)}: outputs are the same, "
        "upgrade transformers for the rest",
        stacklevel=2,
    )


def lecun_normal_(tensor):
    """LeCun normal (truncated at 2 std, as JAX's): `initialization.lecun_normal_` where the release has it."""
    if hasattr(init, "lecun_normal_"):
        return init.lecun_normal_(tensor)
    fan_in = nn.init._calculate_fan_in_and_fan_out(tensor)[0]
    return init.trunc_normal_(tensor, std=math.sqrt(1.0 / fan_in) / 0.87962566103423978)


def resize_position_grid(table, old_grid, new_grid, mode, antialias, align_corners):
    """Resize a (1, gh*gw, C) table laid out row-major over the patch grid to `new_grid`.

    Interpolates in float32 (as timm does). Every size takes the same path, so traced and exported graphs run at
    any grid; at the native grid each supported mode is the identity (tests check it bit for bit).
    """
    if torch.jit.is_tracing():
        return resize_position_grid_by_matrices(table, old_grid, new_grid, mode, antialias, align_corners)
    channels = table.shape[-1]
    grid = table.reshape(1, old_grid[0], old_grid[1], channels).permute(0, 3, 1, 2).float()
    if mode == "nearest":
        grid = F.interpolate(grid, size=tuple(new_grid), mode=mode)
    else:
        grid = F.interpolate(grid, size=tuple(new_grid), mode=mode, antialias=antialias, align_corners=align_corners)
    return grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], channels).to(table.dtype)


def interpolation_matrix(old, new, mode, antialias, align_corners):
    """(new, old) float32 matrix `M` with `resize(v) = M @ v` along one axis, as `F.interpolate` computes it on the CPU.

    `new` may be a traced or symbolic size: the weights are computed from it with elementwise operations, which every
    exporter and ONNX runtime implements alike, where `F.interpolate` becomes a `Resize` node whose cubic + antialias
    variant OpenVINO computes differently, and which TorchScript's ONNX exporter (optimum's) cannot export at all.
    """
    columns = torch.arange(old, dtype=torch.float32)
    rows = torch.arange(new, dtype=torch.float32)[:, None]
    if mode == "nearest":  # aten's nearest_idx: min(floor(i * old / new), old - 1) in float32
        scale = torch.tensor(float(old), dtype=torch.float32) / new
        index = torch.clamp(torch.floor(rows * scale), max=old - 1)
        return (index == columns).float()
    if align_corners:
        scale = torch.tensor(float(old - 1), dtype=torch.float32) / torch.clamp(torch.tensor(new - 1), min=1)
        scale = scale * (new > 1)
    else:
        scale = torch.tensor(float(old), dtype=torch.float32) / new
    cubic = mode == "bicubic"
    if antialias:  # PIL-style filter over a support widened by the scale when shrinking, weights normalised per row
        width = 2.0 if cubic else 1.0
        support = torch.where(scale >= 1.0, width * scale, torch.full_like(scale, width))
        inverse = torch.where(scale >= 1.0, 1.0 / scale, torch.ones_like(scale))
        center = scale * (rows + 0.5)
        first = torch.clamp(torch.floor(center - support + 0.5), min=0.0)  # = trunc once clamped at 0
        last = torch.clamp(torch.floor(center + support + 0.5), max=float(old))  # positive: = trunc
        x = ((columns - center + 0.5) * inverse).abs()
        if cubic:
            a = -0.5
            weight = torch.where(
                x < 1.0,
                ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
                torch.where(x < 2.0, (((x - 5.0) * x + 8.0) * x - 4.0) * a, torch.zeros_like(x)),
            )
        else:
            weight = torch.clamp(1.0 - x, min=0.0)
        weight = weight * ((columns >= first) & (columns < last)).float()
        total = weight.sum(dim=1, keepdim=True)
        return weight / torch.where(total == 0, torch.ones_like(total), total)
    source = scale * rows if align_corners else scale * (rows + 0.5) - 0.5
    if cubic:  # cubic convolution, A = -0.75, border indices clamped
        a = -0.75
        start = torch.floor(source)
        t = source - start
        taps = [(t + 1.0, 2), (t, 1), (1.0 - t, 1), (2.0 - t, 2)]
        matrix = 0.0
        for offset, (distance, piece) in zip((-1, 0, 1, 2), taps):
            if piece == 1:
                weight = ((a + 2.0) * distance - (a + 3.0)) * distance * distance + 1.0
            else:
                weight = ((a * distance - 5.0 * a) * distance + 8.0 * a) * distance - 4.0 * a
            index = torch.clamp(start + offset, 0, old - 1)
            matrix = matrix + weight * (index == columns).float()
        return matrix
    source = torch.clamp(source, min=0.0)
    low = torch.floor(source)
    fraction = torch.clamp(source - low, 0.0, 1.0)
    high = torch.clamp(low + 1, max=old - 1)
    return (1.0 - fraction) * (low == columns).float() + fraction * (high == columns).float()


def resize_position_grid_by_matrices(table, old_grid, new_grid, mode, antialias, align_corners):
    """The model's `resize_position_grid` as two matrix products (rows, then columns): the same numbers to float32
    rounding, computed by operations that onnxruntime and OpenVINO both implement as PyTorch does."""
    channels = table.shape[-1]
    rows = interpolation_matrix(old_grid[0], new_grid[0], mode, antialias, align_corners)
    columns = interpolation_matrix(old_grid[1], new_grid[1], mode, antialias, align_corners)
    grid = table.reshape(old_grid[0], old_grid[1] * channels).float()
    grid = torch.matmul(rows, grid).reshape(new_grid[0], old_grid[1], channels)  # only 2D products: OpenVINO's
    grid = grid.permute(1, 0, 2).reshape(old_grid[1], new_grid[0] * channels)  # CPU MatMul wants equal ranks
    grid = torch.matmul(columns, grid).reshape(new_grid[1], new_grid[0], channels).permute(1, 0, 2)
    return grid.reshape(1, new_grid[0] * new_grid[1], channels).to(table.dtype)


def resize_as_configured(config, table, old_grid, new_grid):
    """`resize_position_grid` with the interpolation the checkpoint's source uses (recorded in the config)."""
    return resize_position_grid(
        table,
        old_grid,
        new_grid,
        config.interpolation_mode,
        config.interpolation_antialias,
        config.interpolation_align_corners,
    )


def sincos_2d_position_table(grid, dim, temperature=10000.0, device=None, dtype=torch.float32):
    """big_vision's fixed table: [sin x, cos x, sin y, cos y] over the patch grid, shape (1, gh*gw, dim)."""
    quarter = dim // 4
    omega = torch.arange(quarter, device=device, dtype=torch.float32) / (quarter - 1)
    omega = 1.0 / temperature**omega
    y, x = torch.meshgrid(
        torch.arange(grid[0], device=device, dtype=torch.float32),
        torch.arange(grid[1], device=device, dtype=torch.float32),
        indexing="ij",
    )
    y = y.reshape(-1, 1) * omega
    x = x.reshape(-1, 1) * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)[None].to(dtype)


def drop_path(x, rate, training):
    """Stochastic depth (Huang et al., 2016): drop whole residual branches per sample."""
    if rate == 0.0 or not training:
        return x
    keep = 1.0 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask / keep


class HubViTEmbeddings(nn.Module):
    """Patch embedding, prefix tokens and position embeddings, for any grid of patches."""

    def __init__(self, config: HubViTConfig):
        super().__init__()
        self.config = config
        dim = config.hidden_size
        self.patch_size = config.patch_size_2d
        self.grid_size = config.grid_size
        self.patch_embedding = nn.Conv2d(
            config.num_channels, dim, kernel_size=self.patch_size, stride=self.patch_size, bias=config.patch_bias
        )
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.class_token else None
        self.distillation_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.distillation_token else None
        self.register_tokens = (
            nn.Parameter(torch.zeros(1, config.num_register_tokens, dim)) if config.num_register_tokens else None
        )
        self.num_prefix_tokens = config.num_prefix_tokens
        num_patches = self.grid_size[0] * self.grid_size[1]
        self.position_embedding = None
        self.position_embedding_rows = self.position_embedding_columns = None
        if config.position_embedding_type == "learned":
            rows = num_patches + (self.num_prefix_tokens if config.position_embedding_includes_prefix else 0)
            self.position_embedding = nn.Parameter(torch.zeros(1, rows, dim))
        elif config.position_embedding_type == "learned_2d":
            self.position_embedding_rows = nn.Parameter(torch.zeros(self.grid_size[0], dim // 2))
            self.position_embedding_columns = nn.Parameter(torch.zeros(self.grid_size[1], dim // 2))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        resize = getattr(config, "patch_resize", None) or {}
        self.patch_resize_options = {
            "method": "pi",
            "interpolation": resize.get("interpolation", "bicubic"),
            "antialias": resize.get("antialias", True),
        }

    def patch_kernel(self, patch_size):
        """The patch-embedding kernel for `patch_size` patches, resized from the stored one (`patch_resize_options`)
        and differentiable in it: FlexiViT serves and trains every patch size from one stored kernel."""
        return resize_patch_kernel(self.patch_embedding.weight, patch_size, **self.patch_resize_options)

    def embed_patches(self, pixel_values, patch_size=None):
        if patch_size is None or patch_pair(patch_size) == tuple(self.patch_size):
            return self.patch_embedding(pixel_values)
        patch_size = patch_pair(patch_size)
        return F.conv2d(pixel_values, self.patch_kernel(patch_size), self.patch_embedding.bias, stride=patch_size)

    def learned_table(self, grid):
        """The 1D table at `grid`: prefix rows (if any) untouched, the patch grid resized."""
        table = self.position_embedding
        prefix = table.shape[1] - self.grid_size[0] * self.grid_size[1]
        patches = resize_as_configured(self.config, table[:, prefix:], self.grid_size, grid)
        return torch.cat([table[:, :prefix], patches], dim=1)

    def learned_2d_table(self, grid):
        """Row and column tables resized along their own axis, then concatenated per patch: (1, gh*gw, D)."""
        rows = resize_as_configured(
            self.config, self.position_embedding_rows[None], (self.grid_size[0], 1), (grid[0], 1)
        )[0]
        cols = resize_as_configured(
            self.config, self.position_embedding_columns[None], (1, self.grid_size[1]), (1, grid[1])
        )[0]
        table = torch.cat([rows[:, None, :].expand(-1, grid[1], -1), cols[None, :, :].expand(grid[0], -1, -1)], dim=-1)
        return table.reshape(1, grid[0] * grid[1], -1)

    def prefix_tokens(self, batch_size):
        tokens = [t for t in (self.class_token, self.distillation_token, self.register_tokens) if t is not None]
        return [t.expand(batch_size, -1, -1) for t in tokens]

    def patch_position_table(self, grid):
        """(1, gh * gw, D) vectors the patches at `grid` get, or None for the kinds that add none to them
        (`relative_2d` biases the attention instead; `none`); a learned table's prefix rows are left out."""
        kind = self.config.position_embedding_type
        if kind == "learned":
            table = self.learned_table(grid)
            return table[:, table.shape[1] - grid[0] * grid[1] :]
        if kind == "learned_2d":
            return self.learned_2d_table(grid)
        if kind == "sincos_2d":
            return sincos_2d_position_table(grid, self.config.hidden_size)
        return None

    def forward(self, pixel_values, patch_size=None):
        patches = self.embed_patches(pixel_values, patch_size)
        grid = (patches.shape[-2], patches.shape[-1])
        patches = patches.flatten(2).transpose(1, 2)
        prefix = self.prefix_tokens(patches.shape[0])
        kind = self.config.position_embedding_type
        if kind == "learned" and self.config.position_embedding_includes_prefix:
            embeddings = torch.cat(prefix + [patches], dim=1) + self.learned_table(grid)
        else:
            if kind == "learned":
                patches = patches + self.learned_table(grid)
            elif kind == "learned_2d":
                patches = patches + self.learned_2d_table(grid)
            elif kind == "sincos_2d":
                patches = patches + sincos_2d_position_table(grid, patches.shape[-1], device=patches.device).to(
                    patches.dtype
                )
            embeddings = torch.cat(prefix + [patches], dim=1) if prefix else patches
        return self.dropout(embeddings), grid


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention written out, so its weights can be returned; inputs (B, H, N, d), output (B, N, H, d)."""
    weights = torch.matmul(query, key.transpose(-2, -1)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def sdpa_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """PyTorch's fused attention, for releases without the attention-function registry (as transformers calls it)."""
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False
    )
    return output.transpose(1, 2).contiguous(), None


def attention_function(config, output_attentions):
    """The configured attention backend; eager whenever weights are asked for, as no fused kernel returns them."""
    implementation = "eager" if output_attentions else (config._attn_implementation or "sdpa")
    if implementation == "eager":
        return eager_attention_forward
    if ALL_ATTENTION_FUNCTIONS is None:
        return sdpa_attention_forward
    if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):  # 5.0
        return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    return ALL_ATTENTION_FUNCTIONS.get(implementation, eager_attention_forward)


class HubViTAttention(nn.Module):
    """Multi-head self-attention with one fused qkv projection (rows ordered [q; k; v], each head-major).

    With `relative_2d` position embeddings it owns a learned per-head bias over (dy, dx) patch offsets, added to
    the logits; prefix tokens get no bias.
    """

    def __init__(self, config: HubViTConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.relative_position_bias = None
        if config.position_embedding_type == "relative_2d":
            gh, gw = config.grid_size
            self.relative_position_bias = nn.Parameter(torch.zeros(self.num_heads, 2 * gh - 1, 2 * gw - 1))

    def relative_bias_table(self, grid):
        """The (H, 2gh-1, 2gw-1) table of biases over (dy, dx) offsets, resized to a `grid` of patches."""
        gh, gw = self.config.grid_size
        table = self.relative_position_bias
        new = (2 * grid[0] - 1, 2 * grid[1] - 1)
        flat = table.reshape(self.num_heads, -1).t()[None]
        flat = resize_as_configured(self.config, flat, (2 * gh - 1, 2 * gw - 1), new)
        return flat[0].t().reshape(self.num_heads, *new)

    def relative_bias(self, grid, num_tokens):
        """(1, H, T, T) additive logits bias for a `grid` of patches after `T - gh*gw` prefix tokens."""
        table = self.relative_bias_table(grid)
        ys, xs = torch.meshgrid(
            torch.arange(grid[0], device=table.device), torch.arange(grid[1], device=table.device), indexing="ij"
        )
        ys, xs = ys.reshape(-1), xs.reshape(-1)
        bias = table[:, ys[:, None] - ys[None, :] + grid[0] - 1, xs[:, None] - xs[None, :] + grid[1] - 1]
        prefix = num_tokens - grid[0] * grid[1]
        return F.pad(bias, (prefix, 0, prefix, 0))[None]

    def forward(self, hidden_states, grid, num_queries=None, **kwargs):
        """Returns the attended tokens and the attention weights (None from fused kernels).

        `num_queries`: attend from the first tokens only (all tokens still give keys and values).
        """
        batch_size, num_tokens = hidden_states.shape[0], hidden_states.shape[1]
        qkv = self.qkv(hidden_states).reshape(batch_size, num_tokens, 3, self.num_heads, self.head_dim)
        query, key, value = (part.transpose(1, 2) for part in qkv.unbind(2))
        query = query[:, :, :num_queries]
        mask = None
        if self.relative_position_bias is not None:
            mask = self.relative_bias(grid, num_tokens)[:, :, :num_queries].to(query.dtype)
        attend = attention_function(self.config, kwargs.get("output_attentions", False))
        output, weights = attend(
            self,
            query,
            key,
            value,
            mask,
            scaling=self.scaling,
            dropout=self.config.attention_probs_dropout_prob if self.training else 0.0,
        )
        output = self.dropout(self.proj(output.reshape(batch_size, query.shape[2], -1)))
        return output, weights


class HubViTMLP(nn.Module):
    def __init__(self, config: HubViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states):
        return self.dropout(self.fc2(self.activation(self.fc1(hidden_states))))


class HubViTLayer(GradientCheckpointingLayer):
    """Encoder block: x + attention(norm(x)), then x + mlp(norm(x)), with optional layer scale and stochastic depth."""

    def __init__(self, config: HubViTConfig, drop_path_rate=0.0):
        super().__init__()
        dim = config.hidden_size
        self.norm1 = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.attention = HubViTAttention(config)
        self.norm2 = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.mlp = HubViTMLP(config)
        scale = config.layer_scale_init_value
        self.layer_scale1 = nn.Parameter(torch.full((dim,), float(scale))) if scale is not None else None
        self.layer_scale2 = nn.Parameter(torch.full((dim,), float(scale))) if scale is not None else None
        self.drop_path_rate = drop_path_rate

    def forward(self, hidden_states, grid, num_queries=None, **kwargs):
        """`num_queries`: update (and return) the first tokens only."""
        attended, _ = self.attention(self.norm1(hidden_states), grid, num_queries, **kwargs)
        if self.layer_scale1 is not None:
            attended = attended * self.layer_scale1
        hidden_states = hidden_states[:, :num_queries] + drop_path(attended, self.drop_path_rate, self.training)
        transformed = self.mlp(self.norm2(hidden_states))
        if self.layer_scale2 is not None:
            transformed = transformed * self.layer_scale2
        return hidden_states + drop_path(transformed, self.drop_path_rate, self.training)


class HubViTEncoder(nn.Module):
    def __init__(self, config: HubViTConfig):
        super().__init__()
        depth = config.num_hidden_layers
        rates = [config.drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.layers = nn.ModuleList([HubViTLayer(config, rate) for rate in rates])

    def forward(self, hidden_states, grid, num_output_tokens=None, **kwargs):
        """`num_output_tokens`: the last block updates (and returns) only the first tokens."""
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            hidden_states = layer(hidden_states, grid, num_output_tokens if index == last else None, **kwargs)
        return hidden_states


class HubViTMAPHead(nn.Module):
    """Multihead attention pooling (Lee et al., 2019) as in big_vision/SigLIP: a learned probe attends to all tokens,
    then a residual MLP; the probe's output is the pooled vector."""

    def __init__(self, config: HubViTConfig):
        super().__init__()
        dim = config.hidden_size
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = dim // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.probe = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.mlp = HubViTMLP(config)

    def forward(self, hidden_states):
        batch_size, num_tokens, dim = hidden_states.shape[0], hidden_states.shape[1], hidden_states.shape[2]
        query = self.q(self.probe).reshape(1, 1, self.num_heads, self.head_dim).transpose(1, 2)
        query = query.expand(batch_size, -1, -1, -1)
        kv = self.kv(hidden_states).reshape(batch_size, num_tokens, 2, self.num_heads, self.head_dim)
        key, value = kv.permute(2, 0, 3, 1, 4).unbind(0)
        attend = attention_function(self.config, False)
        output, _ = attend(self, query, key, value, None, scaling=self.scaling, dropout=0.0)
        output = self.proj(output.reshape(batch_size, 1, dim))
        output = output + self.mlp(self.norm(output))
        return output[:, 0]


class HubViTPooler(nn.Module):
    """Turns the token sequence into the one vector the classifier reads (no extra dense layer)."""

    def __init__(self, config: HubViTConfig):
        super().__init__()
        self.pooling = config.pooling
        self.distillation_token = config.distillation_token and config.distillation_head
        self.num_prefix_tokens = config.num_prefix_tokens
        self.fc_norm = nn.LayerNorm(config.hidden_size, eps=config.final_norm_eps) if config.fc_norm else None
        self.map_head = HubViTMAPHead(config) if config.pooling == "map" else None

    @property
    def num_tokens_read(self):
        """How many leading tokens the pooled vector depends on; None when it depends on all of them."""
        if self.pooling in ("cls", "first"):
            return 2 if self.distillation_token else 1
        return None

    def forward(self, hidden_states):
        if self.pooling == "none":
            return None
        if self.pooling == "map":
            return self.map_head(hidden_states)
        if self.pooling == "mean":
            pooled = hidden_states[:, self.num_prefix_tokens :].mean(dim=1)
            return self.fc_norm(pooled) if self.fc_norm is not None else pooled
        if self.pooling == "cls_mean":
            return torch.cat([hidden_states[:, 0], hidden_states[:, self.num_prefix_tokens :].mean(dim=1)], dim=-1)
        if self.distillation_token:
            return (hidden_states[:, 0] + hidden_states[:, 1]) / 2
        return hidden_states[:, 0]


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
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, HubViTEmbeddings):
            for table in (module.position_embedding, module.position_embedding_rows, module.position_embedding_columns):
                if table is not None:
                    init.normal_(table, std=std)
            if module.class_token is not None:
                init.zeros_(module.class_token)
            for token in (module.distillation_token, module.register_tokens):
                if token is not None:
                    init.normal_(token, std=std)
        elif isinstance(module, HubViTAttention) and module.relative_position_bias is not None:
            init.zeros_(module.relative_position_bias)
        elif isinstance(module, HubViTLayer) and module.layer_scale1 is not None:
            init.constant_(module.layer_scale1, self.config.layer_scale_init_value)
            init.constant_(module.layer_scale2, self.config.layer_scale_init_value)
        elif isinstance(module, HubViTMAPHead):
            init.xavier_uniform_(module.probe.view(1, -1))


def check_pixel_values(pixel_values, config, patch_size=None):
    """Clear errors for inputs no ViT can take; returns them padded when `dynamic_img_pad` is set.

    Every test here reads shapes and dtypes only, which tracing and `torch.export` resolve statically.
    """
    if not isinstance(pixel_values, torch.Tensor) or pixel_values.ndim != 4:
        shape = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else type(pixel_values).__name__
        raise ValueError(f"pixel_values must be a (batch, channels, height, width) tensor, got {shape}")
    if not pixel_values.dtype.is_floating_point:
        raise ValueError(
            f"pixel_values must be floating point, got {pixel_values.dtype}: run the image processor "
            "(it scales and normalises the pixels) instead of passing raw image values"
        )
    batch_size, channels, height, width = pixel_values.shape
    shape = tuple(pixel_values.shape)
    if batch_size == 0:
        raise ValueError(f"pixel_values holds no image: shape {shape} has batch size 0")
    if channels != config.num_channels:
        raise ValueError(f"pixel_values has {channels} channels, the model expects num_channels={config.num_channels}")
    ph, pw = config.patch_size_2d if patch_size is None else patch_pair(patch_size)
    if height < ph or width < pw:
        raise ValueError(f"pixel_values of shape {shape} is smaller than one patch of {ph}x{pw} pixels")
    if height % ph or width % pw:
        if config.dynamic_img_pad:
            return F.pad(pixel_values, (0, (pw - width % pw) % pw, 0, (ph - height % ph) % ph))
        raise ValueError(
            f"Input height={height} and width={width} must be divisible by patch_size=({ph}, {pw}); "
            "resize the image or set dynamic_img_pad=True"
        )
    return pixel_values


def record_outputs(forward):
    """Output capturing for every release: transformers' `capture_outputs` where it exists, else forward hooks on the
    blocks and attentions, with the same results. `output_hidden_states` may select entries by index (negative ones
    count from the end); the others are None, as transformers 5's selection gives them."""
    captured = capture_outputs(tie_last_hidden_states=False)(forward) if capture_outputs is not None else None

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        hidden = kwargs.get("output_hidden_states", getattr(self.config, "output_hidden_states", False))
        selection = None if isinstance(hidden, bool) or hidden is None else hidden
        if captured is not None and (SELECTS_HIDDEN_STATES or selection is None):
            return captured(self, *args, **kwargs)
        if selection is not None:
            kwargs["output_hidden_states"] = True
        if captured is not None:
            as_tuple = wants_tuple(self, kwargs)
            outputs = captured(self, *args, **kwargs, return_dict=True)
        else:
            outputs, as_tuple = record_with_hooks(self, forward, args, kwargs)
        if selection is not None:
            count = len(outputs.hidden_states)
            chosen = [selection] if isinstance(selection, int) else list(selection)
            keep = {i % count for i in chosen if -count <= i < count}
            outputs["hidden_states"] = tuple(h if i in keep else None for i, h in enumerate(outputs.hidden_states))
        return outputs.to_tuple() if as_tuple else outputs

    return wrapper


def record_with_hooks(model, forward, args, kwargs):
    """The encoder input and every block's output (`hidden_states`), every attention's weights (`attentions`)."""
    as_tuple = wants_tuple(model, kwargs)
    config = model.config
    want_hidden = bool(kwargs.get("output_hidden_states", getattr(config, "output_hidden_states", False)))
    want_attentions = bool(kwargs.get("output_attentions", getattr(config, "output_attentions", False)))
    hidden, attentions, handles = [], [], []
    layers = [module for module in model.modules() if isinstance(module, HubViTLayer)]
    if want_hidden:
        handles.append(layers[0].register_forward_pre_hook(lambda module, inputs: hidden.append(inputs[0])))
        handles += [layer.register_forward_hook(lambda module, inputs, out: hidden.append(out)) for layer in layers]
    if want_attentions:
        handles += [
            layer.attention.register_forward_hook(lambda module, inputs, out: attentions.append(out[1]))
            for layer in layers
        ]
    try:
        outputs = forward(model, *args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if want_hidden:
        outputs["hidden_states"] = tuple(hidden)
    if want_attentions:
        outputs["attentions"] = tuple(attentions)
    return outputs, as_tuple


def check_kwargs(kwargs, model):
    """A misspelt keyword is an error, as it is for any Python function; transformers' own keywords pass through."""
    unknown = sorted(set(kwargs) - set(TransformersKwargs.__annotations__))
    if unknown:
        raise TypeError(f"{type(model).__name__}.forward() got unexpected keyword arguments {unknown}")


def take_indices(num_blocks, indices):
    """timm's `feature_take_indices`: which blocks `indices` names (None: all, an int n: the last n, a list: those,
    negative ones counted from the end), and the last of them."""
    if indices is None:
        indices = num_blocks
    if isinstance(indices, int) and not isinstance(indices, bool):
        if not 0 < indices <= num_blocks:
            raise ValueError(f"indices={indices} asks for the last {indices} blocks; expected 1 to {num_blocks}")
        take = list(range(num_blocks - indices, num_blocks))
    else:
        if isinstance(indices, str) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
            raise ValueError(f"indices must be None, an int or a list of ints, got {indices!r}")
        take = [num_blocks + i if i < 0 else i for i in indices]
        bad = [i for i, t in zip(indices, take) if not 0 <= t < num_blocks]
        if bad or not take:
            raise ValueError(
                f"indices={list(indices)} names no block or blocks outside this {num_blocks}-block model ({bad}); "
                f"expected block indices 0 to {num_blocks - 1} (or -{num_blocks} to -1)"
            )
    return take, max(take)


class HubViTDenseFeatures:
    """Per-block token maps for dense heads, on any module with the body's `embeddings`, `pre_norm`, `encoder` and
    `norm` (`HubViTModel`, `HubViTBackbone`)."""

    def run_blocks(self, pixel_values, last_block, patch_size=None, output_attentions=False):
        """The encoder input and the outputs of blocks 0 ... `last_block` (before the final norm), the patch grid,
        and each run block's attention weights when asked for."""
        pixel_values = check_pixel_values(pixel_values, self.config, patch_size)
        pixel_values = pixel_values.to(self.embeddings.patch_embedding.weight.dtype)
        hidden_states, grid = self.embeddings(pixel_values, patch_size)
        if self.pre_norm is not None:
            hidden_states = self.pre_norm(hidden_states)
        states, attentions, handles = [hidden_states], [], []
        layers = self.encoder.layers[: last_block + 1]
        if output_attentions:
            handles = [
                layer.attention.register_forward_hook(lambda module, inputs, out: attentions.append(out[1]))
                for layer in layers
            ]
        try:
            for layer in layers:
                hidden_states = layer(hidden_states, grid, None, output_attentions=output_attentions)
                states.append(hidden_states)
        finally:
            for handle in handles:
                handle.remove()
        return states, grid, attentions

    def final_norm(self, hidden_states):
        """The final norm on tokens; models that norm after pooling (`fc_norm`) have none, as in timm."""
        return hidden_states if self.norm is None else self.norm(hidden_states)

    def to_feature_map(self, hidden_states, grid):
        """(batch, tokens, D) -> (batch, D, rows, columns): prefix tokens dropped, patches in row-major order."""
        patches = hidden_states[:, self.config.num_prefix_tokens :]
        return patches.reshape(patches.shape[0], grid[0], grid[1], -1).permute(0, 3, 1, 2).contiguous()

    def forward_intermediates(
        self,
        pixel_values,
        indices=None,
        return_prefix_tokens=False,
        norm=False,
        stop_early=False,
        output_fmt="NCHW",
        intermediates_only=False,
        output_dict=False,
        *,
        patch_size=None,
    ):
        """timm's `VisionTransformer.forward_intermediates`, same arguments and results, so timm-style dense code
        (detection and segmentation necks, feature probes) runs on a hubvit model unchanged.

        `indices` are block indices (None: every block, an int n: the last n); intermediates come in block order,
        before the final norm unless `norm`; `output_fmt` "NCHW" gives (batch, D, rows, columns) without the
        prefix tokens (with `return_prefix_tokens`, (map, prefix tokens) pairs), "NLC" the patch tokens. Returns
        (final tokens after the norm, intermediates), the intermediates alone, or timm's dict (`output_dict`).
        `stop_early` runs no block after the last one asked for (the final tokens are then that block's).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r} is not supported; expected 'NCHW' or 'NLC'")
        take, last = take_indices(len(self.encoder.layers), indices)
        run_to = last if stop_early else len(self.encoder.layers) - 1
        states, grid, _ = self.run_blocks(pixel_values, run_to, patch_size)
        chosen = [self.final_norm(states[i + 1]) if norm else states[i + 1] for i in range(run_to + 1) if i in take]
        prefix_count = self.config.num_prefix_tokens
        prefix = [state[:, :prefix_count] for state in chosen] if prefix_count else None
        if output_fmt == "NCHW":
            chosen = [self.to_feature_map(state, grid) for state in chosen]
        else:
            chosen = [state[:, prefix_count:] for state in chosen]
        if output_dict:
            result = {"image_intermediates": chosen}
            if prefix is not None and return_prefix_tokens:
                result["image_intermediates_prefix"] = prefix
            if not intermediates_only:
                result["image_features"] = self.final_norm(states[-1])
            return result
        if return_prefix_tokens and prefix is not None:
            chosen = list(zip(chosen, prefix))
        if intermediates_only:
            return chosen
        return self.final_norm(states[-1]), chosen


class HubViTModel(HubViTDenseFeatures, HubViTPreTrainedModel):
    """The ViT body: `last_hidden_state` after the final norm and `pooler_output`, the vector the classifier reads.

    `hidden_states` holds the encoder input (after `pre_norm`) and every block's output, before the final norm;
    like `attentions`, they are recorded by transformers' output capturing (`_can_record_outputs`), so
    `output_hidden_states=[0, 2]` selects layers.
    """

    def __init__(self, config: HubViTConfig):
        super().__init__(config)
        self.embeddings = HubViTEmbeddings(config)
        self.pre_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_norm else None
        self.encoder = HubViTEncoder(config)
        self.norm = None if config.fc_norm else nn.LayerNorm(config.hidden_size, eps=config.final_norm_eps)
        self.pooler = HubViTPooler(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.patch_embedding

    @record_outputs
    def forward(
        self,
        pixel_values=None,
        interpolate_pos_encoding=None,
        num_output_tokens=None,
        patch_size=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        """`interpolate_pos_encoding` is accepted for transformers compatibility: every input size is resized.

        `num_output_tokens` runs the last block for the first tokens only (keys and values still come from every
        token), so `last_hidden_state` holds just those: what a classifier reading the prefix tokens needs, in the
        spirit of transformers' `logits_to_keep`. The default computes every token.

        `patch_size` cuts the image into patches of that size with the stored kernel resized on the fly
        (`resize_patch_embeddings` explains the resize; gradients flow into the stored kernel), as FlexiViT trains.
        """
        check_kwargs(kwargs, self)
        pixel_values = check_pixel_values(pixel_values, self.config, patch_size)
        pixel_values = pixel_values.to(self.embeddings.patch_embedding.weight.dtype)
        hidden_states, grid = self.embeddings(pixel_values, patch_size)
        if self.pre_norm is not None:
            hidden_states = self.pre_norm(hidden_states)
        hidden_states = self.encoder(hidden_states, grid, num_output_tokens, **kwargs)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=self.pooler(hidden_states))

    @torch.no_grad()
    def resize_position_embeddings(self, image_size):
        """Resize the position tables for a new native resolution (high-resolution fine-tuning, as in the paper)."""
        config = self.config
        ph, pw = config.patch_size_2d
        new_size = to_2tuple(image_size, "image_size")
        if new_size[0] % ph or new_size[1] % pw:
            raise ValueError(f"image_size={image_size!r} is not divisible by patch_size={config.patch_size!r}")
        new_grid = (new_size[0] // ph, new_size[1] // pw)
        embeddings = self.embeddings
        if embeddings.position_embedding is not None:
            embeddings.position_embedding = nn.Parameter(embeddings.learned_table(new_grid).detach().clone())
        if embeddings.position_embedding_rows is not None:
            table = embeddings.learned_2d_table(new_grid).reshape(new_grid[0], new_grid[1], -1)
            half = table.shape[-1] // 2
            embeddings.position_embedding_rows = nn.Parameter(table[:, 0, :half].clone())
            embeddings.position_embedding_columns = nn.Parameter(table[0, :, half:].clone())
        for layer in self.encoder.layers:
            attention = layer.attention
            if attention.relative_position_bias is not None:
                table = attention.relative_bias_table(new_grid)
                attention.relative_position_bias = nn.Parameter(table.detach().clone())
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
        previous = getattr(config, "patch_resize", None) or {}
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
        if config.pooling == "none" and config.num_labels > 0:
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
        **kwargs: Unpack[TransformersKwargs],
    ):
        """Logits (and the loss for `labels`, chosen by transformers' `loss_function` from `problem_type`).

        `num_output_tokens` is passed to the body: with the number of tokens the head reads
        (`self.hubvit.pooler.num_tokens_read`), the last block skips the patch tokens for the same logits.
        """
        check_kwargs(kwargs, self)
        outputs = self.hubvit(pixel_values, num_output_tokens=num_output_tokens, patch_size=patch_size, **kwargs)
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


class HubViTBackbone(BackboneMixin, HubViTDenseFeatures, HubViTPreTrainedModel):
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
        self.embeddings = HubViTEmbeddings(config)
        self.pre_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_norm else None
        self.encoder = HubViTEncoder(config)
        self.norm = None if config.fc_norm else nn.LayerNorm(config.hidden_size, eps=config.final_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.patch_embedding

    def forward(
        self,
        pixel_values=None,
        output_hidden_states=None,
        output_attentions=None,
        return_dict=None,
        patch_size=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        """`BackboneOutput`: `feature_maps` for the chosen stages, `hidden_states` (every stage, before the norm)
        and `attentions` when asked for. Any input size whose sides divide by the patch (and any `patch_size`)."""
        check_kwargs(kwargs, self)
        config = self.config
        hidden = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        want_attentions = bool(config.output_attentions if output_attentions is None else output_attentions)
        return_dict = getattr(config, "return_dict", True) if return_dict is None else return_dict
        stages = list(self.stage_names)
        positions = [stages.index(name) for name in self.out_features]
        last_block = len(self.encoder.layers) - 1 if hidden or want_attentions else max(positions) - 1
        states, grid, attentions = self.run_blocks(pixel_values, last_block, patch_size, want_attentions)
        feature_maps = []
        for position in positions:
            state = self.final_norm(states[position]) if config.apply_layernorm else states[position]
            feature_maps.append(self.to_feature_map(state, grid) if config.reshape_hidden_states else state)
        hidden_states = None
        if hidden:
            hidden_states = tuple(states)
            if not isinstance(hidden, bool):  # transformers 5's selection by index: the others are None
                chosen = [hidden] if isinstance(hidden, int) else list(hidden)
                keep = {i % len(states) for i in chosen if -len(states) <= i < len(states)}
                hidden_states = tuple(h if i in keep else None for i, h in enumerate(states))
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
        self.pixel_head = bool(getattr(config, "decode_head_pixels", False))
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
            ignore = getattr(self.config, "semantic_loss_ignore_index", 255)
            loss = F.cross_entropy(upsampled.float(), labels.long(), ignore_index=ignore)
        return SemanticSegmenterOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


def register_with_optimum():
    """Under `optimum-cli export onnx --trust-remote-code` (optimum's exporter already imported, nothing imported
    here otherwise), tell optimum's task manager how to export hubvit: as its ViT, inputs and outputs alike."""
    import sys

    if "optimum.exporters.tasks" not in sys.modules:
        return
    try:
        from optimum.exporters.onnx.model_configs import ViTOnnxConfig
        from optimum.exporters.tasks import TasksManager
    except ImportError:
        return

    @TasksManager.create_register("onnx", overwrite_existing=True)(
        "hubvit", "feature-extraction", "image-classification"
    )
    class HubViTOnnxConfig(ViTOnnxConfig):
        DEFAULT_ONNX_OPSET = 18


register_with_optimum()
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
