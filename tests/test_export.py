"""Graph export at any resolution: `torch.export` of the classifier and `hubvit export onnx` checked in onnxruntime.

Tolerances: `torch.export` runs the same ATen kernels as eager, so 1e-5 relative to the output scale (float32
rounding); onnxruntime runs its own kernels, and the exporter's contract is 1e-4 relative to the output scale.
"""

import json

import numpy as np
import pytest
import torch
from transformers import ViTImageProcessor

from hubvit import HubViTForImageClassification, HubViTModel
from hubvit.folder import make_image_processor, write_folder
from hubvit.cli import main as cli
from utils import mlp_tokens_per_block, randomize_, tiny_config

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

LABELS = {0: "cat", 1: "dog", 2: "bird"}


def pixels(batch, height, width, seed=1):
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


def relative_difference(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def default_domain_opset(graph):
    return {entry.domain or "ai.onnx": entry.version for entry in graph.opset_import}["ai.onnx"]


def classifier():
    torch.manual_seed(0)
    return randomize_(HubViTForImageClassification(tiny_config(num_labels=3, id2label=LABELS))).eval()


def test_torch_export_with_dynamic_height_and_width_runs_at_three_sizes():
    model = classifier()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).logits

    rows, columns = torch.export.Dim("rows", min=1, max=16), torch.export.Dim("columns", min=1, max=16)
    dynamic = {"pixel_values": {0: torch.export.Dim("batch", min=1, max=64), 2: 8 * rows, 3: 8 * columns}}
    program = torch.export.export(Logits(), (pixels(2, 32, 32),), dynamic_shapes=dynamic)
    for batch, height, width in ((2, 32, 32), (1, 48, 48), (3, 24, 56)):
        x = pixels(batch, height, width, seed=height)
        with torch.no_grad():
            expected = model(pixel_values=x).logits
        assert relative_difference(program.module()(x).detach(), expected) <= 1e-5, (height, width)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny classifier folder with a non-default image processor, exported once by the CLI."""
    root = tmp_path_factory.mktemp("onnx")
    model = classifier()
    processor = make_image_processor(
        model.config, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), resample="bicubic"
    )
    write_folder(model, root / "src", processor)
    assert cli(["export", "onnx", str(root / "src"), str(root / "out" / "model.onnx")]) == 0
    return model, root


@pytest.mark.heavy
def test_export_writes_the_graph_and_its_verification_beside_it(exported):
    _, root = exported
    assert sorted(p.name for p in (root / "out").iterdir()) == ["model.onnx", "model.verification.json"]
    report = json.loads((root / "out" / "model.verification.json").read_text())
    sizes = {(check["height"], check["width"]) for check in report["checks"]}
    assert (32, 32) in sizes and len(sizes) == 3
    assert any(height != width for height, width in sizes)
    for check in report["checks"]:
        assert check["max_abs_difference"] <= 1e-4 * check["max_abs_output"], check


@pytest.mark.heavy
def test_the_default_graph_uses_standard_operators_only(exported):
    """OpenVINO and every other runtime read it: onnxruntime's fused operators are the opt-in of
    tests/test_export_fusion.py."""
    _, root = exported
    graph = onnx.load(str(root / "out" / "model.onnx")).graph
    assert {node.domain for node in graph.node} <= {"", "ai.onnx"}
    assert "Softmax" in [node.op_type for node in graph.node]


@pytest.mark.heavy
def test_the_default_graph_is_opset_20_with_gelu_as_one_operator(exported):
    """What torch.onnx writes by default; onnxruntime runs one Gelu faster than opset 18's Erf arithmetic."""
    _, root = exported
    model = onnx.load(str(root / "out" / "model.onnx"))
    assert default_domain_opset(model) == 20
    operators = [node.op_type for node in model.graph.node]
    assert operators.count("Gelu") == 2 and "Erf" not in operators


@pytest.mark.heavy
def test_opset_18_still_exports_for_older_runtimes(tmp_path):
    model = classifier()
    write_folder(model, tmp_path / "src")
    assert cli(["export", "onnx", str(tmp_path / "src"), str(tmp_path / "m.onnx"), "--opset", "18"]) == 0
    graph = onnx.load(str(tmp_path / "m.onnx"))
    assert default_domain_opset(graph) == 18
    assert "Gelu" not in [node.op_type for node in graph.graph.node]
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = pixels(2, 24, 40)
    (logits,) = session.run(["logits"], {"pixel_values": x.numpy()})
    with torch.no_grad():
        expected = model(pixel_values=x).logits.numpy()
    assert relative_difference(logits, expected) <= 1e-4


@pytest.mark.heavy
@pytest.mark.parametrize("batch,height,width", [(5, 32, 32), (2, 16, 40), (1, 64, 32)])
def test_the_graph_matches_pytorch_in_onnxruntime_at_sizes_the_export_did_not_check(exported, batch, height, width):
    model, root = exported
    session = onnxruntime.InferenceSession(str(root / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = pixels(batch, height, width, seed=7)
    (logits,) = session.run(["logits"], {"pixel_values": x.numpy()})
    with torch.no_grad():
        expected = model(pixel_values=x).logits.numpy()
    assert relative_difference(logits, expected) <= 1e-4


@pytest.mark.heavy
def test_the_classifiers_last_block_updates_only_the_class_token(exported):
    """The logits read [CLS] alone, so the last block's MLP runs on 1 token of 17 (a 4 x 4 grid and [CLS]); the
    logits still match the model's full forward (the tests above)."""
    _, root = exported
    assert mlp_tokens_per_block(root / "out" / "model.onnx", pixels(2, 32, 32)) == [17, 1]


@pytest.mark.heavy
@pytest.mark.parametrize(
    "config, tokens",
    [(dict(distillation_token=True), [18, 2]), (dict(pooling="mean"), [17, 17]), (dict(pooling="map"), [17, 17])],
)
def test_the_last_block_keeps_every_token_the_head_reads(tmp_path, config, tokens):
    torch.manual_seed(0)
    model = randomize_(HubViTForImageClassification(tiny_config(num_labels=3, **config))).eval()
    write_folder(model, tmp_path / "src")
    assert cli(["export", "onnx", str(tmp_path / "src"), str(tmp_path / "model.onnx")]) == 0
    x = pixels(2, 32, 32)
    assert mlp_tokens_per_block(tmp_path / "model.onnx", x) == tokens
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"pixel_values": x.numpy()})
    with torch.no_grad():
        expected = model(pixel_values=x).logits.numpy()
    assert relative_difference(logits, expected) <= 1e-4


@pytest.mark.heavy
def test_the_preprocessing_and_labels_travel_in_the_metadata(exported):
    _, root = exported
    props = {p.key: p.value for p in onnx.load(str(root / "out" / "model.onnx")).metadata_props}
    processor = ViTImageProcessor.from_pretrained(str(root / "src"))
    assert json.loads(props["image_mean"]) == pytest.approx(processor.image_mean)
    assert json.loads(props["image_std"]) == pytest.approx(processor.image_std)
    assert json.loads(props["size"]) == {"height": 32, "width": 32}
    assert json.loads(props["preprocessor_config"])["resample"] == int(processor.resample)
    assert json.loads(props["id2label"]) == {str(k): v for k, v in LABELS.items()}


@pytest.mark.heavy
def test_a_headless_folder_exports_its_features(tmp_path):
    torch.manual_seed(0)
    model = randomize_(HubViTModel(tiny_config())).eval()
    model.save_pretrained(tmp_path / "src")
    assert cli(["export", "onnx", str(tmp_path / "src"), str(tmp_path / "body.onnx")]) == 0
    session = onnxruntime.InferenceSession(str(tmp_path / "body.onnx"), providers=["CPUExecutionProvider"])
    x = pixels(2, 40, 24)
    tokens, pooled = session.run(["last_hidden_state", "pooler_output"], {"pixel_values": x.numpy()})
    with torch.no_grad():
        expected = model(pixel_values=x)
    assert relative_difference(tokens, expected.last_hidden_state.numpy()) <= 1e-4
    assert relative_difference(pooled, expected.pooler_output.numpy()) <= 1e-4


def test_a_folder_of_another_model_type_is_refused(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    assert cli(["export", "onnx", str(tmp_path / "src"), str(tmp_path / "m.onnx")]) == 2
    assert "model_type='vit', expected 'hubvit'" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


def test_an_output_name_without_onnx_suffix_is_refused(tmp_path, capsys):
    assert cli(["export", "onnx", str(tmp_path), str(tmp_path / "model.bin")]) == 2
    assert "should end in .onnx" in capsys.readouterr().err
