"""Each source's own evaluation transform as a `Preprocessing` (timm, torchvision, the JAX fine-tuning,
transformers), which `hubvit.preprocessing.processor_for` writes as a transformers image processor."""

from pathlib import Path

from ..preprocessing import Preprocessing, expressible, image_processor, processor_for, resample_name
from .common import ConversionError

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT, DEFAULT_CROP_MODE, DEFAULT_INTERPOLATION = 0.875, "center", "bicubic"  # timm's resolve_data_config


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
