"""`hubvit convert jax` on big_vision NaFlex checkpoints, against Flax in big_vision's NaFlex module layout.

`VisionTransformerNaFlex` (hubvit.conversion.flax_vit) follows big_vision's `models/proj/image_text/naflex_vit.py`
module by module: a Dense `embedding` over (row, column, channel) pixels, the (n, n, D) `pos_embedding` scaled per
image into a canvas by `jax.image.scale_and_translate` (bilinear, antialias) and read at each patch's coordinates,
blocks that attend among patches only, pooling over patches. Random weights are written as `np.savez` writes the
released files, converted through the CLI, loaded as remote code, and run on the same patches.

Tolerance: float32 parity, 1e-5 of the output scale (XLA and torch order the same float32 sums differently; a wrong
transpose or resize rule is orders of magnitude larger).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from transformers import AutoModelForImageClassification  # noqa: E402

from hubvit import cli  # noqa: E402
from hubvit.conversion.flax_vit import VisionTransformerNaFlex, naflex_inputs, run  # noqa: E402
from tests.flax_reference import flatten_params, randomize  # noqa: E402
from tests.utils import relative_error  # noqa: E402

P, D, DEPTH, H, MLP, NC, SIDE = 8, 32, 2, 4, 64, 10, 4
TOL = 1e-5
GRIDS = ((3, 5), (5, 2), (4, 4))  # three images' (rows, columns) of patches: a mixed batch


def flax_model(**fields):
    base = dict(num_classes=NC, width=D, depth=DEPTH, mlp_dim=MLP, num_heads=H, posemb_side=SIDE, pool_type="map")
    return VisionTransformerNaFlex(**{**base, **fields})


def random_params(model, seed=0):
    inputs = naflex_inputs(np.zeros((1, SIDE * P, SIDE * P, 3), np.float32), P)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), inputs)["params"]
    return randomize(shapes, seed)


def image(grid, seed):
    rows, columns = grid
    return np.random.default_rng(seed).uniform(-1, 1, (1, rows * P, columns * P, 3)).astype(np.float32)


def mixed_batch(grids=GRIDS, seeds=None):
    """The images of `grids` (image k drawn with seed `seeds[k]`, default k) as one padded batch: big_vision's
    (patches, ptype, rows, columns) and hubvit's (SigLIP 2's) patch-sequence inputs, the same patches in order."""
    seeds = seeds or range(len(grids))
    parts = [naflex_inputs(image(grid, seed), P) for seed, grid in zip(seeds, grids)]
    length = max(part[0].shape[1] for part in parts)

    def padded(k):
        return np.concatenate(
            [np.pad(part[k], [(0, 0), (0, length - part[k].shape[1])] + [(0, 0)] * (k == 0)) for part in parts]
        )

    flax_inputs = tuple(padded(k) for k in range(4))
    hubvit_inputs = {
        "pixel_values": torch.from_numpy(flax_inputs[0]),
        "pixel_attention_mask": torch.from_numpy(flax_inputs[1]).long(),
        "spatial_shapes": torch.tensor(grids),
    }
    return flax_inputs, hubvit_inputs


def convert(model, params, tmp_path, prefix="params/", *flags):
    np.savez(tmp_path / "w.npz", **flatten_params(params, prefix))
    assert cli.main(["convert", "jax", str(tmp_path / "w.npz"), str(tmp_path / "out"), *flags]) == 0
    converted, info = AutoModelForImageClassification.from_pretrained(
        str(tmp_path / "out"), trust_remote_code=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return converted.eval()


CASES = {
    "map-scanned": dict(pool_type="map", scan=True),
    "gap-looped-patchln_post": dict(pool_type="gap", scan=False, patchln_post=True),
    "map-looped-pre_logits": dict(pool_type="map", scan=False, rep_size=16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mixed_batch_matches_big_vision_naflex(tmp_path, case):
    model = flax_model(**CASES[case])
    params = random_params(model, seed=len(case))
    converted = convert(model, params, tmp_path, "params/img/" if case.startswith("map-s") else "params/")
    flax_inputs, hubvit_inputs = mixed_batch()
    expected = run(model, params, flax_inputs)
    with torch.no_grad():
        logits = converted(**hubvit_inputs).logits.numpy()
    assert relative_error(logits, expected) <= TOL


def test_each_image_of_a_mixed_batch_computes_what_it_computes_alone(tmp_path):
    model = flax_model(pool_type="map", scan=True)
    params = random_params(model, seed=7)
    converted = convert(model, params, tmp_path)
    _, batch = mixed_batch()
    with torch.no_grad():
        together = converted(**batch).logits
        for row, grid in enumerate(GRIDS):
            _, alone = mixed_batch([grid], [row])
            assert relative_error(converted(**alone).logits.numpy(), together[row : row + 1].numpy()) <= TOL


def test_whole_images_match_at_sizes_other_than_the_tables(tmp_path):
    """Whole (B, C, H, W) images are one patch sequence each: a grid larger than the 4 x 4 table, and a non-square one."""
    model = flax_model(pool_type="gap", scan=True)
    params = random_params(model, seed=9)
    converted = convert(model, params, tmp_path)
    for grid in ((7, 7), (3, 9)):
        pixels = image(grid, seed=grid[1])
        expected = run(model, params, naflex_inputs(pixels, P))
        with torch.no_grad():
            logits = converted(pixel_values=torch.from_numpy(pixels).permute(0, 3, 1, 2)).logits.numpy()
        assert relative_error(logits, expected) <= TOL, grid


def test_the_card_cites_siglip_2_and_names_the_naflex_layout(tmp_path):
    model = flax_model(pool_type="map", scan=False)
    convert(model, random_params(model), tmp_path)
    card = (tmp_path / "out" / "README.md").read_text()
    assert "big_vision NaFlex layout" in card and "SigLIP 2" in card


def refusal(tmp_path, capsys, params, *flags):
    np.savez(tmp_path / "w.npz", **flatten_params(params, "params/"))
    assert cli.main(["convert", "jax", str(tmp_path / "w.npz"), str(tmp_path / "out"), *flags]) == 2
    assert not (tmp_path / "out").exists()
    return capsys.readouterr().err


def test_a_norm_on_the_patches_pixels_is_refused_by_name(tmp_path, capsys):
    params = random_params(flax_model(patchln_pre=True))
    assert "'params/patchln_pre' normalises each patch's pixels" in refusal(tmp_path, capsys, params)


def test_a_resolution_to_convert_for_is_refused(tmp_path, capsys):
    error = refusal(tmp_path, capsys, random_params(flax_model()), "--image-size", "64")
    assert "--image-size 64: a NaFlex table is resized to each image's own grid" in error


def test_an_incomplete_naflex_file_lists_what_it_lacks(tmp_path, capsys):
    params = random_params(flax_model(pool_type="gap"))
    del params["Transformer"]["encoder_norm"]
    error = refusal(tmp_path, capsys, params)
    assert "params/Transformer/encoder_norm/scale" in error


def test_the_folder_carries_siglip_2s_processor_at_the_tables_budget(tmp_path):
    """Not a square resize: AutoImageProcessor gives each image at its own aspect ratio within the 4x4 table's 16
    patches, and the converted model takes what it writes."""
    from PIL import Image
    from transformers import AutoImageProcessor, Siglip2ImageProcessor

    model = flax_model(pool_type="map", scan=False)
    converted = convert(model, random_params(model), tmp_path)
    processor = AutoImageProcessor.from_pretrained(str(tmp_path / "out"))
    assert isinstance(processor, Siglip2ImageProcessor)
    assert (processor.patch_size, processor.max_num_patches) == (P, SIDE * SIDE)
    wide = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 120, 3), dtype=np.uint8))
    batch = processor(images=[wide], return_tensors="pt")
    assert batch["spatial_shapes"].tolist() == [[2, 6]]  # 1:3 kept, 12 of 16 patches
    with torch.no_grad():
        assert converted(**batch).logits.shape == (1, NC)


def test_a_map_head_without_its_probe_is_refused_naming_the_probe(tmp_path, capsys):
    params = random_params(flax_model(pool_type="map"))
    del params["MAPHead_0"]["probe"]
    assert "the MAP head's arrays are there but not its probe ('params/MAPHead_0/probe')" in refusal(
        tmp_path, capsys, params
    )
