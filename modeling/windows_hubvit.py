"""Windowed attention and decomposed relative positions, as the plain-ViT detection backbone (ViTDet, "Exploring Plain
Vision Transformer Backbones for Object Detection") and the Segment Anything image encoder build them.

Most blocks attend within square windows of the patch grid (`attention_window_size`), a few globally
(`global_attention_blocks`): a grid the window does not divide is padded with zeros after the block's first norm, and
the padding takes part in each window's attention as any token does (timm's `vision_transformer_sam`, SAM). Every
block may add decomposed relative positions (`decomposed_relative_position`, after MViTv2, "MViTv2: Improved
Multiscale Vision Transformers for Classification and Detection"): a query's logit for a key gains the query's product
with a learned vector for their row offset and one for their column offset, so the bias depends on the query.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .resize_hubvit import interpolation_matrix, is_tracing


def block_window(config, index):
    """The side of the windows block `index` attends within; 0 where it attends globally."""
    if not config.attention_window_size or index in (config.global_attention_blocks or ()):
        return 0
    return config.attention_window_size


def attention_span(config, index, grid, sequence):
    """(tokens block `index` projects and attends from, keys each query reads, the grid its offsets span) for a
    `grid` of patches in a `sequence` of tokens: windows of the zero-padded grid, or the whole sequence."""
    window = block_window(config, index)
    if not window:
        return sequence, sequence, grid
    padded = [side + (-side) % window for side in grid]
    return padded[0] * padded[1], window * window, (window, window)


def check_window_settings(config):
    """Refuse window, decomposed-position and neck settings no model can run, naming the fields."""
    size, blocks = config.attention_window_size, config.global_attention_blocks
    if size < 0:
        raise ValueError(f"attention_window_size={size}; expected 0 (global attention) or a window side > 0")
    if blocks is not None and (not size or any(i < 0 for i in blocks) or len(set(blocks)) != len(blocks)):
        raise ValueError(
            f"global_attention_blocks={blocks!r}; expected distinct block indices >= 0 beside attention_window_size > 0"
        )
    if size and config.num_prefix_tokens:
        raise ValueError(
            f"attention_window_size={size} partitions the patch grid; expected no prefix tokens, got "
            f"{config.num_prefix_tokens} (class_token, num_register_tokens, distillation_token)"
        )
    if size and (config.position_kind.attention_bias or config.rotary_kind is not None):
        raise ValueError(
            f"attention_window_size={size} with position_embedding_type={config.position_embedding_type!r} and "
            f"rope_type={config.rope_type!r}; windows take position tables and decomposed relative positions only"
        )


def partition(hidden_states, grid, window):
    """(B, rows * columns, D) patch tokens as (B * windows, window^2, D), the grid padded with zeros on the bottom
    and right to whole windows; and the padded grid."""
    batch, dim = hidden_states.shape[0], hidden_states.shape[-1]
    rows, columns = grid
    padded = (rows + (-rows) % window, columns + (-columns) % window)
    tokens = hidden_states.reshape(batch, rows, columns, dim)
    tokens = F.pad(tokens, (0, 0, 0, padded[1] - columns, 0, padded[0] - rows))
    tokens = tokens.reshape(batch, padded[0] // window, window, padded[1] // window, window, dim).transpose(2, 3)
    return tokens.reshape(-1, window * window, dim), padded


def unpartition(windows, grid, padded, window):
    """The inverse of `partition`: windows back on the grid, the padding dropped."""
    rows, columns = grid
    dim = windows.shape[-1]
    tokens = windows.reshape(-1, padded[0] // window, padded[1] // window, window, window, dim).transpose(2, 3)
    return tokens.reshape(-1, padded[0], padded[1], dim)[:, :rows, :columns].reshape(-1, rows * columns, dim)


def unpartition_weights(weights, grid, padded, window):
    """Each window's (heads, window^2, window^2) attention weights in one (B, heads, patches, patches) matrix over
    the image's patches, zero between windows: what readers of attention weights (attention distance, rollout)
    expect. A query's share given to the padding is left out, so rows of edge windows sum to less than one."""
    counts = (padded[0] // window, padded[1] // window)
    area, heads = window * window, weights.shape[1]
    per_image = weights.reshape(-1, counts[0] * counts[1], heads, area, area)
    full = per_image.new_zeros(per_image.shape[0], heads, counts[0] * counts[1], area, counts[0] * counts[1], area)
    full.diagonal(dim1=2, dim2=4).copy_(per_image.permute(0, 2, 3, 4, 1))
    full = full.reshape(per_image.shape[0], heads, counts[0] * counts[1] * area, -1)
    positions = torch.arange(padded[0] * padded[1], device=weights.device)
    window_order = positions.reshape(counts[0], window, counts[1], window).transpose(1, 2).reshape(-1)
    slot = torch.empty_like(window_order)
    slot[window_order] = positions
    rows, columns = grid
    patches = (
        torch.arange(rows, device=weights.device)[:, None] * padded[1] + torch.arange(columns, device=weights.device)
    ).reshape(-1)
    pick = slot[patches]
    return full[:, :, pick][:, :, :, pick]


def resized_table(table, length):
    """A (n, d) offset table resized linearly to `length` rows (timm's and SAM's `get_rel_pos`). A traced or exported
    graph takes one path at every size: the same interpolation as a matrix product (the identity at `n` rows)."""
    if is_tracing():
        weights = interpolation_matrix(table.shape[0], length, "bilinear", False, False)
        return torch.matmul(weights, table.float()).to(table.dtype)
    return table if table.shape[0] == length else F.interpolate(table.t()[None], size=length, mode="linear")[0].t()


def offset_table(table, size):
    """(size, size, d): the learned vector for each (query, key) offset along one axis of `size` positions, the
    stored table resized to 2 * size - 1 offsets where it has another length."""
    table = resized_table(table, 2 * size - 1)
    positions = torch.arange(size, device=table.device)
    return table[positions[:, None] - positions[None, :] + size - 1]


class DecomposedRelativePositions:
    """Decomposed relative positions on every attention layer: a (2 * rows - 1) and a (2 * columns - 1) table of
    head-width vectors per block, over its window or, for global blocks, the native grid."""

    description = "decomposed relative positions (MViTv2, SAM): query-dependent row and column offset terms"

    def __init__(self, config):
        self.config = config

    @staticmethod
    def table_sides(config, index):
        window = block_window(config, index)
        return (window, window) if window else config.grid_size

    def build_attention(self, attention):
        rows, columns = self.table_sides(self.config, attention.index)
        attention.relative_position_rows = nn.Parameter(torch.zeros(2 * rows - 1, attention.head_dim))
        attention.relative_position_columns = nn.Parameter(torch.zeros(2 * columns - 1, attention.head_dim))

    def init_attention(self, attention, init):
        init.zeros_(attention.relative_position_rows)
        init.zeros_(attention.relative_position_columns)

    def resize_attention(self, attention, new_grid):
        """A global block's tables follow a new native grid (windows keep theirs)."""
        if attention.window:
            return
        for name, size in zip(("relative_position_rows", "relative_position_columns"), new_grid):
            table = getattr(attention, name)
            setattr(attention, name, nn.Parameter(resized_table(table.data, 2 * size - 1).contiguous()))

    def query_bias(self, attention, query, grid):
        """(B, H, T, T) terms added to the logits of queries (B, H, T, d) over a `grid` of patches after any prefix
        tokens (their rows and columns get none)."""
        rows, columns = grid
        batch, heads, length, dim = query.shape
        prefix = length - rows * columns
        patches = query[:, :, prefix:].reshape(batch, heads, rows, columns, dim)
        along_rows = torch.einsum("bnhwc,hkc->bnhwk", patches, offset_table(attention.relative_position_rows, rows))
        along_columns = torch.einsum(
            "bnhwc,wkc->bnhwk", patches, offset_table(attention.relative_position_columns, columns)
        )
        bias = (along_rows[..., :, None] + along_columns[..., None, :]).reshape(batch, heads, rows * columns, -1)
        return F.pad(bias, (prefix, 0, prefix, 0)) if prefix else bias
