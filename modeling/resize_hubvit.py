"""Resizing a position table laid out over the patch grid to another grid, as each checkpoint's source does it.

`resize_position_grid` interpolates with `F.interpolate`; while a graph is traced or exported it computes the same
numbers as two matrix products (`resize_position_grid_by_matrices`), which every ONNX runtime implements as PyTorch
does. `resize_as_configured` reads the method from the config, so a kind never names one.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import torch
import torch.nn.functional as F


def is_tracing():
    """Whether the forward pass is being traced, exported or compiled: where a cached tensor would freeze one grid's
    values, and a branch on a size would freeze one size."""
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or bool(compiling and compiling())


def resize_position_grid(table, old_grid, new_grid, mode, antialias, align_corners):
    """Resize a (1, gh*gw, C) table laid out row-major over the patch grid to `new_grid`.

    Interpolates in float32 (as timm does). The native grid returns the table itself, as timm and transformers do,
    except while tracing: there every size takes the same path, so traced and exported graphs run at any grid.
    """
    if torch.jit.is_tracing():
        return resize_position_grid_by_matrices(table, old_grid, new_grid, mode, antialias, align_corners)
    if not is_tracing() and tuple(old_grid) == tuple(new_grid):
        return table
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
    return interpolation_weights(
        old, torch.arange(new, dtype=torch.float32)[:, None], new, mode, antialias, align_corners
    )


def interpolation_weights(old, rows, new, mode, antialias, align_corners):
    """The rows `rows` (a float tensor ending in a dimension of 1) of `interpolation_matrix(old, new)`, for a `new`
    that may also be a float tensor broadcasting against `rows`: each image of a batch of patch sequences at its own
    size (naflex_hubvit.py)."""
    columns = torch.arange(old, dtype=torch.float32)
    if mode == "nearest":  # aten's nearest_idx: min(floor(i * old / new), old - 1) in float32
        scale = torch.tensor(float(old), dtype=torch.float32) / new
        index = torch.clamp(torch.floor(rows * scale), max=old - 1)
        return (index == columns).float()
    if align_corners:
        steps = new - 1 if isinstance(new, torch.Tensor) else torch.tensor(new - 1)
        scale = torch.tensor(float(old - 1), dtype=torch.float32) / torch.clamp(steps, min=1)
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
        total = weight.sum(dim=-1, keepdim=True)
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
