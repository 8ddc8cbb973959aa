"""Position embeddings, one class per kind: what the encoder is told about where each patch sits.

A kind owns everything about itself: the parameters it adds to the patch embedding (`build`) or to every
attention layer (`build_attention`), their initialisation, what it does in the forward pass (add a table to the
patch tokens in `embed`, a bias to the attention logits in `logits_bias`, or a rotation of the queries and keys in
`rotate`), how its tables follow a new native
grid (`resize`), its parameter count, and the facts converters, exporters and analyses ask for (the class
attributes). `config.position_embedding_type` names the kind; `POSITION_KINDS` maps names to classes, and a
subclass with a `name` enters it by being defined, so a new kind is one class here.

The kind's parameters are registered on the module that uses them (`embeddings.position_embedding`,
`attention.relative_position_bias`): those names are the checkpoints' on-disk contract, unchanged since the first
folder was written.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .resize_hubvit import resize_as_configured

POSITION_KINDS = {}


class PositionKind:
    """The base of every kind: no parameters, no table, no bias; each method is the identity or does nothing."""

    name = None
    description = ""
    positional = False  # tells the encoder anything about where patches sit (False: the patches form a set)
    adds_table = False  # adds one vector to every patch token (what the similarity figures read)
    learned = False  # has parameters trained with the model
    attention_bias = False  # adds a bias over patch offsets to the attention logits of every block
    rotates = False  # rotates the patch tokens' queries and keys in every block (rotary position embeddings)
    timm_pos_embed = None  # timm `VisionTransformer(pos_embed=...)` building the same kind, None where none does
    big_vision_posemb = None  # big_vision `posemb=` naming the same kind, None where it has none
    transformers_vit = False  # transformers' `ViTModel` has this kind (a learned 1D table)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name is not None:
            POSITION_KINDS[cls.name] = cls

    def __init__(self, config):
        self.config = config

    @classmethod
    def check(cls, config):
        """Refuse a config this kind cannot run, naming the fields (a `ValueError`)."""

    @classmethod
    def table_parameters(cls, config):
        """Parameters the kind adds outside the blocks."""
        return 0

    @classmethod
    def block_parameters(cls, config):
        """(name, parameters) the kind adds to each block."""
        return []

    # --- on the embeddings -------------------------------------------------------------------------------------

    def build(self, embeddings):
        """Register the kind's parameters on `embeddings` (which knows its native `grid_size`)."""

    def init_weights(self, embeddings, init):
        """Initialise what `build` registered (`init`: transformers' initialisers, or torch's)."""

    def patch_table(self, embeddings, grid):
        """(1, gh * gw, D) vectors the patches at `grid` get, or None for the kinds that add none to them."""
        return None

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
    positional = adds_table = learned = transformers_vit = True
    timm_pos_embed = big_vision_posemb = "learn"

    @classmethod
    def rows(cls, config):
        """One per patch of the native grid, and one per prefix token where the table includes them."""
        (gh, gw), prefix = config.grid_size, config.num_prefix_tokens
        return gh * gw + (prefix if config.position_embedding_includes_prefix else 0)

    @classmethod
    def table_parameters(cls, config):
        return cls.rows(config) * config.hidden_size

    def build(self, embeddings):
        embeddings.position_embedding = nn.Parameter(torch.zeros(1, self.rows(self.config), self.config.hidden_size))

    def init_weights(self, embeddings, init):
        init.normal_(embeddings.position_embedding, std=self.config.initializer_range)

    def table(self, embeddings, grid):
        """The whole table at `grid`: prefix rows (if any) untouched, the patch grid resized."""
        table = embeddings.position_embedding
        native = embeddings.grid_size
        prefix = table.shape[1] - native[0] * native[1]
        patches = resize_as_configured(self.config, table[:, prefix:], native, grid)
        return torch.cat([table[:, :prefix], patches], dim=1)

    def patch_table(self, embeddings, grid):
        table = self.table(embeddings, grid)
        return table[:, table.shape[1] - grid[0] * grid[1] :]

    def embed(self, embeddings, prefix, patches, grid):
        if self.config.position_embedding_includes_prefix:
            return torch.cat(prefix + [patches], dim=1) + self.table(embeddings, grid)
        return super().embed(embeddings, prefix, patches, grid)

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

    @classmethod
    def table_parameters(cls, config):
        return sum(config.grid_size) * (config.hidden_size // 2)

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

    @classmethod
    def block_parameters(cls, config):
        gh, gw = config.grid_size
        return [("attention.relative_position_bias", config.num_attention_heads * (2 * gh - 1) * (2 * gw - 1))]

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

    def logits_bias(self, attention, grid, num_tokens):
        table = self.bias_table(attention, grid)
        ys, xs = torch.meshgrid(
            torch.arange(grid[0], device=table.device), torch.arange(grid[1], device=table.device), indexing="ij"
        )
        ys, xs = ys.reshape(-1), xs.reshape(-1)
        bias = table[:, ys[:, None] - ys[None, :] + grid[0] - 1, xs[:, None] - xs[None, :] + grid[1] - 1]
        prefix = num_tokens - grid[0] * grid[1]
        return F.pad(bias, (prefix, 0, prefix, 0))[None]

    def resize_attention(self, attention, new_grid):
        attention.relative_position_bias = nn.Parameter(self.bias_table(attention, new_grid).detach().clone())


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


class SinCos2D(PositionKind):
    """big_vision's fixed 2D sine-cosine table (`posemb="sincos2d"`, MoCo v3): no parameters, any grid."""

    name = "sincos_2d"
    description = "fixed 2D sine-cosine table (MoCo v3, big_vision)"
    positional = adds_table = True
    big_vision_posemb = "sincos2d"

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


class NoPosition(PositionKind):
    """No position information: the patches form a set (the paper's ablation)."""

    name = "none"
    description = "no position information: the patches form a set"
    timm_pos_embed = "none"


# --- rotary position embeddings ------------------------------------------------------------------------------------

ROTARY_KINDS = {}


def is_tracing():
    """Whether the forward pass is being traced or compiled, where a cached tensor would freeze one grid's angles."""
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or bool(compiling and compiling())


class RotaryKind(PositionKind):
    """The base of the rotary kinds (`rope_type`, beside any position kind): every block turns the patch tokens'
    queries and keys by angles that grow with the patch's row and column, so a query-key product depends on the
    offset between the two patches. Each head's channels form pairs, half of the pairs turned by the row and half by
    the column; a kind says where a patch's coordinates are (`coordinates`) and how fast each pair turns
    (`angles`). Pairs are (x_i, x_{i + d/2}) with `rope_rotate_half`, else neighbours (x_2i, x_2i+1). Prefix tokens
    are never turned. Angles, sines and cosines are float32 under any autocast, as the sources compute them, and
    cached per grid outside training and tracing."""

    rope_type = None
    positional = rotates = True
    default_temperature = 10000.0
    default_rotate_half = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.rope_type is not None:
            ROTARY_KINDS[cls.rope_type] = cls

    def __init__(self, config):
        super().__init__(config)
        self.head_dim = config.hidden_size // config.num_attention_heads
        temperature = config.rope_temperature
        self.temperature = float(self.default_temperature if temperature is None else temperature)
        self.rotate_half = self.default_rotate_half if config.rope_rotate_half is None else config.rope_rotate_half
        self.cache = {}
        self.draws = None

    @classmethod
    def check(cls, config):
        head_dim = config.hidden_size // config.num_attention_heads
        if head_dim % 4:
            raise ValueError(
                f"rope_type={cls.rope_type!r} turns each head's channels in pairs over two axes, so it needs "
                f"hidden_size / num_attention_heads divisible by 4, got {head_dim}"
            )

    def axes(self, grid):
        """The grid's axes in the order of the coordinate channels: (rows, columns), or (columns, rows) for `xy`."""
        return list(grid) if self.config.rope_grid_indexing == "ij" else [grid[1], grid[0]]

    def stack(self, values, grid):
        """(gh * gw, 2) coordinates, row-major over the patches, from each axis's values (in `axes` order)."""
        ij = self.config.rope_grid_indexing == "ij"
        mesh = torch.meshgrid(values, indexing="ij" if ij else "xy")
        return torch.stack(mesh, dim=-1).reshape(grid[0] * grid[1], 2)

    def augment(self, coordinates):
        """DINOv3's training-time coordinate augmentations, in its order (shift, per-axis jitter, shared rescale),
        drawn once per forward pass (`draws`, forgotten by `Positions.embed`) and shared by every block."""
        config = self.config
        if self.draws is None:
            draws = []
            if config.rope_shift_coords is not None:
                shift = config.rope_shift_coords
                draws.append(("add", torch.empty(2, device=coordinates.device).uniform_(-shift, shift)))
            for name, size in (("rope_jitter_coords", 2), ("rope_rescale_coords", 1)):
                if getattr(config, name) is not None:
                    limit = math.log(getattr(config, name))
                    draws.append(("mul", torch.empty(size, device=coordinates.device).uniform_(-limit, limit).exp()))
            self.draws = draws
        for operation, value in self.draws:
            coordinates = coordinates + value if operation == "add" else coordinates * value
        return coordinates

    @property
    def augments(self):
        config = self.config
        return any(
            v is not None for v in (config.rope_shift_coords, config.rope_jitter_coords, config.rope_rescale_coords)
        )

    def coordinates(self, grid, device):
        """(gh * gw, 2) float32 coordinates of the patches, row-major, channels in `axes` order."""
        raise NotImplementedError

    def angles(self, coordinates):
        """(gh * gw, head_dim / 2) angles, the first half for the first coordinate channel."""
        raise NotImplementedError

    def sin_cos(self, grid, device, training):
        """Sines and cosines (gh * gw, head_dim) in the kind's pair layout."""
        training = training and self.augments
        cached = not training and not is_tracing()
        key = (int(grid[0]), int(grid[1]), str(device)) if cached else None
        if cached and key in self.cache:
            return self.cache[key]
        coordinates = self.coordinates(grid, device)
        angles = self.angles(self.augment(coordinates) if training else coordinates)
        angles = torch.cat([angles, angles], dim=-1) if self.rotate_half else angles.repeat_interleave(2, dim=-1)
        values = (angles.sin(), angles.cos())
        if cached:
            self.cache[key] = values
        return values

    def partner(self, x):
        """The channel each channel is turned towards, signed: (-x_{i+d/2}, x_i) halves or (-x_2i+1, x_2i) pairs."""
        if self.rotate_half:
            first, second = x.chunk(2, dim=-1)
            return torch.cat([-second, first], dim=-1)
        return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape(x.shape)

    def turn(self, x, sin, cos):
        """`x` (B, H, T, d) with its last (gh * gw) tokens turned by `sin`, `cos` ((H,) gh * gw, d)."""
        prefix = x.shape[2] - sin.shape[-2]
        patches = x[:, :, prefix:]
        turned = (patches * cos + self.partner(patches) * sin).to(x.dtype)
        return torch.cat([x[:, :, :prefix], turned], dim=2)

    def rotate(self, attention, query, key, grid):
        sin, cos = self.sin_cos(grid, query.device, attention.training)
        return self.turn(query, sin, cos), self.turn(key, sin, cos)


class AxialRotary(RotaryKind):
    """timm's `RotaryEmbeddingCat` as EVA-02, Perception Encoder and the naver/sbb `rope` ViTs use it: integer
    patch coordinates plus `rope_grid_offset`, scaled onto `rope_reference_grid` where set (EVA's
    `ref_feat_shape`: a model fine-tuned at 448 px keeps the angles of its 224 px pre-training), turned at
    1 / temperature^(i / n) radians per unit for pair i of n per axis; neighbouring pairs by default."""

    rope_type = "axial"
    description = "rotary, integer coordinates (timm RotaryEmbeddingCat: EVA-02, PE, RoPE-ViT)"

    def coordinates(self, grid, device):
        reference = self.config.rope_reference_grid
        values = []
        for size, ref in zip(self.axes(grid), self.axes(reference) if reference else (None, None)):
            axis = torch.arange(size, device=device, dtype=torch.int64).to(torch.float32) + self.config.rope_grid_offset
            values.append(axis if ref is None else axis / size * ref)
        return self.stack(values, grid)

    def angles(self, coordinates):
        bands = self.head_dim // 4
        exponent = torch.arange(0, bands, 1, dtype=torch.int64, device=coordinates.device).to(torch.float32) / bands
        frequencies = 1.0 / (self.temperature**exponent)
        return (coordinates[:, :, None] * frequencies).flatten(1)


class DinoV3Rotary(RotaryKind):
    """DINOv3's rotary embedding (timm `RotaryEmbeddingDinoV3`, transformers' DINOv3 ViT): patch centres
    normalised to [-1, 1] per axis (`rope_normalize_coords`), turned at 2 pi / period radians per unit with periods
    temperature^(2i / (head_dim / 2)) from base 100, halves paired by default; while training, one random shift,
    per-axis jitter and shared rescale of the coordinates per forward pass where `rope_shift_coords`,
    `rope_jitter_coords`, `rope_rescale_coords` are set."""

    rope_type = "dinov3"
    description = "rotary, patch centres in [-1, 1] (DINOv3)"
    default_temperature = 100.0
    default_rotate_half = True

    def coordinates(self, grid, device):
        axes = self.axes(grid)
        normalize = self.config.rope_normalize_coords
        if normalize == "separate":
            denominators = axes
        else:
            denominators = [(torch.sym_max if normalize == "max" else torch.sym_min)(*axes)] * 2
        values = [
            (torch.arange(0.5, size, device=device, dtype=torch.float32) + self.config.rope_grid_offset) / denominator
            for size, denominator in zip(axes, denominators)
        ]
        return 2.0 * self.stack(values, grid) - 1.0

    def angles(self, coordinates):
        bands = self.head_dim // 4
        exponents = 2.0 * torch.arange(bands, device=coordinates.device, dtype=torch.float32) / (self.head_dim // 2)
        periods = self.temperature**exponents
        return (2 * math.pi * coordinates[:, :, None] / periods[None, None, :]).flatten(1)


def mixed_frequencies(head_dim, num_heads, temperature, generator=None):
    """(2, H, head_dim / 2) frequencies of RoPE-Mixed at initialisation: the axial magnitudes turned by a random
    angle per head (Heo et al., "Rotary Position Embedding for Vision Transformer"), as timm and naver's code."""
    magnitude = 1.0 / (temperature ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim))
    angle = torch.rand(num_heads, 1, generator=generator) * 2 * torch.pi
    along_x = torch.cat([magnitude * torch.cos(angle), magnitude * torch.cos(angle + torch.pi / 2)], dim=-1)
    along_y = torch.cat([magnitude * torch.sin(angle), magnitude * torch.sin(angle + torch.pi / 2)], dim=-1)
    return torch.stack([along_x, along_y])


class MixedRotary(RotaryKind):
    """RoPE-Mixed (timm `RotaryEmbeddingMixed`, naver's RoPE-ViT): each block learns, per head and pair, a
    frequency along each coordinate axis (`attention.rope_frequencies`, (2, H, head_dim / 2)), so a pair turns by
    a learned mix of row and column; integer coordinates, neighbouring pairs."""

    rope_type = "mixed"
    description = "rotary with learned per-block, per-head frequencies (RoPE-Mixed)"
    learned = True
    default_temperature = 10.0

    @classmethod
    def check(cls, config):
        super().check(config)
        if config.rope_rotate_half:
            raise ValueError("rope_type='mixed' pairs neighbouring channels; rope_rotate_half=True is not supported")

    @classmethod
    def block_parameters(cls, config):
        return [("attention.rope_frequencies", config.hidden_size)]

    def build_attention(self, attention):
        attention.rope_frequencies = nn.Parameter(torch.zeros(2, attention.num_heads, attention.head_dim // 2))

    def init_attention(self, attention, init):
        values = mixed_frequencies(attention.head_dim, attention.num_heads, self.temperature)
        copy = getattr(init, "copy_", None)  # transformers 5's initialisers skip weights loaded from a checkpoint
        if copy is not None:
            copy(attention.rope_frequencies, values)
        else:
            with torch.no_grad():
                attention.rope_frequencies.copy_(values)

    def coordinates(self, grid, device):
        values = [torch.arange(size, device=device, dtype=torch.int64).to(torch.float32) for size in self.axes(grid)]
        return self.stack(values, grid)

    def rotate(self, attention, query, key, grid):
        coordinates = self.coordinates(grid, query.device)
        if attention.training and self.augments:
            coordinates = self.augment(coordinates)
        frequencies = attention.rope_frequencies.float()
        angles = coordinates[:, 0, None] * frequencies[0][:, None] + coordinates[:, 1, None] * frequencies[1][:, None]
        angles = angles.repeat_interleave(2, dim=-1)
        sin, cos = angles.sin(), angles.cos()
        return self.turn(query, sin, cos), self.turn(key, sin, cos)


class Positions:
    """What the embeddings and every attention layer call: the configured position kind, and the rotary kind beside
    it where `rope_type` is set (EVA-02: a learned table and rotation; DINOv3: rotation alone)."""

    def __init__(self, config):
        self.kind = config.position_kind(config)
        self.rotary = config.rotary_kind(config) if config.rotary_kind is not None else None
        self.parts = [part for part in (self.kind, self.rotary) if part is not None]

    def __getattr__(self, name):
        """Hooks on the embeddings (`build`, `embed`, `patch_table`, `resize`, ...) and the bias hooks are the
        position kind's."""
        if name in ("kind", "rotary", "parts") or name.startswith("__"):  # before `__init__` (copy, pickle)
            raise AttributeError(name)
        return getattr(self.kind, name)

    def embed(self, embeddings, prefix, patches, grid):
        """The position kind's `embed`; a new forward pass, so the rotary kind draws its augmentations anew."""
        if self.rotary is not None:
            self.rotary.draws = None
        return self.kind.embed(embeddings, prefix, patches, grid)

    def build_attention(self, attention):
        for part in self.parts:
            part.build_attention(attention)

    def init_attention(self, attention, init):
        for part in self.parts:
            part.init_attention(attention, init)

    def resize_attention(self, attention, new_grid):
        for part in self.parts:
            part.resize_attention(attention, new_grid)

    def rotate(self, attention, query, key, grid):
        for part in self.parts:
            query, key = part.rotate(attention, query, key, grid)
        return query, key
