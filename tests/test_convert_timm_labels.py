"""`hubvit convert timm` writes a config.json whose label2id is the inverse of its id2label (issue 11, item 5).

transformers 5's PretrainedConfig leaves label2id None when it is given id2label alone, so a converter that passes
only id2label writes `"label2id": null` and `config.label2id[name]` raises in every client.
"""

import json

import pytest
import torch

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402
from transformers import AutoConfig  # noqa: E402

from hubvit.cli import main as cli  # noqa: E402

TINY = dict(depth=1, embed_dim=24, num_heads=2, img_size=16, patch_size=8)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def convert_tiny(tmp_path, num_classes, **model_config):
    source = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=num_classes, **TINY)
    save_for_hf(source.eval(), tmp_path / "timm", model_config=model_config or None)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 0
    return json.loads((tmp_path / "out" / "config.json").read_text())


def test_label2id_inverts_the_checkpoint_label_names(tmp_path):
    names = {"n1": "red fox", "n2": "grey wolf", "n3": "brown bear"}
    written = convert_tiny(tmp_path, 3, label_names=list(names), label_descriptions=names)
    assert written["id2label"] == {"0": "red fox", "1": "grey wolf", "2": "brown bear"}
    assert written["label2id"] == {"red fox": 0, "grey wolf": 1, "brown bear": 2}
    config = AutoConfig.from_pretrained(tmp_path / "out", trust_remote_code=True)
    assert all(config.label2id[label] == i for i, label in config.id2label.items())


def test_label2id_inverts_the_generated_names(tmp_path):
    """A head without label names gets LABEL_i both ways, as transformers names them."""
    written = convert_tiny(tmp_path, 4)
    assert written["label2id"] == {f"LABEL_{i}": i for i in range(4)}
    assert {int(i): label for i, label in written["id2label"].items()} == {i: f"LABEL_{i}" for i in range(4)}


def test_headless_checkpoint_has_empty_label_maps(tmp_path):
    written = convert_tiny(tmp_path, 0)
    assert written.get("id2label", {}) == {} and written.get("label2id", {}) == {}


def test_weights_survive_the_label_change(tmp_path):
    """The label fix touches the config only: logits still match timm on the same weights (1e-5 relative, float32)."""
    from transformers import AutoModelForImageClassification

    torch.manual_seed(0)
    source = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=3, **TINY).eval()
    save_for_hf(source, tmp_path / "timm", model_config=dict(label_names=["a", "b", "c"]))
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 0
    model = AutoModelForImageClassification.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        reference = source(pixels)
        error = (model(pixel_values=pixels).logits - reference).abs().max() / reference.abs().max()
    assert error <= 1e-5
    assert model.config.label2id == {"a": 0, "b": 1, "c": 2}
