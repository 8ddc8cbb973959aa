"""Position embeddings as the paper draws them (Figure 7, centre): the cosine similarity of each patch's position
vector with every other patch's, and, for the relative 2D bias, each head's bias over (dy, dx) offsets.

Tables are read through the position kind's own methods (`patch_table`, `bias_table`), so a resized table is
exactly what the model adds at that size.
"""

import torch
import torch.nn.functional as F

from ..errors import HubViTError
from .attention import body


def position_table(model, grid=None):
    """(N, D) position vectors of the patches at `grid` (default: the native grid), as the model computes them, or
    None for the kinds that add no vector to the patches (`relative_2d`, `none`)."""
    model = body(model)
    with torch.no_grad():
        table = model.embeddings.patch_position_table(tuple(grid or model.config.grid_size))
    return None if table is None else table[0].float()


def rotary_table(model, grid=None):
    """(N, 2 x angles) [cos, sin] of the rotation angles of the patches at `grid` (default: the native grid), or
    None without `rope_type`. The cosine similarity of two rows is the mean of cos(angle difference) over the
    pairs: how the rotation alone scales a query-key product between the two patches, the rotary counterpart of
    a table's similarity map. A learned per-block kind (`mixed`) gives the first block's, heads side by side."""
    model = body(model)
    rotary = model.embeddings.position.rotary
    if rotary is None:
        return None
    grid = tuple(grid or model.config.grid_size)
    device = model.embeddings.patch_embedding.weight.device
    with torch.no_grad():
        if rotary.learned:
            frequencies = model.encoder.layers[0].attention.rope_frequencies.float()
            coordinates = rotary.coordinates(grid, device)
            angles = coordinates[:, 0, None, None] * frequencies[0] + coordinates[:, 1, None, None] * frequencies[1]
            angles = angles.flatten(1)
        else:
            angles = rotary.angles(rotary.coordinates(grid, device))
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def cosine_similarity_grid(table, grid):
    """(gh, gw, gh, gw): entry [i, j] is the map of patch (i, j)'s cosine similarity with every patch; in float32,
    or float64 for a float64 table (the distance-only reference: its zero is then exact to 1e-17, not 1e-9)."""
    unit = F.normalize(table if table.dtype == torch.float64 else table.float(), dim=-1)
    return (unit @ unit.t()).reshape(grid[0], grid[1], grid[0], grid[1])


def stripe_score(similarity):
    """How much more similar patches in the same row or column are than other pairs exactly as far apart.

    Only offsets of exactly equal Euclidean length are compared: an axis-aligned offset (k, 0) or (0, k) against
    the off-axis offsets (a, b) with a^2 + b^2 = k^2 (k = 5: (3, 4); k = 10: (6, 8); k = 13: (5, 12); ...). For each
    such k, the mean similarity of the aligned pairs minus that of the off-axis pairs; averaged over the k the grid
    holds. A table whose similarities depend on distance only scores 0 up to round-off (any rounding of distances
    would not: neighbouring distances differ in similarity); positive where rows and columns show as stripes (the
    paper's learned 1D tables; a [sin x, cos x, sin y, cos y] table by construction). None below a 4 x 6 grid (no
    equal-length pair).
    """
    gh, gw = similarity.shape[:2]
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.reshape(-1), xs.reshape(-1)
    dy, dx = (ys[:, None] - ys[None, :]).abs(), (xs[:, None] - xs[None, :]).abs()
    values = similarity.reshape(gh * gw, gh * gw).double()
    squared = dy.square() + dx.square()
    aligned = (dy == 0) | (dx == 0)
    off_axis = (dy > 0) & (dx > 0)
    gaps = []
    for k in range(1, max(gh, gw)):
        on = aligned & (squared == k * k)
        off = off_axis & (squared == k * k)
        if on.any() and off.any():
            gaps.append(values[on].mean() - values[off].mean())
    return float(torch.stack(gaps).mean()) if gaps else None


def distance_only_table(grid, width=8.0):
    """(N, N) a reference table whose cosine similarities depend on patch distance only: the Cholesky factor of a
    Gaussian kernel of the distance (`width`: twice its variance in patches squared). Its stripe score is the zero
    a trained table's stripes are measured against."""
    ys, xs = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    points = torch.stack([ys.reshape(-1), xs.reshape(-1)], -1).double()
    kernel = torch.exp(-torch.cdist(points, points).square() / width)
    return torch.linalg.cholesky(kernel + 1e-6 * torch.eye(len(points), dtype=torch.float64))


def relative_bias_tables(model, layer=0, grid=None):
    """(heads, 2gh - 1, 2gw - 1) biases over (dy, dx) of one block, resized to `grid` as the model does."""
    model = body(model)
    layers = model.encoder.layers
    if not -len(layers) <= layer < len(layers):
        raise HubViTError(f"layer {layer} does not exist; the model has layers 0..{len(layers) - 1}")
    attention = layers[layer].attention
    with torch.no_grad():
        table = attention.position.bias_table(attention, tuple(grid or model.config.grid_size))
    if table is None:
        raise HubViTError(
            f"the model has no relative position bias (position_embedding_type={model.config.position_embedding_type!r}"
            f" is {attention.position.description!r})"
        )
    return table.float()
