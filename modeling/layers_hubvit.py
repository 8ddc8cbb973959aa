"""The encoder's parts, each chosen by a config field: norm kinds (`norm_type`), MLP kinds (`mlp_type`), the
attention layer (fused or separate q/k/v projections, per-projection biases, q/k norm), the pre-norm encoder block
and the encoder's one loop over the blocks.

No part keeps a formula for what it costs: `hubvit info` counts the model itself, built on the meta device.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from .compat_hubvit import ALL_ATTENTION_FUNCTIONS, GradientCheckpointingLayer
from .patch_resize_hubvit import patch_pair, resize_patch_kernel
from .windows_hubvit import block_window, partition, unpartition, unpartition_weights

# --- norms ---------------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang and Sennrich, 2019): x / rms(x) * weight, no centring and no bias (AIMv2), in
    float32 whatever the input's precision."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * hidden_states).to(dtype)


@dataclass(frozen=True)
class NormKind:
    make: type  # (dim, eps) -> module
    parameters_per_channel: int
    description: str


NORM_KINDS = {
    "layer_norm": NormKind(nn.LayerNorm, 2, "LayerNorm with weight and bias (the paper, timm, transformers)"),
    "rms_norm": NormKind(RMSNorm, 1, "RMSNorm with a weight only (AIMv2)"),
}


NORM_MODULES = tuple(kind.make for kind in NORM_KINDS.values())
"""The module classes of every norm kind: what weight initialisation recognises as a norm (weight 1, bias 0)."""


def make_norm(config, dim=None, eps=None):
    """The configured norm over `dim` channels (default the width) with `eps` (default `layer_norm_eps`)."""
    kind = config.norm_kind
    return kind.make(config.hidden_size if dim is None else dim, eps=config.layer_norm_eps if eps is None else eps)


NORM_PLACEMENTS = {}


class NormPlacement:
    """Where each block's norms sit (`norm_placement`); a subclass with a `name` enters `NORM_PLACEMENTS`."""

    name = None
    description = ""
    norms_branch_output = False  # the norm reads the sub-layer's output (True) or its input (False)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name is not None:
            NORM_PLACEMENTS[cls.name] = cls


class PreNorm(NormPlacement):
    name = "pre"
    description = "x + f(norm(x)): each sub-layer reads a normed input (the paper)"


class ResidualPostNorm(NormPlacement):
    name = "residual_post"
    description = "x + norm(f(x)): each sub-layer's output is normed before the sum (Swin v2, EVA-02 enormous)"
    norms_branch_output = True


# --- MLPs ----------------------------------------------------------------------------------------------------------

MLP_KINDS = {}


class FeedForward(nn.Module):
    """The base of every MLP kind: a subclass with a `name` enters `MLP_KINDS` by being defined."""

    name = None
    description = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name is not None:
            MLP_KINDS[cls.name] = cls


class HubViTMLP(FeedForward):
    """fc1, the activation (`hidden_act`: GELU, tanh GELU, quick GELU, ...), fc2: the paper's MLP."""

    name = "mlp"
    description = "fc1, activation, fc2 (the paper; GELU, tanh GELU or quick GELU by hidden_act)"
    gated = False  # fc1 gives a gate and a value (what SwiGLU flags in timm and transformers mean)
    activation_reads_fc1 = True  # the activation's input is fc1's output as it is (what ONNX fusion rewrites)
    fc1_widths = 1  # fc1 gives this many vectors of intermediate_size per token

    def __init__(self, config, inner_norm=None, width=None):
        """`inner_norm`, `width`: the norm before fc2 and the hidden width (default `config.mlp_inner_norm` and
        `config.intermediate_size`; a MAP head's MLP has no norm and may have its own width)."""
        super().__init__()
        inner_norm = config.mlp_inner_norm if inner_norm is None else inner_norm
        width = config.intermediate_size if width is None else width
        self.fc1 = nn.Linear(config.hidden_size, self.fc1_widths * width, bias=config.mlp_bias)
        self.activation = ACT2FN[config.hidden_act]
        self.norm = make_norm(config, width) if inner_norm else None
        self.fc2 = nn.Linear(width, config.hidden_size, bias=config.mlp_bias)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def hidden(self, hidden_states):
        """The vector fc2 reads: the activation of fc1's output."""
        return self.activation(self.fc1(hidden_states))

    def forward(self, hidden_states):
        hidden = self.hidden(hidden_states)
        if self.norm is not None:
            hidden = self.norm(hidden)
        return self.dropout(self.fc2(hidden))


class HubViTGatedMLP(HubViTMLP):
    """A gated linear unit (Shazeer, 2020): fc1 gives a gate and a value (packed, gate first, as timm's
    `SwiGLUPacked`), activation(gate) * value, then fc2. With `hidden_act="silu"` it is SwiGLU (EVA-02, DINOv2
    giant, AIMv2, DINOv3); `intermediate_size` is the width of the value."""

    name = "gated"
    description = "activation(gate) * value, then fc2 (SwiGLU with hidden_act='silu')"
    gated = True
    activation_reads_fc1 = False
    fc1_widths = 2

    def hidden(self, hidden_states):
        gate, value = self.fc1(hidden_states).chunk(2, dim=-1)
        return self.activation(gate) * value


# --- attention -----------------------------------------------------------------------------------------------------


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


def split_into_heads(module, config):
    """What every multi-head attention module carries for the attention functions: its config, the head count and
    width, the 1/sqrt(d) scaling, and `is_causal` (False: a ViT attends both ways)."""
    module.config = config
    module.num_heads = config.num_attention_heads
    module.head_dim = config.hidden_size // config.num_attention_heads
    module.scaling = module.head_dim**-0.5
    module.is_causal = False


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


def check_key_value_heads(config):
    """Key/value head counts that divide the query heads, one per block or one for all; grouped ones need separate
    projections."""
    counts = config.num_key_value_heads
    if isinstance(counts, list) and len(counts) != config.num_hidden_layers:
        raise ValueError(
            f"num_key_value_heads={counts} has {len(counts)} entries; expected one per block "
            f"(num_hidden_layers={config.num_hidden_layers}) or a single int"
        )
    heads = config.num_attention_heads
    for count in [] if counts is None else [counts] if isinstance(counts, int) else counts:
        if count <= 0 or heads % count:
            raise ValueError(f"num_key_value_heads={counts!r}; expected counts that divide num_attention_heads={heads}")
    grouped = any(config.key_value_heads(i) != heads for i in range(config.num_hidden_layers))
    if grouped and config.qkv_fused:
        raise ValueError(f"num_key_value_heads={counts!r} groups keys and values; needs qkv_fused=False")


class HubViTAttention(nn.Module):
    """Multi-head self-attention. Projections fused (`qkv`, rows [q; k; v], each head-major: the paper, timm) or
    separate (`q`, `k`, `v`: transformers, EVA-02); biases on all three (`qkv_bias`), or on q and v only
    (`key_bias=False`: EVA, BEiT, DINOv3, stored as `q_bias` / `v_bias` beside a fused `qkv`); an optional norm of
    each head's queries and keys (`qk_norm`); the position kind's bias on the logits. Block `index` may have fewer
    key/value heads than query heads (`num_key_value_heads`), each shared by a group of neighbouring query heads,
    and may attend within windows of the grid (`attention_window_size`, windows_hubvit.py)."""

    def __init__(self, config, position, index=0):
        super().__init__()
        dim = config.hidden_size
        split_into_heads(self, config)
        self.index = index
        self.window = block_window(config, index)
        self.key_value_heads = config.key_value_heads(index)
        kv_dim = self.key_value_heads * self.head_dim
        key_bias = config.qkv_bias and config.key_bias
        beside_fused = config.qkv_fused and config.qkv_bias and not config.key_bias
        self.q_bias = nn.Parameter(torch.zeros(dim)) if beside_fused else None
        self.v_bias = nn.Parameter(torch.zeros(dim)) if beside_fused else None
        self.qkv = self.q = self.k = self.v = None
        if config.qkv_fused:
            self.qkv = nn.Linear(dim, 3 * dim, bias=key_bias)
        else:
            self.q = nn.Linear(dim, dim, bias=config.qkv_bias)
            self.k = nn.Linear(dim, kv_dim, bias=key_bias)
            self.v = nn.Linear(dim, kv_dim, bias=config.qkv_bias)
        self.q_norm = make_norm(config, self.head_dim) if config.qk_norm else None
        self.k_norm = make_norm(config, self.head_dim) if config.qk_norm else None
        self.norm = make_norm(config) if config.attention_inner_norm else None
        self.proj = nn.Linear(dim, dim, bias=config.proj_bias)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.position = position
        position.build_attention(self)

    @property
    def fusable(self):
        """Whether this layer computes softmax(q k^T / sqrt(d)) v straight off its fused `qkv` output, with nothing
        between the two projections: what onnxruntime's fused attention computes. Read off the parts the layer was
        built with (a bias beside `qkv`, a norm, windows, grouped heads, any position hook), so a new part that acts
        on the product makes the layer unfusable by being there."""
        position = self.position
        hooks = (position.query_bias, position.rotate, position.logits_bias)
        parts = (self.q_bias, self.q_norm, self.norm, *hooks)
        return self.qkv is not None and not self.window and all(part is None for part in parts)

    def project(self, hidden_states):
        """Queries, keys and values, each (B, H, N, d)."""
        batch_size, num_tokens = hidden_states.shape[0], hidden_states.shape[1]
        if self.q is None:
            qkv = self.qkv(hidden_states)
            if self.q_bias is not None:
                qkv = qkv + torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])
            qkv = qkv.reshape(batch_size, num_tokens, 3, self.num_heads, self.head_dim)
            query, key, value = (part.transpose(1, 2) for part in qkv.unbind(2))
        else:
            query, key, value = (
                projection(hidden_states).reshape(batch_size, num_tokens, -1, self.head_dim).transpose(1, 2)
                for projection in (self.q, self.k, self.v)
            )
        if self.q_norm is not None:
            query, key = self.q_norm(query), self.k_norm(key)
        if self.key_value_heads != self.num_heads:
            groups = self.num_heads // self.key_value_heads
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        return query, key, value

    def forward(self, hidden_states, grid, num_queries=None, **kwargs):
        """Returns the attended tokens and the attention weights (None from fused kernels).

        `num_queries`: attend from the first tokens only (all tokens still give keys and values). A windowed block
        attends within each window of the zero-padded grid; its weights come back as one matrix over the patches.
        """
        if not self.window:
            return self.attend(hidden_states, grid, num_queries, **kwargs)
        windows, padded = partition(hidden_states, grid, self.window)
        output, weights = self.attend(windows, (self.window, self.window), None, **kwargs)
        output = unpartition(output, grid, padded, self.window)[:, :num_queries]
        if weights is not None:
            weights = unpartition_weights(weights, grid, padded, self.window)[:, :, :num_queries]
        return output, weights

    def attend(self, hidden_states, grid, num_queries=None, **kwargs):
        """Attention over all of `hidden_states`, tokens on a `grid` of patches after any prefix tokens."""
        batch_size, num_tokens = hidden_states.shape[0], hidden_states.shape[1]
        query, key, value = self.project(hidden_states)
        position = self.position
        bias = None if position.query_bias is None else position.query_bias(self, query, grid)
        if position.rotate is not None:
            query, key = position.rotate(self, query, key, grid)
        if num_queries is not None:
            query = query[:, :, :num_queries]
        mask = None if position.logits_bias is None else position.logits_bias(self, grid, num_tokens)
        if bias is not None:
            mask = bias if mask is None else mask + bias
        padding = kwargs.get("attention_mask")  # (B, 1, 1, N) additive: a batch of patch sequences (naflex_hubvit.py)
        if padding is not None:
            mask = padding if mask is None else mask + padding
        if mask is not None:
            mask = mask[:, :, :num_queries].to(query.dtype)
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
        output = output.reshape(batch_size, query.shape[2], -1)
        if self.norm is not None:
            output = self.norm(output)
        return self.dropout(self.proj(output)), weights


# --- the patch embedding ------------------------------------------------------------------------------------------


def check_pixel_values(pixel_values, config, patch_size=None):
    """Clear errors for inputs no ViT can take. Sides that do not divide by the patch are padded on the bottom and
    right when `dynamic_img_pad` is set (timm); otherwise the stride-P convolution leaves out their last rows and
    columns, as timm and big_vision do (SigLIP So400m/14 at 384 px sees a 27 x 27 grid).

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
    if (height % ph or width % pw) and config.dynamic_img_pad:
        return F.pad(pixel_values, (0, (pw - width % pw) % pw, 0, (ph - height % ph) % ph))
    return pixel_values


class HubViTEmbeddings(nn.Module):
    """Patch embedding, prefix tokens and the position kind's embedding, for any grid of patches."""

    def __init__(self, config, position):
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
        self.patch_norm = make_norm(config) if config.patch_norm else None
        self.position = position
        position.build(self)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        resize = config.patch_resize or {}
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

    def prefix_tokens(self, batch_size):
        tokens = [t for t in (self.class_token, self.distillation_token, self.register_tokens) if t is not None]
        return [t.expand(batch_size, -1, -1) for t in tokens]

    def patch_position_table(self, grid):
        """(1, gh * gw, D) vectors the patches at `grid` get, or None for the kinds that add none to them."""
        return self.position.patch_table(self, grid)

    def forward(self, pixel_values, patch_size=None):
        patches = self.embed_patches(pixel_values, patch_size)
        grid = (patches.shape[-2], patches.shape[-1])
        patches = patches.flatten(2).transpose(1, 2)
        if self.patch_norm is not None:
            patches = self.patch_norm(patches)
        embeddings = self.position.embed(self, self.prefix_tokens(patches.shape[0]), patches, grid)
        return self.dropout(embeddings), grid


# --- the encoder ---------------------------------------------------------------------------------------------------


def drop_path(x, rate, training):
    """Stochastic depth (Huang et al., 2016): drop whole residual branches per sample."""
    if rate == 0.0 or not training:
        return x
    keep = 1.0 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask / keep


class HubViTLayer(GradientCheckpointingLayer):
    """Encoder block: x + attention(norm(x)), then x + mlp(norm(x)), with optional layer scale and stochastic depth;
    with `norm_placement="residual_post"`, x + norm(attention(x)), then x + norm(mlp(x)) (Swin v2's residual
    post-norm: timm's `ResPostBlock`, EVA-02 enormous)."""

    def __init__(self, config, position, drop_path_rate=0.0, index=0):
        super().__init__()
        dim = config.hidden_size
        self.norm1 = make_norm(config)
        self.attention = HubViTAttention(config, position, index)
        self.norm2 = make_norm(config)
        self.mlp = config.mlp_kind(config)
        scale = config.layer_scale_init_value
        self.layer_scale1 = nn.Parameter(torch.full((dim,), float(scale))) if scale is not None else None
        on_mlp = scale is not None and not config.scale_attention_branch_only
        self.layer_scale2 = nn.Parameter(torch.full((dim,), float(scale))) if on_mlp else None
        self.drop_path_rate = drop_path_rate
        self.post_norm = config.norm_placement_kind.norms_branch_output

    def forward(self, hidden_states, grid, num_queries=None, **kwargs):
        """`num_queries`: update (and return) the first tokens only."""
        if self.post_norm:
            attended = self.norm1(self.attention(hidden_states, grid, num_queries, **kwargs)[0])
        else:
            attended, _ = self.attention(self.norm1(hidden_states), grid, num_queries, **kwargs)
        if self.layer_scale1 is not None:
            attended = attended * self.layer_scale1
        hidden_states = hidden_states[:, :num_queries] + drop_path(attended, self.drop_path_rate, self.training)
        if self.post_norm:
            transformed = self.norm2(self.mlp(hidden_states))
        else:
            transformed = self.mlp(self.norm2(hidden_states))
        if self.layer_scale2 is not None:
            transformed = transformed * self.layer_scale2
        return hidden_states + drop_path(transformed, self.drop_path_rate, self.training)


class HubViTEncoder(nn.Module):
    def __init__(self, config, position):
        super().__init__()
        depth = config.num_hidden_layers
        rates = [config.drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.layers = nn.ModuleList([HubViTLayer(config, position, rate, i) for i, rate in enumerate(rates)])

    def forward(self, hidden_states, grid, num_output_tokens=None, last_block=None, states=None, **kwargs):
        """The one loop over the blocks. `num_output_tokens`: the last block updates (and returns) only the first
        tokens. `last_block`: run no block after it. `states`: a list each block's output is appended to."""
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers[: None if last_block is None else last_block + 1]):
            hidden_states = layer(hidden_states, grid, num_output_tokens if index == last else None, **kwargs)
            if states is not None:
                states.append(hidden_states)
        return hidden_states


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
