"""The resolution experiment's controls and figures' pieces: the two wrong ways to resize a table ([CLS] resized
into the grid; the whole table stretched in 1D), the table a model adds at a grid, and the similarity mosaics."""

import copy

import numpy as np
import torch
import torch.nn.functional as F


def set_mode(model, mode, antialias):
    model.config.interpolation_mode, model.config.interpolation_antialias = mode, antialias
    model.config.interpolation_align_corners = False


def cls_stretched_with_grid(model, image_size):
    """A copy whose whole position table, [CLS] row included, is linearly stretched as one 1D sequence to the number
    of tokens at `image_size` (the mistake the [CLS]-apart 2D resize avoids); the copy then runs natively there."""
    stretched = copy.deepcopy(model)
    embeddings = stretched.hubvit.embeddings
    grid = (image_size // embeddings.patch_size[0], image_size // embeddings.patch_size[1])
    table = embeddings.position_embedding.detach()
    rows = 1 + grid[0] * grid[1]
    table = F.interpolate(table.transpose(1, 2), size=rows, mode="linear", align_corners=False).transpose(1, 2)
    embeddings.position_embedding = torch.nn.Parameter(table.contiguous())
    embeddings.grid_size = grid
    stretched.config.image_size = image_size
    return stretched


def cls_in_grid_2d(model, image_size):
    """A copy whose [CLS] row is resized *with* the grid by the model's own 2D resize: the 1 + gh*gw rows, in order,
    fill a grid of gw columns row by row ([CLS] at cell (0, 0), every patch one cell on; the last row padded with
    the last patch's row), that grid is resized by the configured mode by the factor from the old patch grid to the
    new one, and the first 1 + new rows are read back in the same order. The 2D counterpart of `cls_stretched_with_grid`, and the
    same resize as the [CLS]-apart table: each control differs from its reference in one thing."""
    from hubvit.modeling.resize_hubvit import resize_as_configured

    moved = copy.deepcopy(model)
    embeddings = moved.hubvit.embeddings
    (gh, gw), ph = embeddings.grid_size, embeddings.patch_size[0]
    grid = (image_size // ph, image_size // embeddings.patch_size[1])
    table = embeddings.position_embedding.detach()
    rows = table.shape[1]
    layout = (-(-rows // gw), gw)
    padded = torch.cat([table, table[:, -1:].expand(-1, layout[0] * gw - rows, -1)], dim=1)
    scaled = (-(-layout[0] * grid[0] // gh), grid[1])
    resized = resize_as_configured(model.config, padded, layout, scaled)
    embeddings.position_embedding = torch.nn.Parameter(resized[:, : 1 + grid[0] * grid[1]].contiguous())
    embeddings.grid_size = grid
    moved.config.image_size = image_size
    return moved


def grid_table(model, grid):
    """The (gh*gw, D) patch rows of the position table the model adds at `grid`."""
    with torch.no_grad():
        return model.hubvit.embeddings.patch_position_table(grid)[0]


def json_grid(canvas):
    """A mosaic as JSON can hold it: two decimals (a colour map shows no finer), gaps (NaN) as null."""
    return [[None if np.isnan(v) else round(float(v), 2) for v in row] for row in canvas]


def mosaic(table, grid, refs_per_side=7):
    """Cosine similarity of a few reference patches' position embeddings with every patch's, tiled like the grid."""
    table = F.normalize(table.float(), dim=-1)
    gh, gw = grid
    rows = np.linspace(0, gh - 1, refs_per_side).round().astype(int)
    cols = np.linspace(0, gw - 1, refs_per_side).round().astype(int)
    canvas = np.full((refs_per_side * (gh + 1), refs_per_side * (gw + 1)), np.nan)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            sim = (table @ table[r * gw + c]).reshape(gh, gw).numpy()
            canvas[i * (gh + 1) : i * (gh + 1) + gh, j * (gw + 1) : j * (gw + 1) + gw] = sim
    return canvas
