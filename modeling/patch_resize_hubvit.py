"""One checkpoint at any patch size: FlexiViT's pseudo-inverse resize of the patch embedding (Beyer et al., 2023).

The encoder's parameters do not depend on the patch size P; only the stride-P kernel does. If a pixel resize of a
patch is the linear map x -> B x, a kernel w_hat with B^T w_hat = w gives <x, w> = <B x, w_hat> for every patch x, so
a model whose kernel is replaced by w_hat = pinv(B^T) w sees a resized image exactly as the original saw the original
one (when the resize upsamples; when it downsamples, pinv gives the least-squares kernel). B is built by resizing
each one-hot patch with `torch.nn.functional.interpolate`, the resize the preprocessing uses: `bilinear` or
`bicubic`, with `antialias` (PIL's filters; timm's default is bicubic + antialias) or without.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively by modeling_hubvit.py.
"""

from functools import lru_cache

import torch
import torch.nn.functional as F

PATCH_RESIZE_METHODS = ("pi", "interpolate")
PATCH_RESIZE_INTERPOLATIONS = ("bilinear", "bicubic")


def patch_pair(value, name="patch_size"):
    """An int or an (h, w) pair as a tuple of two positive ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f"{name} must be an int or an (height, width) pair of ints, got {value!r}")
    if min(pair) <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return pair


def check_resize_options(method, interpolation, antialias):
    if method not in PATCH_RESIZE_METHODS:
        raise ValueError(
            f"method={method!r} is not a patch-embedding resize; expected one of {list(PATCH_RESIZE_METHODS)}"
        )
    if interpolation not in PATCH_RESIZE_INTERPOLATIONS:
        raise ValueError(
            f"interpolation={interpolation!r} is not supported for the patch embedding; expected one of "
            f"{list(PATCH_RESIZE_INTERPOLATIONS)}"
        )
    if not isinstance(antialias, bool):
        raise ValueError(f"antialias must be True or False, got {antialias!r}")


def resize_patch(patches, new_size, interpolation="bicubic", antialias=True):
    """Resize (..., h, w) patches to `new_size` with the resize B that `pi_resize_matrix` inverts."""
    shape = patches.shape
    flat = patches.reshape(-1, 1, shape[-2], shape[-1])
    out = F.interpolate(flat, size=tuple(new_size), mode=interpolation, antialias=antialias, align_corners=False)
    return out.reshape(*shape[:-2], *new_size)


@lru_cache(maxsize=64)
def _pi_matrix_float64(old_size, new_size, interpolation, antialias):
    old_count = old_size[0] * old_size[1]
    basis = torch.eye(old_count, dtype=torch.float64).reshape(old_count, old_size[0], old_size[1])
    resize = resize_patch(basis, new_size, interpolation, antialias).reshape(old_count, -1).T  # B: (new, old)
    return torch.linalg.pinv(resize.T)  # (new, old): w_hat = pinv(B^T) w


@lru_cache(maxsize=64)
def _pi_matrix_on(old_size, new_size, interpolation, antialias, device, dtype):
    return _pi_matrix_float64(old_size, new_size, interpolation, antialias).to(device=device, dtype=dtype)


def pi_resize_matrix(old_size, new_size, interpolation="bicubic", antialias=True, device="cpu", dtype=torch.float32):
    """pinv(B^T), shape (new_h * new_w, old_h * old_w), for B the resize of an `old_size` patch to `new_size`.

    Built once in float64 per (sizes, interpolation, antialias) and cached, also per device and dtype, so that
    resizing on the fly in every training step costs one small matrix product.
    """
    old_size, new_size = patch_pair(old_size, "old patch size"), patch_pair(new_size, "new patch size")
    check_resize_options("pi", interpolation, antialias)
    return _pi_matrix_on(old_size, new_size, interpolation, antialias, torch.device(device), dtype)


def resize_patch_kernel(kernel, new_size, method="pi", interpolation="bicubic", antialias=True):
    """A (out, in, h, w) patch-embedding kernel for `new_size` patches; differentiable in `kernel`.

    `method="pi"`: FlexiViT's PI-resize, w_hat = pinv(B^T) w (computed in float32 or wider, returned in the kernel's
    dtype). `method="interpolate"`: the kernel resized as an image with the same interpolation, the plain baseline.
    """
    check_resize_options(method, interpolation, antialias)
    new_size = patch_pair(new_size)
    old_size = (kernel.shape[-2], kernel.shape[-1])
    if old_size == new_size:
        return kernel
    dtype = kernel.dtype if kernel.dtype in (torch.float32, torch.float64) else torch.float32
    if method == "interpolate":
        return resize_patch(kernel.to(dtype), new_size, interpolation, antialias).to(kernel.dtype)
    matrix = pi_resize_matrix(old_size, new_size, interpolation, antialias, kernel.device, dtype)
    flat = kernel.to(dtype).reshape(kernel.shape[0] * kernel.shape[1], old_size[0] * old_size[1])
    return (flat @ matrix.T).reshape(kernel.shape[0], kernel.shape[1], *new_size).to(kernel.dtype)


__all__ = [
    "PATCH_RESIZE_METHODS",
    "PATCH_RESIZE_INTERPOLATIONS",
    "pi_resize_matrix",
    "resize_patch",
    "resize_patch_kernel",
]
