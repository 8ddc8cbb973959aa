"""`hubvit export onnx --onnxruntime_fusion`: attention and GELU as onnxruntime's fused operators, same numbers.

The reference is the PyTorch model the graph was exported from. Tolerance: 1e-5 relative to the logit scale (the
fused kernels reorder float32 sums; measured about 3e-7 on these models), tighter than the exporter's 1e-4 contract.
"""

import json

import numpy as np
import pytest
import torch

from hubvit import HubViTForImageClassification
from hubvit.folder import write_folder
from hubvit.cli import main as cli
from utils import SAM_PARTS, mlp_tokens_per_block, randomize_, tiny_config

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

pytestmark = pytest.mark.heavy


WINDOWED = SAM_PARTS
"""SAM's parts: at 32x32, 48x24 and 16x40 the grids are 4x4, 6x3 and 2x5, each padded to whole windows of 3 a
different way, and the global block's offset tables resized to each."""


def export(tmp_path, *flags, **config):
    torch.manual_seed(0)
    model = randomize_(HubViTForImageClassification(tiny_config(num_labels=3, **config))).eval()
    write_folder(model, tmp_path / "src")
    out = tmp_path / "model.onnx"
    assert cli(["export", "onnx", str(tmp_path / "src"), str(out), *flags]) == 0
    return model, out


def operators(path):
    return [node.op_type for node in onnx.load(str(path)).graph.node]


def worst_relative_difference(model, path):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch, height, width in ((2, 32, 32), (1, 48, 24), (3, 16, 40)):
        x = torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(height + width))
        (logits,) = session.run(["logits"], {"pixel_values": x.numpy()})
        with torch.no_grad():
            expected = model(pixel_values=x).logits.numpy()
        worst = max(worst, float(np.abs(logits - expected).max() / np.abs(expected).max()))
    return worst


def test_each_block_gets_one_attention_and_one_gelu_kernel_with_the_same_logits(tmp_path):
    model, path = export(tmp_path, "--onnxruntime_fusion")
    found = operators(path)
    layers = model.config.num_hidden_layers
    assert found.count("MultiHeadAttention") == layers and found.count("Gelu") == layers
    assert "Softmax" not in found and "Erf" not in found, "the bypassed operators are still in the graph"
    assert worst_relative_difference(model, path) <= 1e-5
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert mlp_tokens_per_block(path, x) == [17, 1], "the last block's fused attention should query [CLS] alone"
    report = json.loads(path.with_suffix(".verification.json").read_text())
    assert report["onnxruntime_fusion"] == {"MultiHeadAttention": layers, "Gelu": layers}
    assert {check["runtime"] for check in report["checks"]} == {"onnxruntime"}, "OpenVINO cannot read com.microsoft"


def test_the_tanh_gelu_becomes_fastgelu_and_a_bias_free_qkv_still_fuses(tmp_path):
    model, path = export(
        tmp_path, "--onnxruntime_fusion", hidden_act="gelu_pytorch_tanh", qkv_bias=False, num_register_tokens=2
    )
    found = operators(path)
    assert found.count("FastGelu") == 2 and found.count("MultiHeadAttention") == 2
    assert worst_relative_difference(model, path) <= 1e-5


def test_a_relative_position_bias_keeps_its_attention_as_exported(tmp_path):
    model, path = export(tmp_path, "--onnxruntime_fusion", position_embedding_type="relative_2d")
    found = operators(path)
    assert "MultiHeadAttention" not in found and found.count("Softmax") == 2
    assert found.count("Gelu") == 2
    assert worst_relative_difference(model, path) <= 1e-5


@pytest.mark.parametrize(
    "fields",
    [dict(key_bias=False), dict(qk_norm=True), dict(qkv_fused=False), WINDOWED],
    ids=["q-and-v-biases", "qk-norm", "separate-projections", "windows-decomposed-positions-neck"],
)
def test_an_attention_that_is_not_fusable_keeps_its_operators(tmp_path, fields):
    model, path = export(tmp_path, "--onnxruntime_fusion", **fields)
    found = operators(path)
    assert "MultiHeadAttention" not in found and found.count("Softmax") == 2 and found.count("Gelu") == 2
    assert worst_relative_difference(model, path) <= 1e-5


def test_each_block_says_whether_it_fuses_so_a_global_block_among_windowed_ones_fuses(tmp_path):
    """Block 1 attends globally with nothing added to its product; block 0 attends within windows and keeps its
    operators."""
    fields = dict(attention_window_size=3, global_attention_blocks=[1], class_token=False, pooling="mean")
    model, path = export(tmp_path, "--onnxruntime_fusion", **fields)
    found = operators(path)
    assert found.count("MultiHeadAttention") == 1 and found.count("Softmax") == 1
    assert worst_relative_difference(model, path) <= 1e-5


def test_a_gated_mlp_keeps_its_activation_and_its_attention_still_fuses(tmp_path):
    model, path = export(tmp_path, "--onnxruntime_fusion", mlp_type="gated", hidden_act="gelu", norm_type="rms_norm")
    report = json.loads(path.with_suffix(".verification.json").read_text())
    assert report["onnxruntime_fusion"] == {"MultiHeadAttention": 2, "activation": 0}
    assert worst_relative_difference(model, path) <= 1e-5


def test_sams_windowed_model_exports_and_runs_in_onnxruntime_and_openvino_at_other_sizes(tmp_path):
    """The exporter checks both runtimes at three sizes before it writes (its verification record lists them); the
    graph takes one path at every grid, so sizes it did not check agree too."""
    pytest.importorskip("openvino")
    model, path = export(tmp_path, **WINDOWED)
    report = json.loads(path.with_suffix(".verification.json").read_text())
    assert {"onnxruntime", "openvino"} <= {row["runtime"] for row in report["checks"]}
    assert worst_relative_difference(model, path) <= 1e-5
