"""Position embeddings, one class per kind: what the encoder is told about where each patch sits.

A kind owns everything about itself: the parameters it adds to the patch embedding (`build`) or to every
attention layer (`build_attention`), their initialisation, what it does in the forward pass (add a table to the
patch tokens in `embed`, a bias to the attention logits in `logits_bias`, or a rotation of the queries and keys in
`rotate`), how its tables follow a new native grid (`resize`), and the facts the model, its
analyses and `hubvit info` ask for (the class attributes; what other libraries call each kind is in hubvit's
conversion/kinds.py, which does not travel). `config.position_embedding_type` names the kind; `POSITION_KINDS` maps
names to classes, and a subclass with a `name` enters it by being defined, so a new kind is one class here.

The kind's parameters are registered on the module that uses them (`embeddings.position_embedding`,
`attention.relative_position_bias`): those names are the checkpoints' on-disk contract, unchanged since the first
folder was written.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .resize_hubvit import interpolation_weights, resize_as_configured

POSITION_KINDS = {}


def patch_positions(spatial_shapes, length):
    """Where each of `length` positions of a batch of patch sequences (`spatial_shapes` (B, 2) rows and columns) sits:
    (row, column) (B, length) float32, position p of an image of C columns at row p // C, column p % C (its padding
    gets places too, past its last row), and each image's (rows, columns) (B, 1). Elementwise, so graphs export."""
    shapes = spatial_shapes.to(torch.float32)
    rows, columns = shapes[:, 0:1], shapes[:, 1:2]
    position = torch.arange(length, dtype=torch.float32, device=shapes.device)[None]
    row = torch.div(position, columns, rounding_mode="floor")
    return row, position - row * columns, rows, columns


class PositionKind:
    """The base of every kind: no parameters, no table, no bias; each method is the identity or does nothing."""

    name = None
    description = ""
    positional = False  # tells the encoder anything about where patches sit (False: the patches form a set)
    adds_table = False  # adds one vector to every patch token (what the similarity figures read)
    learned = False  # has parameters trained with the model
    attention_bias = False  # adds a bias over patch offsets to the attention logits of every block
    rotates = False  # rotates the patch tokens' queries and keys in every block (rotary position embeddings)
    own_fields = ()  # config fields only this kind reads

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name is not None:
            POSITION_KINDS[cls.name] = cls

    def __init__(self, config):
        self.config = config

    @classmethod
    def check(cls, config):
        """Refuse a config this kind cannot run, naming the fields (a `ValueError`)."""

    # --- on the embeddings -------------------------------------------------------------------------------------

    def build(self, embeddings):
        """Register the kind's parameters on `embeddings` (which knows its native `grid_size`)."""

    def init_weights(self, embeddings, init):
        """Initialise what `build` registered (`init`: transformers' initialisers, or torch's)."""

    def patch_table(self, embeddings, grid):
        """(1, gh * gw, D) vectors the patches at `grid` get, or None for the kinds that add none to them."""
        return None

    def sequence_tables(self, embeddings, spatial_shapes, length):
        """(B, prefix + N, D) vectors for a batch of patch sequences (naflex_hubvit.py): each position's
        `vectors_at` its own row and column of its image's grid (`spatial_shapes` (B, 2)), zeros over the padding and
        the prefix tokens; None for the kinds that add no table. Elementwise in the shapes, so graphs export."""
        if not self.adds_table:
            return None
        row, column, rows, columns = patch_positions(spatial_shapes, length)
        patches = self.vectors_at(embeddings, row, column, rows, columns) * (row < rows)[..., None]
        zeros = patches.new_zeros(patches.shape[0], embeddings.num_prefix_tokens, patches.shape[2])
        return torch.cat([zeros, patches], dim=1)

    def vectors_at(self, embeddings, row, column, rows, columns):
        """(B, N, D) vectors of patches at `row`, `column` (B, N) of grids of `rows` x `columns` (B, 1): what
        `patch_table` gives each patch, for the kinds that add a table."""
        raise NotImplementedError(f"{type(self).__name__} adds a table but reads no patch sequences")

    def embed(self, embeddings, prefix, patches, grid):
        """The encoder's input: `prefix` tokens (a list of (B, n, D)) before the patch tokens (B, gh * gw, D), with
        the kind's table added."""
        table = self.patch_table(embeddings, grid)
        if table is not None:
            patches = patches + table
        return torch.cat(prefix + [patches], dim=1) if prefix else patches

    def resize(self, embeddings, new_grid):
        """Replace the stored tables by their resize to `new_grid` (a new native resolution)."""

    # --- on each attention layer -------------------------------------------------------------------------------

    def build_attention(self, attention):
        """Register the kind's parameters on one attention layer."""

    def init_attention(self, attention, init):
        """Initialise what `build_attention` registered."""

    def logits_bias(self, attention, grid, num_tokens):
        """(1, H, T, T) bias added to the attention logits for a `grid` of patches after prefix tokens, or None."""
        return None

    def query_bias(self, attention, query, grid):
        """(B, H, T, T) terms added to the logits that depend on the queries (B, H, T, d), or None: no kind adds
        them; the decomposed relative positions beside it do (windows_hubvit.py)."""
        return None

    def rotate(self, attention, query, key, grid):
        """Queries and keys (B, H, T, d) with the kind's rotation applied to the patch tokens (the last gh * gw);
        prefix tokens are never rotated. The identity for the kinds that rotate nothing."""
        return query, key

    def bias_table(self, attention, grid):
        """(H, ...) the attention layer's biases over patch offsets at `grid` (what the figures draw), or None."""
        return None

    def resize_attention(self, attention, new_grid):
        """Replace the attention layer's stored tables by their resize to `new_grid`."""


class LearnedTable(PositionKind):
    """The paper's learned 1D table, one row per token; prefix tokens get rows of their own unless
    `position_embedding_includes_prefix=False` (timm's `no_embed_class`), when they get none."""

    name = "learned"
    description = "learned 1D table, one row per token (the paper's default)"
    positional = adds_table = learned = True

    @classmethod
    def rows(cls, config):
        """One per patch of the native grid, and one per prefix token where the table includes them."""
        (gh, gw), prefix = config.grid_size, config.num_prefix_tokens
        return gh * gw + (prefix if config.position_embedding_includes_prefix else 0)

    def build(self, embeddings):
        embeddings.position_embedding = nn.Parameter(torch.zeros(1, self.rows(self.config), self.config.hidden_size))

    def init_weights(self, embeddings, init):
        init.normal_(embeddings.position_embedding, std=self.config.initializer_range)

    def table(self, embeddings, grid):
        """The whole table at `grid`: prefix rows (if any) untouched, the patch grid resized."""
        table = embeddings.position_embedding
        native = embeddings.grid_size
        prefix = table.shape[1] - native[0] * native[1]
        if self.config.interpolation_keep_aspect and tuple(grid) != tuple(native):
            side = max(grid)
            square = resize_as_configured(self.config, table[:, prefix:], native, (side, side))
            patches = square.reshape(1, side, side, -1)[:, : grid[0], : grid[1]].reshape(1, grid[0] * grid[1], -1)
        else:
            patches = resize_as_configured(self.config, table[:, prefix:], native, grid)
        return torch.cat([table[:, :prefix], patches], dim=1)

    def patch_table(self, embeddings, grid):
        table = self.table(embeddings, grid)
        return table[:, table.shape[1] - grid[0] * grid[1] :]

    def embed(self, embeddings, prefix, patches, grid):
        if self.config.position_embedding_includes_prefix:
            return torch.cat(prefix + [patches], dim=1) + self.table(embeddings, grid)
        return super().embed(embeddings, prefix, patches, grid)

    def sequence_tables(self, embeddings, spatial_shapes, length):
        """Every image's table at once, from the interpolation weights of each output position (no loop over the
        images, so the graph exports): the prefix rows where the table has them, each image's resized grid, zeros
        over its padding."""
        config, table = self.config, embeddings.position_embedding
        (gh, gw), mode = embeddings.grid_size, (config.interpolation_mode, config.interpolation_antialias)
        prefix = table.shape[1] - gh * gw
        row, column, rows, columns = patch_positions(spatial_shapes, length)
        sizes = (torch.maximum(rows, columns),) * 2 if config.interpolation_keep_aspect else (rows, columns)
        weights = [
            interpolation_weights(old, at[..., None], new[..., None], *mode, config.interpolation_align_corners)
            for old, at, new in ((gh, row, sizes[0]), (gw, column, sizes[1]))
        ]
        outer = (weights[0][..., :, None] * weights[1][..., None, :]).flatten(-2)  # (B, N, gh * gw), as transformers
        patches = torch.matmul(outer, table[0, prefix:].float()) * (row < rows)[..., None]
        head = table[:, :prefix].expand(patches.shape[0], -1, -1)
        zeros = patches.new_zeros(patches.shape[0], embeddings.num_prefix_tokens - prefix, patches.shape[2])
        return torch.cat([head.float(), zeros, patches], dim=1).to(table.dtype)

    def resize(self, embeddings, new_grid):
        embeddings.position_embedding = nn.Parameter(self.table(embeddings, new_grid).detach().clone())


class LearnedRowColumnTables(PositionKind):
    """A learned table per axis, each half the width, concatenated per patch: (row vector, column vector)."""

    name = "learned_2d"
    description = "learned row and column tables, each half the width"
    positional = adds_table = learned = True

    @classmethod
    def check(cls, config):
        if config.hidden_size % 2:
            raise ValueError(
                f"position_embedding_type='learned_2d' needs an even hidden_size, got {config.hidden_size}"
            )

    def build(self, embeddings):
        (gh, gw), half = embeddings.grid_size, self.config.hidden_size // 2
        embeddings.position_embedding_rows = nn.Parameter(torch.zeros(gh, half))
        embeddings.position_embedding_columns = nn.Parameter(torch.zeros(gw, half))

    def init_weights(self, embeddings, init):
        init.normal_(embeddings.position_embedding_rows, std=self.config.initializer_range)
        init.normal_(embeddings.position_embedding_columns, std=self.config.initializer_range)

    def patch_table(self, embeddings, grid):
        """Row and column tables resized along their own axis, then concatenated per patch: (1, gh*gw, D)."""
        native = embeddings.grid_size
        rows = resize_as_configured(
            self.config, embeddings.position_embedding_rows[None], (native[0], 1), (grid[0], 1)
        )[0]
        cols = resize_as_configured(
            self.config, embeddings.position_embedding_columns[None], (1, native[1]), (1, grid[1])
        )[0]
        table = torch.cat([rows[:, None, :].expand(-1, grid[1], -1), cols[None, :, :].expand(grid[0], -1, -1)], dim=-1)
        return table.reshape(1, grid[0] * grid[1], -1)

    def vectors_at(self, embeddings, row, column, rows, columns):
        """The row table resized to each image's rows, read at the patch's row, beside the column table's vector,
        from the interpolation weights of that one place."""
        config, (gh, gw) = self.config, embeddings.grid_size
        mode = (config.interpolation_mode, config.interpolation_antialias, config.interpolation_align_corners)
        halves = [
            torch.matmul(interpolation_weights(old, at[..., None], new[..., None], *mode), table.float())
            for old, at, new, table in (
                (gh, row, rows, embeddings.position_embedding_rows),
                (gw, column, columns, embeddings.position_embedding_columns),
            )
        ]
        return torch.cat(halves, dim=-1).to(embeddings.position_embedding_rows.dtype)

    def resize(self, embeddings, new_grid):
        table = self.patch_table(embeddings, new_grid).reshape(new_grid[0], new_grid[1], -1)
        half = table.shape[-1] // 2
        embeddings.position_embedding_rows = nn.Parameter(table[:, 0, :half].detach().clone())
        embeddings.position_embedding_columns = nn.Parameter(table[0, :, half:].detach().clone())


class RelativeBias2D(PositionKind):
    """A learned bias per head and 2D patch offset (dy, dx), added to the attention logits of every block (as BEiT
    without its class rows); prefix tokens get no bias."""

    name = "relative_2d"
    description = "learned bias per head and 2D offset on the attention logits"
    positional = learned = attention_bias = True

    def build_attention(self, attention):
        gh, gw = self.config.grid_size
        attention.relative_position_bias = nn.Parameter(torch.zeros(attention.num_heads, 2 * gh - 1, 2 * gw - 1))

    def init_attention(self, attention, init):
        init.zeros_(attention.relative_position_bias)

    def bias_table(self, attention, grid):
        """The (H, 2gh-1, 2gw-1) table of biases over (dy, dx) offsets, resized to a `grid` of patches."""
        table = attention.relative_position_bias
        heads, old = table.shape[0], tuple(table.shape[1:])
        new = (2 * grid[0] - 1, 2 * grid[1] - 1)
        flat = resize_as_configured(self.config, table.reshape(heads, -1).t()[None], old, new)
        return flat[0].t().reshape(heads, *new)

    def patch_bias(self, attention, grid):
        """(H, n, n) biases between the n = gh * gw patches: the table read at each pair's (dy, dx)."""
        table = self.bias_table(attention, grid)
        ys, xs = torch.meshgrid(
            torch.arange(grid[0], device=table.device), torch.arange(grid[1], device=table.device), indexing="ij"
        )
        ys, xs = ys.reshape(-1), xs.reshape(-1)
        return table[:, ys[:, None] - ys[None, :] + grid[0] - 1, xs[:, None] - xs[None, :] + grid[1] - 1]

    def logits_bias(self, attention, grid, num_tokens):
        prefix = num_tokens - grid[0] * grid[1]
        return F.pad(self.patch_bias(attention, grid), (prefix, 0, prefix, 0))[None]

    def resize_attention(self, attention, new_grid):
        attention.relative_position_bias = nn.Parameter(self.bias_table(attention, new_grid).detach().clone())


class RelativeBias2DWithClass(RelativeBias2D):
    """BEiT's relative position bias: the 2D bias over patch offsets of `relative_2d`, and three more per head for
    the class token (`attention.relative_position_class_bias`: class to patch, patch to class, class to itself),
    as BEiT and BEiT v2 learn them in every block."""

    name = "relative_2d_class"
    description = "learned bias per head and 2D offset, plus the class token's (BEiT)"

    @classmethod
    def check(cls, config):
        if not config.class_token or config.num_prefix_tokens != 1:
            raise ValueError(
                "position_embedding_type='relative_2d_class' biases one class token; needs class_token=True and no "
                f"register or distillation token, got {config.num_prefix_tokens} prefix tokens"
            )

    def build_attention(self, attention):
        super().build_attention(attention)
        attention.relative_position_class_bias = nn.Parameter(torch.zeros(attention.num_heads, 3))

    def init_attention(self, attention, init):
        super().init_attention(attention, init)
        init.zeros_(attention.relative_position_class_bias)

    def logits_bias(self, attention, grid, num_tokens):
        patches = self.patch_bias(attention, grid)
        heads, n = patches.shape[0], patches.shape[1]
        to_patch, from_patch, itself = attention.relative_position_class_bias.unbind(1)
        first_row = torch.cat([itself[:, None, None], to_patch[:, None, None].expand(heads, 1, n)], dim=2)
        rows = torch.cat([from_patch[:, None, None].expand(heads, n, 1), patches], dim=2)
        return torch.cat([first_row, rows], dim=1)[None]


class RelativePositionMLP(nn.Module):
    """Two layers with a ReLU between, from a 2D offset to one bias per head."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.fc1 = nn.Linear(2, hidden_size)
        self.fc2 = nn.Linear(hidden_size, num_heads)

    def forward(self, offsets):
        return self.fc2(torch.relu(self.fc1(offsets)))


class RelativeBiasMLP(RelativeBias2D):
    """A bias per head computed from each 2D patch offset by a small MLP (`attention.relative_position_mlp`) of its
    log-spaced coordinates, sign(d) log(1 + |d|): timm's relpos ViT (`RelPosMlp`, its `cr` mode), after Swin v2's
    continuous bias. Any grid has its biases, so there is nothing to resize; prefix tokens get none."""

    name = "relative_2d_mlp"
    own_fields = ("relative_position_hidden_size",)
    description = "bias per head from an MLP of log-spaced 2D offsets (timm relpos ViT)"

    def build_attention(self, attention):
        hidden = self.config.relative_position_hidden_size
        attention.relative_position_mlp = RelativePositionMLP(hidden, attention.num_heads)

    def init_attention(self, attention, init):
        """The MLP's layers are initialised as every linear layer of the model."""

    def bias_table(self, attention, grid):
        device = attention.relative_position_mlp.fc1.weight.device
        axes = [torch.arange(-(size - 1), size, device=device).to(torch.float32) for size in grid]
        offsets = torch.stack(torch.meshgrid(axes, indexing="ij"), dim=-1)
        offsets = torch.sign(offsets) * torch.log(1.0 + offsets.abs())
        return attention.relative_position_mlp(offsets).permute(2, 0, 1)

    def resize_attention(self, attention, new_grid):
        """Nothing is stored per grid."""


def sincos_2d_vectors(y, x, dim, temperature=10000.0):
    """big_vision's sine-cosine vectors [sin x, cos x, sin y, cos y] of patches at rows `y` and columns `x` (float
    tensors of one shape), shape (*y.shape, dim)."""
    quarter = dim // 4
    omega = torch.arange(quarter, device=y.device, dtype=torch.float32) / (quarter - 1)
    omega = 1.0 / temperature**omega
    y, x = y[..., None] * omega, x[..., None] * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=-1)


def sincos_2d_position_table(grid, dim, temperature=10000.0, device=None, dtype=torch.float32):
    """big_vision's fixed table over the patch grid, shape (1, gh*gw, dim)."""
    y, x = torch.meshgrid(
        torch.arange(grid[0], device=device, dtype=torch.float32),
        torch.arange(grid[1], device=device, dtype=torch.float32),
        indexing="ij",
    )
    return sincos_2d_vectors(y.reshape(-1), x.reshape(-1), dim, temperature)[None].to(dtype)


class SinCos2D(PositionKind):
    """big_vision's fixed 2D sine-cosine table (`posemb="sincos2d"`, MoCo v3): no parameters, any grid."""

    name = "sincos_2d"
    description = "fixed 2D sine-cosine table (MoCo v3, big_vision)"
    positional = adds_table = True

    @classmethod
    def check(cls, config):
        if config.hidden_size % 4:
            raise ValueError(
                f"position_embedding_type='sincos_2d' needs hidden_size divisible by 4, got {config.hidden_size}"
            )

    def patch_table(self, embeddings, grid):
        return sincos_2d_position_table(grid, self.config.hidden_size, device=embeddings.patch_embedding.weight.device)

    def embed(self, embeddings, prefix, patches, grid):
        patches = patches + self.patch_table(embeddings, grid).to(patches.dtype)
        return torch.cat(prefix + [patches], dim=1) if prefix else patches

    def vectors_at(self, embeddings, row, column, rows, columns):
        return sincos_2d_vectors(row, column, self.config.hidden_size)


class NoPosition(PositionKind):
    """No position information: the patches form a set (the paper's ablation)."""

    name = "none"
    description = "no position information: the patches form a set"
