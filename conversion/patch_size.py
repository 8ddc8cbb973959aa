"""`hubvit convert ... --patch-size P`: the converted model served at another patch size, and the card saying how.

The conversion is verified against the source at the source's patch size; then the patch embedding is PI-resized
(FlexiViT, "FlexiViT: One Model for All Patch Sizes", Beyer et al., CVPR 2023) with the pixel resize of the folder's
own preprocessing, and the position table follows the new grid with the checkpoint's interpolation. Where the new
patch is at least as large on both sides, the resize is exact for patch-wise upsampled images, and that property is
measured here and written on the card; a smaller patch has no exact counterpart, and the card says so.
"""

import torch

from ..errors import HubViTError

PATCH_RESIZE_TOLERANCE = 1e-4


class PatchSizeError(HubViTError):
    """A --patch-size value that is not a patch size, or does not fit the model."""


def parse_patch_size(text):
    """`16` or `16x8` (height x width) as an int or an (h, w) tuple."""
    parts = str(text).lower().split("x")
    if len(parts) not in (1, 2) or not all(p.strip().isdecimal() and int(p) > 0 for p in parts):
        raise PatchSizeError(f"patch_size={text!r}; expected a positive int or HEIGHTxWIDTH, e.g. 16 or 16x8")
    sizes = [int(p) for p in parts]
    return sizes[0] if len(sizes) == 1 or sizes[0] == sizes[1] else tuple(sizes)


def check_patch_size(value):
    """The `patch_size` keyword of the `convert_*` functions: None, a positive int, an (h, w) pair of them, or the
    flag's text ('16', '16x8'); an int or (h, w) tuple, or `PatchSizeError` naming the value."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_patch_size(value)
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pair):
        raise PatchSizeError(f"patch_size={value!r}; expected a positive int, an (height, width) pair or 'HxW' text")
    return pair[0] if pair[0] == pair[1] else pair


def patch_size_text(value):
    """The flag's text for a checked patch size: '16' or '16x8'."""
    return str(value) if isinstance(value, int) else f"{value[0]}x{value[1]}"


def resize_interpolation(resample):
    """The resize B to invert: the preprocessing's own where PI-resize supports it (PIL filters are antialiased)."""
    return resample if resample in ("bilinear", "bicubic") else "bicubic"


def upsample_each_patch(pixels, patch, new_patch, interpolation):
    from ..modeling.patch_resize_hubvit import resize_patch

    b, c, h, w = pixels.shape
    (ph, pw), (nh, nw) = patch, new_patch
    blocks = pixels.unfold(2, ph, ph).unfold(3, pw, pw)
    resized = resize_patch(blocks.double(), (nh, nw), interpolation, True).float()
    return resized.permute(0, 1, 2, 4, 3, 5).reshape(b, c, h // ph * nh, w // pw * nw)


@torch.no_grad()
def exact_property_check(model, new_patch, interpolation):
    """Relative max |logit difference| of the model at its patch size on a seeded random batch and the model at
    `new_patch` (resized on the fly) on the same batch with every patch upsampled to `new_patch`."""
    config = model.config
    old_patch = config.patch_size_2d
    pixels = torch.randn(2, config.num_channels, *config.image_size_2d, generator=torch.Generator().manual_seed(0))
    upsampled = upsample_each_patch(pixels, old_patch, new_patch, interpolation)
    options = model.hubvit.embeddings.patch_resize_options
    saved = dict(options)
    options.update(method="pi", interpolation=interpolation, antialias=True)
    try:
        expected = model(pixel_values=pixels).logits
        got = model(pixel_values=upsampled, patch_size=new_patch).logits
    finally:
        options.clear()
        options.update(saved)
    return ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()


def resize_converted(model, patch_size, resample):
    """PI-resize a verified converted `model` to `patch_size` in place; returns the card's paragraph about it."""
    from ..modeling.patch_resize_hubvit import patch_pair

    config = model.config
    old_patch, new_patch = config.patch_size_2d, patch_pair(patch_size, "patch_size")
    height, width = config.image_size_2d
    if height % new_patch[0] or width % new_patch[1]:
        raise PatchSizeError(
            f"patch_size={patch_size_text(patch_size)}: does not divide the model's image size {height}x{width}; "
            "expected a divisor of each side"
        )
    side = lambda p: f"{p[0]}x{p[1]}"  # noqa: E731
    if new_patch == old_patch:
        return f"Patch size: {side(old_patch)} as in the source (`--patch-size` asked for the same size)."
    interpolation = resize_interpolation(resample)
    check = None
    if new_patch[0] >= old_patch[0] and new_patch[1] >= old_patch[1] and config.pooling_kind.pools:
        check = exact_property_check(model, new_patch, interpolation)
        if not check <= PATCH_RESIZE_TOLERANCE:
            raise PatchSizeError(
                f"PI-resize from {side(old_patch)} to {side(new_patch)} broke the exact property: relative logit "
                f"difference {check:.3g} > {PATCH_RESIZE_TOLERANCE:g}; nothing was written"
            )
    old_grid = config.grid_size
    model.resize_patch_embeddings(new_patch, "pi", interpolation, True)
    grid = config.grid_size
    text = (
        f"Patch size: the source has {side(old_patch)} patches; this folder serves {side(new_patch)} patches "
        f"(`--patch-size`). The verification above ran at the source's patch size; then the patch-embedding kernel was "
        f'PI-resized as in "FlexiViT: One Model for All Patch Sizes" (Beyer et al., CVPR 2023): w_hat = pinv(B^T) w, '
        f"B the {interpolation} + antialias resize of the preprocessing, and the position table resized from the "
        f"{old_grid[0]}x{old_grid[1]} grid to {grid[0]}x{grid[1]} with the checkpoint's {config.interpolation_mode} "
        f"interpolation. `config.patch_resize` records the same."
    )
    if check is not None:
        text += (
            f" Exact-property check: on seeded random images, the source-size model and this one on the same images "
            f"with every patch upsampled to {side(new_patch)} give logits within {check:.2e} of their scale "
            f"(tolerance {PATCH_RESIZE_TOLERANCE:g}). Accuracy on natural images at the new patch size was not measured "
            f"here."
        )
    else:
        text += (
            " A smaller patch has no exact counterpart (the resize is a least-squares fit), so accuracy at the new "
            "patch size can differ from the source's and was not measured here."
        )
    return text
