"""How a model's images are prepared (`Preprocessing`) and the one builder of the image processor a hubvit folder
carries (`processor_for`), whoever writes the folder (a conversion, fine-tuning, an export).

`ViTImageProcessor` only resizes the whole image to the model's resolution, which is not how timm, DeiT or
torchvision evaluate: they resize the shorter side to `size / crop_pct` and take a centre crop. transformers'
`BitImageProcessor` (the one DINOv2 folders carry) expresses both: `size={"shortest_edge": S}` with
`crop_size={"height": H, "width": W}` for resize-then-crop, `size={"height": H, "width": W}` without a crop for a
plain resize. One known difference stays: transformers' centre crop floors the offset `(resized - crop) / 2`,
torchvision's `CenterCrop` rounds it half to even, so where that margin is odd and its half rounds up the crop sits
one pixel higher or further left than the source's (tests/test_preprocessing.py measures it).
"""

import math
from dataclasses import dataclass, field

from transformers import BitImageProcessor

from .errors import ConversionError
from .limits import check_preprocessing

RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}
"""PIL's resample ids (what `ViTImageProcessor.resample` holds) by the names timm and the CLI use."""
RESAMPLE_IDS = {name: index for index, name in RESAMPLE_NAMES.items()}


def resample_name(value, where="resample"):
    """The name ('bicubic', ...) of a PIL resample id or name, or `ConversionError` naming `where`."""
    name = RESAMPLE_NAMES.get(value) if isinstance(value, int) else str(value).lower()
    if name not in RESAMPLE_IDS:
        raise ConversionError(f"{where}={value!r}; expected one of {sorted(RESAMPLE_IDS)} (or PIL ids 0-3)")
    return name


@dataclass
class Preprocessing:
    """How the source feeds images to the model at evaluation; `preprocessing.processor_for` turns it into the
    folder's image processor (the one place that builds it).

    `size` (height, width) is what the model sees, by default its resolution. `crop_pct` None: the whole image is
    resized to `size` (the original JAX fine-tuning); otherwise timm's eval transform: resize to size / crop_pct
    (`crop_mode` 'center': the shorter side, 'squash': both sides; 'border' as timm names it), then centre crop
    `size`. `processor`: the source's own transformers image processor, saved as it is (a transformers SRC that has
    one). `notes` say where the folder's processor differs from the source's.
    """

    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    resample: str = "bilinear"
    size: tuple | None = None
    crop_pct: float | None = None
    crop_mode: str = "center"
    processor: object | None = None
    notes: list = field(default_factory=list)


def image_processor(crop_size, resize_to, resample, mean, std):
    """A `BitImageProcessor`: resize (`resize_to` an int = shorter side, a pair = exact size), centre crop, normalise.

    `crop_size` None means no crop. Images are converted to RGB first, as every source pipeline does.
    """
    if isinstance(resize_to, int):
        size = {"shortest_edge": int(resize_to)}
    else:
        size = {"height": int(resize_to[0]), "width": int(resize_to[1])}
    crop = {"height": int(crop_size[0]), "width": int(crop_size[1])} if crop_size else None
    return BitImageProcessor(
        do_resize=True,
        size=size,
        resample=RESAMPLE_IDS[resample_name(resample, "interpolation")],
        do_center_crop=crop is not None,
        crop_size=crop or {"height": size.get("height", 0), "width": size.get("width", 0)},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[float(m) for m in mean],
        image_std=[float(s) for s in std],
        do_convert_rgb=True,
    )


def expressible(preprocessing: Preprocessing, size):
    """Whether a transformers processor does what the source does: a plain resize, timm's 'squash', or its
    'center' crop of a square input ('border' and non-square 'center', timm's ResizeKeepRatio, have none)."""
    height, width = size
    mode = preprocessing.crop_mode
    return preprocessing.crop_pct is None or mode == "squash" or (mode == "center" and height == width)


def patch_budget_processor(patch_size, max_num_patches, resample, mean, std):
    """SigLIP 2's NaFlex `Siglip2ImageProcessor`: each image at its aspect ratio within `max_num_patches` patches,
    cut into patches, with the mask and grid the model reads (a folder trained with `--max_num_patches`); grayscale,
    RGBA and palette images converted to RGB first, which transformers' default leaves off."""
    from transformers import Siglip2ImageProcessor

    return Siglip2ImageProcessor(
        patch_size=patch_size,
        max_num_patches=max_num_patches,
        resample=RESAMPLE_IDS[resample_name(resample)],
        image_mean=list(mean),
        image_std=list(std),
        do_convert_rgb=True,
    )


def processor_for(preprocessing: Preprocessing, config):
    """The folder's image processor for a converter's `Preprocessing`: the source's own when it has one, else a
    `BitImageProcessor` doing the source's resize and crop (see `Preprocessing`)."""
    p = preprocessing
    check_preprocessing(p)
    if p.processor is not None:
        return p.processor
    height, width = p.size or config.image_size_2d
    if p.crop_pct is None or not expressible(p, (height, width)):
        return image_processor(None, (height, width), p.resample, p.mean, p.std)
    scaled = (math.floor(height / p.crop_pct), math.floor(width / p.crop_pct))
    if p.crop_mode == "squash":
        crop = None if scaled == (height, width) else (height, width)
        return image_processor(crop, scaled, p.resample, p.mean, p.std)
    return image_processor((height, width), scaled[0], p.resample, p.mean, p.std)


def describe(processor):
    """One sentence for the model card: what the processor does to an image."""
    size, resample = processor.size or {}, RESAMPLE_NAMES.get(processor.resample, str(processor.resample))
    budget = getattr(processor, "max_num_patches", None)
    if budget is not None:  # SigLIP 2's NaFlex processor
        p = processor.patch_size
        steps = (
            f"Resize, keeping the aspect ratio, to the largest size of at most {budget} patches of {p}x{p} "
            f"({resample}), cut into patches padded to {budget} with their mask and grid"
        )
    elif "shortest_edge" in size:
        steps = f"Resize the shorter side to {size['shortest_edge']} ({resample})"
    elif "height" in size:
        steps = f"Resize to {size['height']}x{size['width']} ({resample})"
    else:
        steps = f"Resize to {dict(size)} ({resample})"
    if getattr(processor, "do_center_crop", False) and processor.crop_size:
        crop = processor.crop_size
        steps += f", centre crop {crop['height']}x{crop['width']}"
    mean = [round(float(m), 4) for m in processor.image_mean]
    std = [round(float(s), 4) for s in processor.image_std]
    return (
        f"{steps}, scale to [0, 1], normalise with mean {mean} and std {std} "
        f"(`preprocessor_config.json`, transformers' `{type(processor).__name__.removesuffix('Pil')}`)."
    )
