"""The image processor a folder carries reproduces the source library's own evaluation transform.

Each setting builds the processor from the source's description (timm's pretrained_cfg, torchvision's weights
enum), saves it, loads it back with `AutoImageProcessor` (what a user of the folder gets) and compares its
`pixel_values` with the source library's transform (timm's `resolve_data_config` + `create_transform`,
torchvision's `weights.transforms()`) on real photographs shipped with scikit-image.

Tolerance: two 8-bit levels after normalisation, 2 x (1/255) / min(std). The sources resize the PIL image with
PIL; transformers' default (torchvision) backend resizes a uint8 tensor with torch's antialiased kernels. Both
resize in two separable passes (rows, then columns) and round each pass to 8 bits, PIL in fixed point and torch in
float, so a pixel can land one level apart per pass (measured: one level mostly, two on a few pixels of upsampled
bicubic images). The mean difference must stay below 5% of one such tolerance, so a systematic error (wrong size,
filter or crop, which moves the mean by 1e-2 or more) fails.

Known difference, measured rather than hidden: transformers' centre crop floors the offset (resized - crop) / 2,
torchvision's `CenterCrop` rounds it half to even. Where they disagree the test asserts that the processor's output
is the source's own resized image cropped one pixel off, and that it is not within tolerance of the source.
"""

import math

import pytest
import torch
from PIL import Image
from skimage import data
from torchvision.transforms import functional as tvF
from transformers import AutoImageProcessor

from hubvit.conversion import preprocessing
from hubvit.preprocessing import describe

timm = pytest.importorskip("timm")
from timm.data import create_transform, resolve_data_config  # noqa: E402
from torchvision.models import ViT_B_16_Weights  # noqa: E402

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def timm_cfg(name, **overrides):
    return {**timm.models.get_pretrained_cfg(name).to_dict(), **overrides}


# setting: (source description, kind). kind "timm": a pretrained_cfg; "torchvision": a weights enum member;
# "jax": timm's description of the original JAX eval (plain bilinear resize, mean = std = 0.5).
SETTINGS = {
    "timm_augreg_crop_pct_0.9": (timm_cfg("vit_base_patch16_224.augreg2_in21k_ft_in1k"), "timm"),
    "deit_resize_256_crop_224": (timm_cfg("deit_base_patch16_224.fb_in1k", crop_pct=0.875), "timm"),
    "timm_gap_256_crop_pct_0.95": (timm_cfg("vit_medium_patch16_gap_256.sw_in12k_ft_in1k"), "timm"),
    "timm_384_crop_pct_1.0": (timm_cfg("vit_base_patch16_384.augreg_in21k_ft_in1k"), "timm"),
    "torchvision_v1_bilinear": (ViT_B_16_Weights.IMAGENET1K_V1, "torchvision"),
    "torchvision_swag_e2e_bicubic": (ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1, "torchvision"),
    "jax_plain_resize": (
        dict(
            input_size=(3, 224, 224),
            crop_pct=1.0,
            crop_mode="squash",
            interpolation="bilinear",
            mean=(0.5,) * 3,
            std=(0.5,) * 3,
        ),
        "jax",
    ),
}


def source_transform(description, kind):
    """(the full transform, its resize step alone, crop size, mean, std) as the source library builds them."""
    if kind == "torchvision":
        preset = description.transforms()
        resize = lambda img: tvF.resize(  # noqa: E731
            img, preset.resize_size, interpolation=preset.interpolation, antialias=preset.antialias
        )
        return preset, resize, (preset.crop_size[0],) * 2, preset.mean, preset.std
    config = resolve_data_config(pretrained_cfg=description)
    transform = create_transform(**config)
    return transform, transform.transforms[0], tuple(config["input_size"][-2:]), config["mean"], config["std"]


def saved_processor(description, kind, tmp_path):
    if kind == "timm":
        processor, note = preprocessing.from_timm(description)
        assert note is None
    elif kind == "torchvision":
        processor = preprocessing.from_torchvision(description)
    else:
        processor = preprocessing.from_jax(description["input_size"][-1])
    processor.save_pretrained(tmp_path)
    return AutoImageProcessor.from_pretrained(tmp_path)


@pytest.mark.parametrize("photo", PHOTOS)
@pytest.mark.parametrize("setting", SETTINGS)
def test_pixel_values_match_the_source_transform(setting, photo, tmp_path):
    description, kind = SETTINGS[setting]
    transform, resize, (crop_h, crop_w), mean, std = source_transform(description, kind)
    processor = saved_processor(description, kind, tmp_path)
    image = Image.fromarray(getattr(data, photo)()).convert("RGB")
    ours = processor(images=image, return_tensors="pt")["pixel_values"][0]
    reference = transform(image)
    assert ours.shape == reference.shape
    tolerance = 2 * (1 / 255) / min(std) * 1.001

    resized = resize(image)
    margin_h, margin_w = resized.height - crop_h, resized.width - crop_w
    torchvision_offset = (int(round(margin_h / 2.0)), int(round(margin_w / 2.0)))
    floor_offset = (margin_h // 2, margin_w // 2)
    if torchvision_offset != floor_offset:
        shifted = tvF.normalize(tvF.to_tensor(tvF.crop(resized, *floor_offset, crop_h, crop_w)), list(mean), list(std))
        assert (ours - reference).abs().max() > tolerance  # the one-pixel shift is visible
        reference = shifted
    difference = (ours - reference).abs()
    assert difference.max() <= tolerance, f"max |Δ| {difference.max():.4g} > {tolerance:.4g}"
    assert difference.mean() <= 0.05 * tolerance, f"mean |Δ| {difference.mean():.3g}: a systematic difference"


def test_the_photos_exercise_both_crop_offsets():
    """At least one photo and setting hits the one-pixel crop difference, and most do not (the test sees both)."""
    hits = 0
    for description, kind in SETTINGS.values():
        _, resize, (crop_h, crop_w), _, _ = source_transform(description, kind)
        for photo in PHOTOS:
            resized = resize(Image.fromarray(getattr(data, photo)()).convert("RGB"))
            margins = (resized.height - crop_h, resized.width - crop_w)
            hits += any(int(round(m / 2.0)) != m // 2 for m in margins)
    assert 0 < hits < len(SETTINGS) * len(PHOTOS) / 2


def test_timm_settings_become_a_crop_processor():
    processor, _ = preprocessing.from_timm(timm_cfg("vit_base_patch16_224.augreg2_in21k_ft_in1k"))
    assert processor.size == {"shortest_edge": math.floor(224 / 0.9)} and processor.do_center_crop
    assert processor.crop_size == {"height": 224, "width": 224} and processor.resample == 3
    assert "shorter side to 248 (bicubic), centre crop 224x224" in describe(processor)


def test_unexpressible_timm_settings_say_what_they_do_instead():
    cfg = dict(input_size=(3, 224, 320), crop_pct=0.9, crop_mode="center", interpolation="bicubic")
    processor, note = preprocessing.from_timm(cfg)
    assert processor.size == {"height": 224, "width": 320} and not processor.do_center_crop
    assert "crop_mode='center'" in note and "224x320" in note


def test_refuses_an_unknown_interpolation():
    with pytest.raises(ValueError, match="interpolation='random'"):
        preprocessing.from_timm(dict(input_size=(3, 224, 224), interpolation="random"))


def test_a_transformers_source_keeps_its_own_processor(tmp_path):
    """A DINOv2 folder crops (shorter side 36, crop 32): the converted folder gives the very same pixel_values."""
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    from hubvit.cli import main as cli

    config = Dinov2Config(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    Dinov2Model(config).save_pretrained(tmp_path / "src")
    BitImageProcessor(
        size={"shortest_edge": 36},
        crop_size={"height": 32, "width": 32},
        resample=3,
        image_mean=list(preprocessing.IMAGENET_MEAN),
        image_std=list(preprocessing.IMAGENET_STD),
    ).save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    source, ours = (AutoImageProcessor.from_pretrained(tmp_path / name) for name in ("src", "out"))
    for photo in PHOTOS:
        image = Image.fromarray(getattr(data, photo)())
        assert torch.equal(
            ours(images=image, return_tensors="pt")["pixel_values"],
            source(images=image, return_tensors="pt")["pixel_values"],
        )
    assert "Resize the shorter side to 36 (bicubic), centre crop 32x32" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("mode", ["L", "RGBA", "P"])
def test_the_patch_budget_processors_hubvit_writes_take_grayscale_rgba_and_palette_images(mode):
    """The converters' SigLIP 2 processor and the one `hubvit train --max_num_patches` writes see the RGB image."""
    from hubvit.conversion.transformers_clip import siglip2_processor
    from hubvit.preprocessing import patch_budget_processor

    image = Image.fromarray(data.astronaut()[::8, ::8]).convert(mode)
    for processor in (
        siglip2_processor({"patch_size": 16, "num_patches": 16}),
        patch_budget_processor(16, 16, "bilinear", (0.5,) * 3, (0.5,) * 3),
    ):
        converted, rgb = (processor(images=[x], return_tensors="pt") for x in (image, image.convert("RGB")))
        assert torch.equal(converted["pixel_values"], rgb["pixel_values"])
