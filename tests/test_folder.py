"""The hubvit folder layer: every reader loads a folder strictly, so a tensor missing from model.safetensors (or one
too many) is refused by name instead of being initialised at random and silently analysed or exported."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from hubvit import HubViTError, HubViTForImageClassification, folder
from hubvit.cli import main as cli
from utils import randomize_, tiny_config

POSITION = "hubvit.embeddings.position_embedding"


@pytest.fixture
def model_folder(tmp_path):
    model = randomize_(HubViTForImageClassification(tiny_config(num_labels=3))).eval()
    path = folder.write_folder(model, tmp_path / "model")
    return path, model


def edit_weights(path, change):
    weights = load_file(path / "model.safetensors")
    change(weights)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def test_load_gives_the_saved_weights_and_eval_mode(model_folder):
    path, model = model_folder
    loaded = folder.load(path)
    assert type(loaded) is HubViTForImageClassification and not loaded.training
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_load_refuses_a_missing_tensor_naming_it(model_folder):
    path, _ = model_folder
    edit_weights(path, lambda weights: weights.pop(POSITION))
    with pytest.raises(HubViTError, match=f"missing keys:\n    {POSITION}"):
        folder.load(path)


def test_load_refuses_an_unexpected_tensor_naming_it(model_folder):
    path, _ = model_folder
    edit_weights(path, lambda weights: weights.update({"hubvit.extra.weight": torch.zeros(2)}))
    with pytest.raises(HubViTError, match="unexpected keys:\n    hubvit.extra.weight"):
        folder.load(path)


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "position-similarity", "{src}", "--output-dir", "{tmp}/analysis"],
        ["export", "onnx", "{src}", "{tmp}/model.onnx"],
    ],
    ids=["analyze position-similarity", "export onnx"],
)
def test_commands_refuse_a_folder_missing_a_tensor(model_folder, tmp_path, capsys, argv):
    path, _ = model_folder
    edit_weights(path, lambda weights: weights.pop(POSITION))
    status = cli([word.format(src=path, tmp=tmp_path) for word in argv])
    error = capsys.readouterr().err
    assert status == 2 and POSITION in error and "Traceback" not in error
    assert not (tmp_path / "analysis").exists() and not (tmp_path / "model.onnx").exists()
