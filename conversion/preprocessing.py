"""The source's own evaluation transform, written as a transformers image processor.

`ViTImageProcessor` only resizes the whole image to the model's resolution, which is not how timm, DeiT or
torchvision evaluate: they resize the shorter side to `size / crop_pct` and take a centre crop. transformers'
`BitImageProcessor` (the one DINOv2 folders carry) expresses both: `size={"shortest_edge": S}` with
`crop_size={"height": H, "width": W}` for resize-then-crop, `size={"height": H, "width": W}` without a crop for the
original JAX fine-tuning's plain resize. One known difference stays: transformers' centre crop floors the offset
`(resized - crop) / 2`, torchvision's `CenterCrop` rounds it half to even, so where that margin is odd and its half
rounds up the crop sits one pixel higher or further left than the source's (tests/test_preprocessing.py measures it).
"""

import math
from pathlib import Path

from transformers import BitImageProcessor

from ..limits import check_preprocessing
from .common import RESAMPLE_IDS, RESAMPLE_NAMES, ConversionError, Preprocessing, resample_name

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT, DEFAULT_CROP_MODE, DEFAULT_INTERPOLATION = 0.875, "center", "bicubic"  # timm's resolve_data_config


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


def timm_preprocessing(pretrained_cfg, input_size=None):
    """timm's eval transform (`transforms_imagenet_eval`) for a pretrained_cfg, as a `Preprocessing`.

    crop_mode 'center' with a square input: resize the shorter side to floor(size / crop_pct), centre crop.
    crop_mode 'squash': resize to floor(size / crop_pct) on each side, centre crop (crop_pct 1.0: plain resize).
    Where no transformers processor expresses it, the whole image is resized to the input size and a note says so.
    """
    cfg = dict(pretrained_cfg or {})
    height, width = (int(s) for s in (input_size or cfg.get("input_size") or (3, 224, 224))[-2:])
    interpolation = cfg.get("interpolation") or DEFAULT_INTERPOLATION
    result = Preprocessing(
        mean=tuple(cfg.get("mean") or IMAGENET_MEAN),
        std=tuple(cfg.get("std") or IMAGENET_STD),
        resample=resample_name(interpolation, "interpolation"),
        size=(height, width),
        crop_pct=cfg.get("crop_pct") or DEFAULT_CROP_PCT,
        crop_mode=cfg.get("crop_mode") or DEFAULT_CROP_MODE,
    )
    if not expressible(result, (height, width)):
        result.notes.append(
            f"timm evaluates with crop_mode={result.crop_mode!r}, crop_pct={result.crop_pct} at {height}x{width}, "
            f"which no transformers image processor expresses; the processor here resizes the whole image to "
            f"{height}x{width}"
        )
    return result


def from_timm(pretrained_cfg, input_size=None):
    """(processor, note or None) of timm's eval transform for a pretrained_cfg (`timm_preprocessing`)."""
    result = timm_preprocessing(pretrained_cfg, input_size)
    return processor_for(result, None), (result.notes[0] if result.notes else None)


def from_torchvision(weights):
    """torchvision's `weights.transforms()` (`ImageClassification`: resize shorter side, centre crop, normalise).

    `weights` is a weights enum member (e.g. `ViT_B_16_Weights.IMAGENET1K_V1`) or anything with `.transforms()`, or
    the transform itself.
    """
    transform = weights.transforms() if hasattr(weights, "transforms") else weights
    for name in ("crop_size", "resize_size", "interpolation", "mean", "std"):
        if not hasattr(transform, name):
            raise ConversionError(f"{transform!r}: expected torchvision's ImageClassification (no {name})")
    if getattr(transform, "antialias", True) is False:
        raise ConversionError("torchvision transform with antialias=False: transformers' processors always antialias")
    (crop,), (resize,) = list(transform.crop_size), list(transform.resize_size)
    interpolation = getattr(transform.interpolation, "value", transform.interpolation)
    return image_processor((crop, crop), int(resize), str(interpolation), transform.mean, transform.std)


def from_jax(image_size, resample="bilinear"):
    """The original JAX fine-tuning's eval: resize the whole image to the resolution, `(x - 127.5) / 127.5`.

    The JAX pipeline resizes with `tf.image.resize` (bilinear, no antialias); transformers' processors, like PIL,
    antialias when shrinking, so a large photograph differs slightly from what TensorFlow would give.
    """
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    return processor_for(Preprocessing(mean=(0.5,) * 3, std=(0.5,) * 3, resample=resample, size=size), None)


def from_transformers(folder):
    """The source folder's own image processor, as transformers loads its preprocessor_config.json (None without)."""
    if not (Path(folder) / "preprocessor_config.json").is_file():
        return None
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(folder))


def describe(processor):
    """One sentence for the model card: what the processor does to an image."""
    size, resample = processor.size, RESAMPLE_NAMES.get(processor.resample, str(processor.resample))
    if "shortest_edge" in size:
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
