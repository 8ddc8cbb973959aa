"""timm's NaFlexVit (issue 49): its tags converted and checked against timm's own forward on the same random
weights, on whole images (native and another size) and on one batch of four aspect ratios given to timm as its NaFlex
dict (`patches`, `patch_coord`, `patch_valid`) and to hubvit as SigLIP 2's patch sequences (the same patches).
Tolerance: 1e-5 of the output scale (float32)."""

import numpy as np
import pytest
import timm
import torch
import transformers
from timm.models import save_for_hf
from transformers import AutoModel, AutoModelForImageClassification

from hubvit.cli import main as cli
from utils import randomize_, relative_error

TINY = dict(embed_dim=32, depth=2, num_heads=4)

# name: (timm entry point, its model args on top of TINY, config fields the conversion must produce)
FAMILIES = {
    "registers-layer-scale-mean": ("naflexvit_base_patch16_gap", dict(num_classes=5), dict(num_register_tokens=4)),
    "siglip2-map": (
        "naflexvit_base_patch16_siglip",
        dict(num_classes=0),
        dict(pooling="map", interpolation_mode="bilinear", hidden_act="gelu_pytorch_tanh"),
    ),
    "aspect-preserving-table": (
        "naflexvit_base_patch16_par_gap",
        dict(num_classes=5),
        dict(interpolation_keep_aspect=True),
    ),
    "c-radio": (
        "naflexvit_base_patch16_radio_v3",
        dict(num_classes=0),
        dict(final_norm=False, interpolation_align_corners=True, interpolation_antialias=False, num_register_tokens=7),
    ),
    # rotary positions from each patch's coordinates (EVA blocks), beside the table or alone
    "axial-rotary-beside-the-table": (
        "naflexvit_base_patch16_gap",
        dict(num_classes=5, rope_type="axial"),
        dict(rope_type="axial", position_embedding_type="learned"),
    ),
    "dinov3-rotary-alone": (
        "naflexvit_base_patch16_gap",
        dict(num_classes=0, rope_type="dinov3", rope_rotate_half=True, rope_temperature=100.0, pos_embed="none"),
        dict(rope_type="dinov3", position_embedding_type="none"),
    ),
    "mixed-rotary": (
        "naflexvit_base_patch16_gap",
        dict(num_classes=5, rope_type="mixed", rope_temperature=10.0, pos_embed="none"),
        dict(rope_type="mixed"),
    ),
}


def convert(name, args, tmp_path):
    source = randomize_(timm.create_model(name, pretrained=False, **TINY, **args).eval(), seed=1)
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 0
    auto = AutoModel if args["num_classes"] == 0 else AutoModelForImageClassification
    return source, auto.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()


def output(model, **inputs):
    outputs = model(**inputs)
    return outputs.logits if hasattr(outputs, "logits") else outputs.pooler_output


def mixed_batch():
    rng = np.random.default_rng(0)
    sizes = ((80, 160), (160, 64), (96, 96), (32, 176))
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    return transformers.Siglip2ImageProcessor(patch_size=16, max_num_patches=48)(images=images, return_tensors="pt")


def timm_dict(batch):
    """The same patches as timm's NaFlex loader hands them over: (row, column) of each patch, and its validity."""
    size, length = batch["pixel_attention_mask"].shape
    coord = torch.zeros(size, length, 2, dtype=torch.long)
    for index, (rows, columns) in enumerate(batch["spatial_shapes"].tolist()):
        position = torch.arange(rows * columns)
        coord[index, : rows * columns, 0], coord[index, : rows * columns, 1] = position // columns, position % columns
    return {"patches": batch["pixel_values"], "patch_coord": coord, "patch_valid": batch["pixel_attention_mask"].bool()}


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_a_naflexvit_family_matches_timm_on_images_and_on_a_mixed_batch(family, tmp_path):
    name, args, expected = FAMILIES[family]
    source, model = convert(name, args, tmp_path)
    for field, value in expected.items():
        assert getattr(model.config, field) == value, field
    for height, width in ((256, 256), (96, 160)):
        pixels = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(height))
        assert relative_error(output(model, pixel_values=pixels), source(pixels)) <= 1e-5, (height, width)
    batch = mixed_batch()
    assert len(set(map(tuple, batch["spatial_shapes"].tolist()))) == 4
    assert relative_error(output(model, **batch), source(timm_dict(batch))) <= 1e-5


def test_a_factorized_table_is_refused_by_name(tmp_path, capsys):
    source = timm.create_model("naflexvit_base_patch16_parfac_gap", pretrained=False, **TINY, num_classes=5)
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "pos_embed='factorized' (hubvit has a learned 2D table or none)" in error and "embeds.pos_embed_y" in error
    assert not (tmp_path / "out").exists()


@torch.no_grad()
def test_forward_intermediates_takes_timms_naflex_dict_as_timm_does(tmp_path):
    """timm's API on the converted model: `forward_intermediates` of timm's NaFlex dict gives timm's padded tokens
    ("NLC", the only format timm's NaFlexVit has for it) for the real patches."""
    source, model = convert("naflexvit_base_patch16_gap", dict(num_classes=5), tmp_path)
    batch = timm_dict(mixed_batch())
    ours = model.hubvit.forward_intermediates(batch, indices=[0, 1], output_fmt="NLC", intermediates_only=True)
    theirs = source.forward_intermediates(batch, indices=[0, 1], output_fmt="NLC", intermediates_only=True)
    valid = batch["patch_valid"]
    for mine, timms in zip(ours, theirs):
        assert relative_error(mine[valid], timms[valid]) <= 1e-5


def test_a_naflex_dict_out_of_row_major_order_is_refused(tmp_path):
    _, model = convert("naflexvit_base_patch16_gap", dict(num_classes=5), tmp_path)
    batch = timm_dict(mixed_batch())
    batch["patch_coord"] = batch["patch_coord"].flip(1)
    with pytest.raises(ValueError, match="row-major order"):
        model.hubvit.forward_intermediates(batch, indices=1)
