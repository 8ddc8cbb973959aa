"""Test helpers around hubvit.conversion.flax_vit, the Flax models of the two JAX ViT codebases.

Build a tiny model, fill it with random values (:func:`randomize`), write it exactly as the original code would
(:func:`flatten_to_npz`), convert it with hubvit and compare logits::

    model = VisionTransformerOrig(num_classes=10, patch_size=8, hidden_size=32,
                                  num_layers=2, num_heads=4, mlp_dim=64)
    params = random_params(model, image_size=32, seed=0)
    flatten_to_npz(params, 'w.npz')
    logits = run(model, params, images_nhwc)   # = model.apply({'params': params}, x)
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from hubvit.conversion.flax_vit import (
    BV_BLOCK_NAMES,
    ORIG_BLOCK_NAMES,
    VisionTransformerBV,
    _grid,
    VisionTransformerOrig,
    posemb_sincos_2d,
    resize_posemb_bv,
    resize_posemb_orig,
    run,
)


def _fan_in(path, shape):
    """Input size of a kernel, read from the end so a scan depth axis is ignored."""
    parent = path[-2] if len(path) > 1 else ""
    if parent == "embedding":  # conv HWIO
        return int(np.prod(shape[-4:-1]))
    if parent in ("query", "key", "value"):  # (D, H, D/H)
        return shape[-3]
    if parent == "out":  # (H, D/H, D)
        return shape[-3] * shape[-2]
    return shape[-2]  # Dense (in, out)


def randomize(params, seed=0):
    """Replace every array with random values, none equal to 0 or 1.

    Init values (zero cls/head, unit LN scales, zero biases) hide transposes
    and missing keys; random values of the right scale expose them while
    keeping activations O(1) through a few layers: LN scales 1 + 0.1 N, biases
    0.1 N, kernels N / sqrt(fan_in), cls/pos/probe 0.5 N. ``params`` may hold
    arrays or anything with a ``.shape`` (``jax.eval_shape`` output). Returns
    a nested dict of float32 numpy arrays with the same structure.
    """
    rng = np.random.default_rng(seed)
    flat = traverse_util.flatten_dict(params)
    out = {}
    for path in sorted(flat):
        shape = tuple(flat[path].shape)
        z = rng.standard_normal(shape)
        name = path[-1]
        if name == "scale":
            v = 1.0 + 0.1 * z
        elif name == "bias":
            v = 0.1 * z
        elif name == "kernel":
            v = z / np.sqrt(_fan_in(path, shape))
        else:  # cls, pos_embedding, probe
            v = 0.5 * z
        out[path] = v.astype(np.float32)
    return traverse_util.unflatten_dict(out)


def random_params(model, image_size, seed=0, channels=3):
    """Randomized params for ``model`` at ``image_size`` (int or (h, w)).

    Uses ``jax.eval_shape`` for the tree, so nothing is computed by ``init``
    (eager Flax init on CPU costs seconds even for tiny models).
    """
    h, w = _grid(image_size)
    x = jax.ShapeDtypeStruct((1, h, w, channels), jnp.float32)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)["params"]
    return randomize(shapes, seed)


def flatten_params(params, prefix=""):
    """Nested params -> {'prefix' + 'a/b/c': np.ndarray}."""
    flat = traverse_util.flatten_dict(params, sep="/")
    return {prefix + k: np.asarray(v) for k, v in flat.items()}


def to_bfloat16(params):
    """Round every array to bfloat16 and back to float32 (what a bf16 file holds)."""
    import ml_dtypes

    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {k: np.asarray(v).astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in flat.items()}
    )


def flatten_to_npz(params, path, prefix="", bfloat16_as_void=False):
    """Write params as the released checkpoints do: ``np.savez``, '/'-joined keys.

    prefix: '' (vision_transformer), 'params/' (big_vision), 'opt/target/'
    (old optimizer wrapper) or 'params/img/' (image tower of a two-tower model).
    bfloat16_as_void: store bf16 bit patterns as dtype 'V2', which is what
    ``np.savez`` of a bfloat16 array produces since numpy has no bf16 type.
    Returns the flat dict that was written.
    """
    flat = flatten_params(params, prefix)
    if bfloat16_as_void:
        import ml_dtypes

        flat = {k: v.astype(ml_dtypes.bfloat16).view(np.dtype("V2")) for k, v in flat.items()}
    np.savez(path, **flat)
    return flat
