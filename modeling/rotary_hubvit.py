"""Rotary position embeddings, one class per kind (`rope_type`): every block turns the patch tokens' queries and
keys by angles that grow with their row and column, beside whatever position kind the config names; and
`Positions`, the two together as the embeddings and the attention layers call them.

A rotary kind is a `PositionKind` (its hooks, its facts) in a registry of its own, `ROTARY_KINDS`, so a model may
have a learned table and a rotation (EVA-02, RoPE-ViT with APE) or a rotation alone (DINOv3).

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import math

import torch
from torch import nn

from .resize_hubvit import is_tracing
from .windows_hubvit import DecomposedRelativePositions
from .positions_hubvit import PositionKind, patch_positions

ROTARY_KINDS = {}


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
        self.temperature = config.rope_base
        self.rotate_half = config.rope_pairs_halves
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

    def axis_coordinates(self, index, axis, sizes):
        """The coordinates of patches at float positions `index` along coordinate channel `axis` (0 or 1) of a grid
        of `sizes` patches (both axes, in `axes` order): ints, or tensors broadcasting against `index` (patch
        sequences)."""
        raise NotImplementedError

    def coordinates(self, grid, device):
        """(gh * gw, 2) float32 coordinates of the patches, row-major, channels in `axes` order."""
        axes = self.axes(grid)
        values = [
            self.axis_coordinates(torch.arange(size, device=device, dtype=torch.int64).to(torch.float32), axis, axes)
            for axis, size in enumerate(axes)
        ]
        return self.stack(values, grid)

    def sequence_coordinates(self, shapes, length, device):
        """(B, length, 2) coordinates of a batch of patch sequences (`shapes` (B, 2)), each patch placed by
        `patch_positions` (the padding gets coordinates too, which the attention mask keeps out)."""
        row, column, rows, columns = patch_positions(shapes.to(device), length)
        pairs = (
            [(row, rows), (column, columns)]
            if self.config.rope_grid_indexing == "ij"
            else [(column, columns), (row, rows)]
        )
        sizes = [size for _, size in pairs]
        values = [self.axis_coordinates(index, axis, sizes) for axis, (index, _) in enumerate(pairs)]
        return torch.stack(values, dim=-1)

    def angles(self, coordinates):
        """(..., head_dim / 2) angles of (..., 2) coordinates, the first half for the first coordinate channel."""
        raise NotImplementedError

    def sin_cos(self, grid, device, training, length=None):
        """Sines and cosines (gh * gw, head_dim) in the kind's pair layout; for patch sequences (`grid` their
        (B, 2) shapes, `length` patches each) (B, 1, length, head_dim)."""
        training = training and self.augments
        sequences = isinstance(grid, torch.Tensor)
        cached = not training and not is_tracing() and not sequences
        key = (int(grid[0]), int(grid[1]), str(device)) if cached else None
        if cached and key in self.cache:
            return self.cache[key]
        coordinates = self.sequence_coordinates(grid, length, device) if sequences else self.coordinates(grid, device)
        angles = self.angles(self.augment(coordinates) if training else coordinates)
        angles = torch.cat([angles, angles], dim=-1) if self.rotate_half else angles.repeat_interleave(2, dim=-1)
        values = (angles.sin(), angles.cos())
        if sequences:
            values = tuple(value[:, None] for value in values)
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

    def patches_in(self, query):
        """How many of the tokens of `query` (B, H, T, d) are patches."""
        return query.shape[2] - self.config.num_prefix_tokens

    def rotate(self, attention, query, key, grid):
        """`grid`: the patch grid, or a batch of patch sequences' (B, 2) shapes (each image turned by its own)."""
        sin, cos = self.sin_cos(grid, query.device, attention.training, self.patches_in(query))
        return self.turn(query, sin, cos), self.turn(key, sin, cos)


class AxialRotary(RotaryKind):
    """timm's `RotaryEmbeddingCat` as EVA-02, Perception Encoder and the naver/sbb `rope` ViTs use it: integer
    patch coordinates plus `rope_grid_offset`, scaled onto `rope_reference_grid` where set (EVA's
    `ref_feat_shape`: a model fine-tuned at 448 px keeps the angles of its 224 px pre-training), turned at
    1 / temperature^(i / n) radians per unit for pair i of n per axis; neighbouring pairs by default."""

    rope_type = "axial"
    description = "rotary, integer coordinates (timm RotaryEmbeddingCat: EVA-02, PE, RoPE-ViT)"

    def axis_coordinates(self, index, axis, sizes):
        reference = self.config.rope_reference_grid
        values = index + self.config.rope_grid_offset
        return values if reference is None else values / sizes[axis] * self.axes(reference)[axis]

    def angles(self, coordinates):
        bands = self.head_dim // 4
        exponent = torch.arange(0, bands, 1, dtype=torch.int64, device=coordinates.device).to(torch.float32) / bands
        frequencies = 1.0 / (self.temperature**exponent)
        return (coordinates[..., None] * frequencies).flatten(-2)


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

    def axis_coordinates(self, index, axis, sizes):
        normalize = self.config.rope_normalize_coords
        denominator = sizes[axis]
        if normalize != "separate":
            tensors = isinstance(denominator, torch.Tensor)
            largest = normalize == "max"
            pick = (
                (torch.maximum if largest else torch.minimum)
                if tensors
                else (torch.sym_max if largest else torch.sym_min)
            )
            denominator = pick(*sizes)
        return 2.0 * ((index + 0.5 + self.config.rope_grid_offset) / denominator) - 1.0

    def angles(self, coordinates):
        bands = self.head_dim // 4
        exponents = 2.0 * torch.arange(bands, device=coordinates.device, dtype=torch.float32) / (self.head_dim // 2)
        periods = self.temperature**exponents
        return (2 * math.pi * coordinates[..., None] / periods).flatten(-2)


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

    def axis_coordinates(self, index, axis, sizes):
        return index

    def rotate(self, attention, query, key, grid):
        if isinstance(grid, torch.Tensor):
            coordinates = self.sequence_coordinates(grid, self.patches_in(query), query.device)[:, None]
        else:
            coordinates = self.coordinates(grid, query.device)
        if attention.training and self.augments:
            coordinates = self.augment(coordinates)
        frequencies = attention.rope_frequencies.float()
        along = [coordinates[..., axis, None] * frequencies[axis][:, None] for axis in (0, 1)]
        angles = along[0] + along[1]
        angles = angles.repeat_interleave(2, dim=-1)
        sin, cos = angles.sin(), angles.cos()
        return self.turn(query, sin, cos), self.turn(key, sin, cos)


def defines(part, hook):
    """Whether `part` does something at `hook`: it has the method, and it is not `PositionKind`'s no-op."""
    method = getattr(type(part), hook, None)
    return method is not None and method is not getattr(PositionKind, hook, None)


class Positions:
    """What the embeddings and every attention layer call: the configured position kind, the rotary kind beside it
    where `rope_type` is set (EVA-02: a learned table and rotation; DINOv3: rotation alone), and the decomposed
    relative positions where set (SAM).

    Every hook is listed here. The embeddings' hooks are the position kind's. The three an attention layer calls in
    each forward pass (`query_bias`, `rotate`, `logits_bias`) are bound once, to the one part that defines the hook
    or to a method that combines several, and are None where no part defines it: a block skips them without a call,
    and a part's hook is never silently left out."""

    def __init__(self, config):
        self.kind = config.position_kind(config)
        self.rotary = config.rotary_kind(config) if config.rotary_kind is not None else None
        decomposed = config.decomposed_relative_position
        self.decomposed = DecomposedRelativePositions(config) if decomposed else None
        self.parts = [part for part in (self.kind, self.rotary, self.decomposed) if part is not None]
        kind = self.kind
        self.description = kind.description
        self.build, self.init_weights, self.resize = kind.build, kind.init_weights, kind.resize
        self.patch_table, self.sequence_tables, self.bias_table = (
            kind.patch_table,
            kind.sequence_tables,
            kind.bias_table,
        )
        self.hooks = {
            hook: [getattr(part, hook) for part in self.parts if defines(part, hook)]
            for hook in ("build_attention", "init_attention", "resize_attention", "query_bias", "rotate", "logits_bias")
        }
        self.query_bias = self.bound("query_bias", self.query_terms)
        self.rotate = self.bound("rotate", self.rotate_all)
        self.logits_bias = self.bound("logits_bias", self.logits_terms)

    def bound(self, hook, combined):
        """The callable the attention layers call for `hook`: None, the one part's method, or `combined`."""
        parts = self.hooks[hook]
        return None if not parts else parts[0] if len(parts) == 1 else combined

    def embed(self, embeddings, prefix, patches, grid):
        """The position kind's `embed`; a new forward pass, so the rotary kind draws its augmentations anew."""
        if self.rotary is not None:
            self.rotary.draws = None
        return self.kind.embed(embeddings, prefix, patches, grid)

    def build_attention(self, attention):
        for hook in self.hooks["build_attention"]:
            hook(attention)

    def init_attention(self, attention, init):
        for hook in self.hooks["init_attention"]:
            hook(attention, init)

    def resize_attention(self, attention, new_grid):
        for hook in self.hooks["resize_attention"]:
            hook(attention, new_grid)

    def rotate_all(self, attention, query, key, grid):
        for hook in self.hooks["rotate"]:
            query, key = hook(attention, query, key, grid)
        return query, key

    def query_terms(self, attention, query, grid):
        return summed(hook(attention, query, grid) for hook in self.hooks["query_bias"])

    def logits_terms(self, attention, grid, num_tokens):
        return summed(hook(attention, grid, num_tokens) for hook in self.hooks["logits_bias"])


def summed(terms):
    """The sum of the terms that are not None, or None."""
    terms = [term for term in terms if term is not None]
    return None if not terms else sum(terms[1:], terms[0])


def check_rope_settings(config, defaults):
    """The rotary options (`defaults`: each `rope_*` field's default) name a grid of two positive sides, a positive
    temperature and augmentation factors each source accepts, and are given only with `rope_type`."""
    if config.rope_type is None:
        changed = sorted(name for name, value in defaults.items() if getattr(config, name) != value)
        if changed:
            raise ValueError(f"{', '.join(changed)} set without rope_type; expected rope_type in {list(ROTARY_KINDS)}")
        return
    grid = config.rope_reference_grid
    if grid is not None and (len(grid) != 2 or min(grid) <= 0):
        raise ValueError(f"rope_reference_grid={grid!r}; expected [rows, columns], both positive")
    limits = {"rope_temperature": 0.0, "rope_shift_coords": 0.0, "rope_jitter_coords": 1.0, "rope_rescale_coords": 1.0}
    for name, low in limits.items():
        value = getattr(config, name)
        strict = name == "rope_temperature"
        if value is not None and not (math.isfinite(value) and (value > low if strict else value >= low)):
            raise ValueError(f"{name}={value!r}; expected a finite number {'>' if strict else '>='} {low:g}")
    if not math.isfinite(config.rope_grid_offset):
        raise ValueError(f"rope_grid_offset={config.rope_grid_offset!r}; expected a finite number")
