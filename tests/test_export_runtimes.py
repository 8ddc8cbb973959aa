"""The exported graph computes the same numbers in onnxruntime and OpenVINO at sizes other than the export size.

The position tables are resized inside the graph by two matrix products whose weights the graph computes from the
input size (`interpolation_matrix` in the model file), instead of an ONNX `Resize` that OpenVINO computes differently for
cubic + antialias. First the matrices are held to `F.interpolate` itself (float32 rounding: 1e-5 relative), then a
digits-sized model (28 px, patch 7) goes through `hubvit export onnx` and both runtimes at three sizes (the
exporter's contract: 1e-4 relative to the output scale).
"""

import json

import numpy as np
import pytest
import torch

from hubvit import HubViTForImageClassification
from hubvit.folder import write_folder
from hubvit.modeling.resize_hubvit import resize_position_grid, resize_position_grid_by_matrices
from hubvit.cli import main as cli
from utils import randomize_, tiny_config

MODES = [
    ("bicubic", True, False),  # timm
    ("bicubic", False, False),
    ("bicubic", False, True),
    ("bilinear", False, True),  # original JAX fine-tuning
    ("bilinear", False, False),
    ("bilinear", True, False),
    ("nearest", False, False),
]
GRIDS = [
    ((4, 4), (4, 4)),
    ((4, 4), (7, 5)),
    ((14, 14), (9, 20)),
    ((7, 5), (2, 3)),
    ((1, 6), (3, 12)),
    ((27, 27), (1, 1)),
]


@pytest.mark.parametrize("mode, antialias, align_corners", MODES)
@pytest.mark.parametrize("old, new", GRIDS)
def test_resize_by_matrices_equals_interpolate(mode, antialias, align_corners, old, new):
    table = torch.randn(1, old[0] * old[1], 8, generator=torch.Generator().manual_seed(0))
    expected = resize_position_grid(table, old, new, mode, antialias, align_corners)
    actual = resize_position_grid_by_matrices(table, old, new, mode, antialias, align_corners)
    assert actual.shape == expected.shape
    assert (actual - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.heavy
def test_a_digits_sized_model_matches_pytorch_in_onnxruntime_and_openvino_at_three_sizes(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    pytest.importorskip("openvino")
    config = tiny_config(image_size=28, patch_size=7, num_channels=1, num_labels=10)
    model = randomize_(HubViTForImageClassification(config), seed=2).eval()
    write_folder(model, tmp_path / "digits")
    assert cli(["export", "onnx", str(tmp_path / "digits"), str(tmp_path / "digits.onnx")]) == 0
    checks = json.loads((tmp_path / "digits.verification.json").read_text())["checks"]
    assert {row["runtime"] for row in checks} == {"onnxruntime", "openvino"}
    sizes = {(row["height"], row["width"]) for row in checks}
    assert (28, 28) in sizes and len(sizes) == 3 and any(h != w for h, w in sizes)

    import openvino

    compiled = openvino.Core().compile_model(str(tmp_path / "digits.onnx"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for height, width in ((21, 21), (42, 21), (56, 35)):  # sizes the export's own check did not use
        x = torch.randn(2, 1, height, width, generator=torch.Generator().manual_seed(height + width))
        with torch.no_grad():
            expected = model(x).logits.numpy()
        actual = compiled(x.numpy())[compiled.output("logits")]
        assert np.abs(actual - expected).max() <= 1e-4 * np.abs(expected).max(), (height, width)

    core = openvino.Core()
    fixed = core.read_model(str(tmp_path / "digits.onnx"))
    fixed.reshape({"pixel_values": [3, 1, 35, 49]})  # docs/conversion.md: fix the shape for a fixed input size
    compiled = core.compile_model(fixed, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = torch.randn(3, 1, 35, 49, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x).logits.numpy()
    actual = compiled(x.numpy())[compiled.output("logits")]
    assert np.abs(actual - expected).max() <= 1e-4 * np.abs(expected).max()
