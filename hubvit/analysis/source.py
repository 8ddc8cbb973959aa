"""What the analysis commands read: SRC (a hubvit folder, a Hub repo id or a preset such as `b/16`) and images."""

import math
import os
from pathlib import Path

from ..errors import HubViTError
from ..limits import check_config_sizes, open_image as open_bounded, regular_files
from ..presets import is_preset_name
from .info import preset_config

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def is_preset(src):
    return is_preset_name(src) and not os.path.exists(src)


def load_config(src, image_size=None):
    """The config of SRC; a preset gets `image_size` (default 224) as its native size."""
    if is_preset(src):
        config = preset_config(src, image_size=list(image_size) if image_size else 224)
        check_config_sizes(config, f"preset {src} at --image-size", image_size)
        return config
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(src)
    except (OSError, ValueError) as error:
        raise HubViTError(
            f"cannot read a config from {src!r} (a hubvit folder, Hub repo id or preset such as "
            f"'b/16' was expected): {str(error).splitlines()[0]}"
        ) from None
    if config.model_type != "hubvit":
        raise HubViTError(f"{src!r} is a {config.model_type!r} checkpoint; convert it first (`hubvit convert ...`)")
    check_config_sizes(config, f"{src}/config.json", image_size)
    return config


def has_head(config):
    """False for a folder saved from `HubViTModel` (the body alone), True for classifiers and presets."""
    architectures = getattr(config, "architectures", None) or []
    return not architectures or any(a.endswith("ForImageClassification") for a in architectures)


def load_model(src, image_size=None):
    """(model, image processor) in eval mode. A preset gets random weights (initialised as in the paper), which is
    what its numbers then describe."""
    from transformers import AutoImageProcessor, ViTImageProcessor

    from .. import HubViTForImageClassification, folder

    config = load_config(src, image_size)
    if is_preset(src):
        model = HubViTForImageClassification(config)
    else:
        model = folder.load(src, classifier=has_head(config))
    processor = None
    if not is_preset(src):
        try:
            processor = AutoImageProcessor.from_pretrained(src)
        except (OSError, ValueError):
            processor = None
    if processor is None:
        processor = ViTImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return model.eval(), processor


def image_files(folder):
    folder = Path(folder)
    if not folder.is_dir():
        raise HubViTError(f"--images {str(folder)!r} is not a folder of images")
    files = regular_files(sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES))
    if not files:
        raise HubViTError(f"--images {str(folder)!r} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    return files


def open_image(path):
    """A decoded PIL image, its file closed; a clear error for a file that is not an image, too many pixels or
    not a regular file."""
    return open_bounded(path, repr(str(path)))


def iter_images(images=None, dataset=None, split=None, image_column="image", max_images=None):
    """PIL images, one at a time, from a folder or a `datasets` dataset (Hub id, local script/folder, or a folder
    written by `save_to_disk`)."""
    count = 0
    if images is not None:
        source = (open_image(path) for path in image_files(images))
    else:
        source = (row[image_column] for row in open_dataset(dataset, split, image_column))
    for image in source:
        if max_images is not None and count >= max_images:
            return
        count += 1
        yield image


def open_dataset(name, split, image_column):
    import datasets

    if Path(name).is_dir() and ((Path(name) / "dataset_info.json").exists() or (Path(name) / "state.json").exists()):
        data = datasets.load_from_disk(name)
    else:
        from ..training.checks import load_dataset

        data = load_dataset(name, flag="--dataset", **({"split": split} if split else {}))
    if isinstance(data, datasets.DatasetDict):
        chosen = split or ("validation" if "validation" in data else "test" if "test" in data else next(iter(data)))
        if chosen not in data:
            raise HubViTError(f"--split {chosen!r} is not in {name!r}; it has {list(data)}")
        data = data[chosen]
    if image_column not in data.column_names:
        raise HubViTError(f"--image-column {image_column!r} is not in {name!r}; columns: {data.column_names}")
    return data


def pixel_batches(images, processor, config, batch_size, image_size=None):
    """Batches of pixel values at `image_size` (default: the model's native size), made by the model's processor."""
    size = tuple(image_size) if image_size else config.image_size_2d
    batch = []
    for image in images:
        batch.append(to_model_mode(image, config))
        if len(batch) == batch_size:
            yield preprocess(processor, batch, size)
            batch = []
    if batch:
        yield preprocess(processor, batch, size)


def to_model_mode(image, config):
    return image.convert("RGB" if config.num_channels == 3 else "L")


def preprocess(processor, images, size):
    """`images` as the model's processor prepares them, at `size`; a cropping processor (a conversion's timm or
    DINOv2 eval transform) keeps its resize-to-crop ratio, so the model still sees exactly `size`; a NaFlex
    processor's resize and normalisation give whole images."""
    height, width = size
    if getattr(processor, "max_num_patches", None) is not None:  # NaFlex: the analyses read whole images at `size`
        from ..preprocessing import image_processor

        processor = image_processor(None, size, processor.resample, processor.image_mean, processor.image_std)
    options = {"size": {"height": height, "width": width}}
    if getattr(processor, "do_center_crop", False):
        shorter = (processor.size or {}).get("shortest_edge")
        crop = processor.crop_size or {}
        if shorter and crop.get("height") and height == width:
            options["size"] = {"shortest_edge": math.floor(height * shorter / crop["height"])}
        options["crop_size"] = {"height": height, "width": width}
    return processor(images=images, return_tensors="pt", **options)["pixel_values"]
