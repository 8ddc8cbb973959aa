"""The two JAX ViT codebases in Flax (linen), with their original module names, for checking conversions.

`VisionTransformerOrig` follows google-research/vision_transformer (`vit_jax/models_vit.py`, the pre-Linen names of
the released `.npz` files: `MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3`,
`Transformer/posembed_input`); `VisionTransformerBV` follows google-research/big_vision (`big_vision/models/vit.py`:
Linen names, top-level `pos_embedding` without a [CLS] row, optional scanned blocks, `tok`/`gap`/`map`/`0` pooling,
`learn`/`sincos2d` position embeddings). Every module name is explicit, so the param tree is the checkpoint's and a
released file loads with `unflatten_dict`. `resize_posemb_orig`/`resize_posemb_bv` are the two codebases' own
fine-tuning resizes (scipy linear zoom).

`hubvit convert jax` runs these on the file it converts when jax and flax are installed (`pip install
'hubvit[jax]'`); the test suite checks them against timm's own `.npz` loader (tests/test_flax_reference.py).
GELU defaults to `nn.gelu` (tanh approximation) as in both originals. Inputs are NHWC.
"""

from typing import Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage

LN_EPS = 1e-6  # both codebases use Flax's default LayerNorm epsilon


# --------------------------------------------------------------------------
# Shared building blocks (names are parameters so both layouts can use them)
# --------------------------------------------------------------------------


class MlpBlock(nn.Module):
    """Dense -> GELU -> Dense, with the sub-layer names the checkpoints use."""

    mlp_dim: int
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        x = nn.Dense(self.mlp_dim, name="Dense_0")(x)
        x = nn.gelu(x, approximate=self.approximate_gelu)
        return nn.Dense(d, name="Dense_1")(x)


class EncoderBlock(nn.Module):
    """Pre-LN transformer block: x + MHSA(LN(x)), then x + MLP(LN(x)).

    ``names`` = (first LN, attention, second LN, MLP). The original checkpoints
    number them with one shared counter (0, 1, 2, 3); big_vision numbers them
    per type (0, 0, 1, 0).
    """

    mlp_dim: int
    num_heads: int
    names: Tuple[str, str, str, str]
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, x, mask=None):
        ln0, attn, ln1, mlp = self.names
        y = nn.LayerNorm(epsilon=LN_EPS, name=ln0)(x)
        y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, name=attn)(y, y, mask=mask)
        x = x + y
        y = nn.LayerNorm(epsilon=LN_EPS, name=ln1)(x)
        y = MlpBlock(self.mlp_dim, self.approximate_gelu, name=mlp)(y)
        # The (carry, output) pair lets the same module run under nn.scan.
        return x + y, None


ORIG_BLOCK_NAMES = ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
BV_BLOCK_NAMES = ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _patchify(images, width, patch_size):
    """The stride-P convolution `embedding`, flattened to tokens: ((n, h*w, width), (h, w))."""
    p = _pair(patch_size)
    x = nn.Conv(width, p, strides=p, padding="VALID", name="embedding")(images)
    n, h, w, c = x.shape
    return x.reshape(n, h * w, c), (h, w)


def _prepend_cls(module, x):
    """The learned `cls` token of `module` in front of every sequence."""
    cls = module.param("cls", nn.initializers.zeros, (1, 1, x.shape[-1]))
    return jnp.concatenate([jnp.tile(cls, (x.shape[0], 1, 1)), x], axis=1)


def _head(module, x, num_classes, rep_size):
    """Optional ``pre_logits`` (Dense + tanh), then optional ``head``."""
    module.sow("intermediates", "pooled", x)
    if rep_size:
        x = jnp.tanh(nn.Dense(rep_size, name="pre_logits")(x))
    if num_classes:
        x = nn.Dense(num_classes, name="head")(x)
    return x


# --------------------------------------------------------------------------
# google-research/vision_transformer layout
# --------------------------------------------------------------------------


class AddPositionEmbs(nn.Module):
    """Learned table over the full sequence (cls row included when present)."""

    @nn.compact
    def __call__(self, x):
        pe = self.param("pos_embedding", nn.initializers.normal(0.02), (1,) + x.shape[1:])
        return x + pe


class EncoderOrig(nn.Module):
    """``Transformer``: position embedding, blocks, ``encoder_norm``."""

    num_layers: int
    mlp_dim: int
    num_heads: int
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, x):
        x = AddPositionEmbs(name="posembed_input")(x)
        for i in range(self.num_layers):
            x, _ = EncoderBlock(
                self.mlp_dim, self.num_heads, ORIG_BLOCK_NAMES, self.approximate_gelu, name=f"encoderblock_{i}"
            )(x)
        return nn.LayerNorm(epsilon=LN_EPS, name="encoder_norm")(x)


class VisionTransformerOrig(nn.Module):
    """ViT as released in google-research/vision_transformer.

    classifier='token': cls prepended *before* the position table is added
    (table has N+1 rows) and row 0 is pooled; 'gap': no cls parameter, the
    table has N rows, pooled = mean over all tokens after ``encoder_norm``.
    """

    num_classes: Optional[int] = 1000
    patch_size: Union[int, Sequence[int]] = 16
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    classifier: str = "token"
    representation_size: Optional[int] = None
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, images):
        x, _ = _patchify(images, self.hidden_size, self.patch_size)
        if self.classifier == "token":
            x = _prepend_cls(self, x)
        elif self.classifier != "gap":
            raise ValueError(f"unknown classifier {self.classifier!r}")
        x = EncoderOrig(self.num_layers, self.mlp_dim, self.num_heads, self.approximate_gelu, name="Transformer")(x)
        self.sow("intermediates", "encoded", x)
        x = x[:, 0] if self.classifier == "token" else x.mean(axis=1)
        return _head(self, x, self.num_classes, self.representation_size)


# --------------------------------------------------------------------------
# google-research/big_vision layout
# --------------------------------------------------------------------------


def posemb_sincos_2d(h, w, width, temperature=10_000.0):
    """big_vision's fixed table, (1, h*w, width): [sin x, cos x, sin y, cos y].

    Rows run over the grid in row-major order (y outer, x inner); note the
    ``width/4 - 1`` denominator (timm's own sincos helper divides by width/4).
    """
    assert width % 4 == 0, "sincos2d needs width divisible by 4"
    y, x = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4 - 1))
    x = x.reshape(-1)[:, None] * omega[None]
    y = y.reshape(-1)[:, None] * omega[None]
    pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    return jnp.asarray(pe, jnp.float32)[None]


class EncoderBV(nn.Module):
    """``Transformer``: blocks (unrolled or scanned) and ``encoder_norm``."""

    depth: int
    mlp_dim: int
    num_heads: int
    scan: bool = False
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, x, mask=None):
        """`mask` (B, 1, N, N): which token pairs attend (NaFlex: patches among patches), None for all."""
        args = (self.mlp_dim, self.num_heads, BV_BLOCK_NAMES, self.approximate_gelu)
        if self.scan:
            # One module 'encoderblock' whose params carry a leading depth axis; the mask is the same for each.
            blocks = nn.scan(
                EncoderBlock,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=nn.broadcast,
                length=self.depth,
            )
            x, _ = blocks(*args, name="encoderblock")(x, mask)
        else:
            for i in range(self.depth):
                x, _ = EncoderBlock(*args, name=f"encoderblock_{i}")(x, mask)
        return nn.LayerNorm(epsilon=LN_EPS, name="encoder_norm")(x)


class MAPHead(nn.Module):
    """Multihead attention pooling: a learned probe attends over the tokens."""

    mlp_dim: int
    num_heads: int
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, x, valid=None):
        n, _, d = x.shape
        probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, d))
        probe = jnp.tile(probe, (n, 1, 1))
        mask = None if valid is None else valid[:, None, None, :]
        attention = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, name="MultiHeadDotProductAttention_0")
        x = attention(probe, x, mask=mask)
        y = nn.LayerNorm(epsilon=LN_EPS, name="LayerNorm_0")(x)
        x = x + MlpBlock(self.mlp_dim, self.approximate_gelu, name="MlpBlock_0")(y)
        return x[:, 0]


class VisionTransformerBV(nn.Module):
    """ViT as in big_vision: position table (N rows) added *before* cls.

    pool_type: 'tok' (cls param, row 0), 'gap' (mean, no cls), 'map'
    (``MAPHead_0``), '0' (first patch token, no cls). posemb: 'learn' (param
    ``pos_embedding``) or 'sincos2d' (fixed, no param). ``rep_size`` True means
    width. ``scan=True`` stores blocks under ``Transformer/encoderblock``.
    """

    num_classes: Optional[int] = 1000
    patch_size: Union[int, Sequence[int]] = 16
    width: int = 768
    depth: int = 12
    mlp_dim: int = 3072
    num_heads: int = 12
    posemb: str = "learn"
    rep_size: Union[int, bool] = False
    pool_type: str = "gap"
    scan: bool = False
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, images):
        x, (h, w) = _patchify(images, self.width, self.patch_size)
        c = self.width
        if self.posemb == "learn":
            pe = self.param("pos_embedding", nn.initializers.normal(1 / np.sqrt(c)), (1, h * w, c))
        elif self.posemb == "sincos2d":
            pe = posemb_sincos_2d(h, w, c)
        else:
            raise ValueError(f"unknown posemb {self.posemb!r}")
        x = x + pe
        if self.pool_type == "tok":
            x = _prepend_cls(self, x)
        x = EncoderBV(self.depth, self.mlp_dim, self.num_heads, self.scan, self.approximate_gelu, name="Transformer")(x)
        self.sow("intermediates", "encoded", x)
        if self.pool_type == "map":
            x = MAPHead(self.mlp_dim, self.num_heads, self.approximate_gelu, name="MAPHead_0")(x)
        elif self.pool_type == "gap":
            x = x.mean(axis=1)
        elif self.pool_type in ("tok", "0"):
            x = x[:, 0]
        else:
            raise ValueError(f"unknown pool_type {self.pool_type!r}")
        rep = self.width if self.rep_size is True else self.rep_size
        return _head(self, x, self.num_classes, rep)


# --------------------------------------------------------------------------
# google-research/big_vision NaFlex layout (models/proj/image_text/naflex_vit.py)
# --------------------------------------------------------------------------


def posemb_naflex(table, shapes, coords, canvas):
    """Each patch's row of big_vision NaFlex's (n, n, D) table: per image the table is scaled by (rows, columns) / n
    into a (canvas, canvas) grid (`jax.image.scale_and_translate`, bilinear with antialias) and read at the
    patch's (row, column); what falls outside the canvas reads 0."""

    def one(shape, where):
        scale = shape.astype(jnp.float32) / jnp.asarray(table.shape[:2], jnp.float32)
        grid = jax.image.scale_and_translate(
            table, (canvas, canvas, table.shape[-1]), (0, 1), scale, jnp.zeros(2), "bilinear", antialias=True
        )
        return grid.at[where[:, 0], where[:, 1]].get(mode="fill", fill_value=0)

    return jax.vmap(one)(shapes, coords)


class VisionTransformerNaFlex(nn.Module):
    """big_vision's NaFlex ViT: input (patches (B, N, P*P*C) in (row, column, channel) order, ptype (B, N), 1 for a
    patch and 0 for padding, each patch's row and column); a Dense `embedding`, optional `patchln_pre` (on the
    pixels) and `patchln_post` (on the embeddings), the `pos_embedding` grid resized per image (`posemb_naflex`),
    blocks attending among patches only (looped or scanned), `encoder_norm`, and pooling that skips padding:
    'gap' (masked mean), 'map' (`MAPHead_0` over patches), 'max'."""

    num_classes: Optional[int] = 1000
    width: int = 768
    depth: int = 12
    mlp_dim: int = 3072
    num_heads: int = 12
    posemb_side: int = 16
    canvas: int = 64
    pool_type: str = "map"
    rep_size: Union[int, bool] = False
    scan: bool = False
    patchln_pre: bool = False
    patchln_post: bool = False
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, inputs):
        patches, ptype, rows, columns = inputs
        if self.patchln_pre:
            patches = nn.LayerNorm(epsilon=LN_EPS, name="patchln_pre")(patches)
        x = nn.Dense(self.width, name="embedding")(patches)
        if self.patchln_post:
            x = nn.LayerNorm(epsilon=LN_EPS, name="patchln_post")(x)
        side = self.posemb_side
        table = self.param("pos_embedding", nn.initializers.normal(1 / np.sqrt(self.width)), (side, side, self.width))
        coords = jnp.stack([rows, columns], axis=-1)
        x = x + posemb_naflex(table, coords.max(axis=1) + 1, coords, self.canvas)
        valid = ptype == 1
        mask = jnp.logical_and(valid[:, None, :, None], valid[:, None, None, :])
        encoder = EncoderBV(
            self.depth, self.mlp_dim, self.num_heads, self.scan, self.approximate_gelu, name="Transformer"
        )
        x = encoder(x, mask)
        self.sow("intermediates", "encoded", x)
        if self.pool_type == "map":
            x = MAPHead(self.mlp_dim, self.num_heads, self.approximate_gelu, name="MAPHead_0")(x, valid)
        elif self.pool_type == "gap":
            x = (x * valid[..., None]).sum(axis=1) / valid.sum(axis=1, keepdims=True)
        elif self.pool_type == "max":
            x = jnp.where(valid[..., None], x, jnp.finfo(x.dtype).min).max(axis=1)
        else:
            raise ValueError(f"unknown pool_type {self.pool_type!r}")
        rep = self.width if self.rep_size is True else self.rep_size
        return _head(self, x, self.num_classes, rep)


def naflex_inputs(images, patch_size):
    """Whole NHWC images as big_vision NaFlex's input: every patch of the full grid, none padded."""
    n, h, w, c = images.shape
    rows, columns = h // patch_size, w // patch_size
    cut = images[:, : rows * patch_size, : columns * patch_size]
    cut = cut.reshape(n, rows, patch_size, columns, patch_size, c).transpose(0, 1, 3, 2, 4, 5)
    patches = cut.reshape(n, rows * columns, patch_size * patch_size * c)
    grid_rows, grid_columns = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
    ones = np.ones((n, rows * columns), np.int32)
    return patches, ones, ones * grid_rows.reshape(-1), ones * grid_columns.reshape(-1)


def run(model, params, images, intermediates=False):
    """``model.apply`` under ``jax.jit`` with XLA's backend optimizations off.

    For the tiny test models compiling dominates: an eager first call costs
    seconds, a default jit about 1 s of CPU, an unoptimized one about half.
    Returns numpy logits, or (logits, encoded, pooled) with ``intermediates``.
    """

    def fn(p, x):
        return model.apply({"params": p}, x, mutable=["intermediates"])

    out, state = jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0})(params, images)
    if not intermediates:
        return np.asarray(out)
    inter = state["intermediates"]
    return np.asarray(out), np.asarray(inter["encoded"][0]), np.asarray(inter["pooled"][0])


def _grid(new_grid):
    return (new_grid, new_grid) if isinstance(new_grid, int) else tuple(new_grid)


def _zoom_grid(grid_rows, new_grid):
    """(N, D) square grid -> (1, gh*gw, D) with scipy linear zoom (align-corners)."""
    gs_old = int(np.sqrt(len(grid_rows)))
    assert gs_old * gs_old == len(grid_rows), "old grid must be square"
    gh, gw = _grid(new_grid)
    grid = np.asarray(grid_rows).reshape(gs_old, gs_old, -1)
    grid = scipy.ndimage.zoom(grid, (gh / gs_old, gw / gs_old, 1), order=1)
    assert grid.shape[:2] == (gh, gw), grid.shape
    return grid.reshape(1, gh * gw, -1)


def resize_posemb_orig(posemb, new_grid, has_cls=True):
    """vision_transformer fine-tuning resize (``checkpoint.py``).

    posemb (1, [1+]N, D): the cls row (if ``has_cls``, i.e. classifier='token')
    is kept as is; the square grid is zoomed to ``new_grid`` (int or (h, w))
    with ``scipy.ndimage.zoom(order=1)``.
    """
    posemb = np.asarray(posemb)
    k = 1 if has_cls else 0
    return np.concatenate([posemb[:, :k], _zoom_grid(posemb[0, k:], new_grid)], axis=1)


def resize_posemb_bv(posemb, new_grid):
    """big_vision ``resample_posemb``: same zoom, the table has no cls row."""
    return _zoom_grid(np.asarray(posemb)[0], new_grid)
