"""Issue 27, POOR: bad paths, manifests, options and fields end in one line naming them (exit status 2), or in the
correct result; nothing the user owns is replaced without --overwrite.

Every case runs the `hubvit` command in this process; `errors` keeps the `hubvit ...: error:` lines of stderr.
"""

import json
import stat

import numpy as np
import pytest
import torch
from hubvit.conversion.publish import read_manifest
from hubvit.cli import main as cli
from test_reliability import jax_arrays, tiny_folder

from hubvit.errors import HubViTError


def errors(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "src" / "vit.npz"
    path.parent.mkdir()
    np.savez(path, **jax_arrays())
    return path


# --- OUT -------------------------------------------------------------------------------------------------------------


def test_overwrite_leaves_a_folder_without_any_checkpoint_untouched(npz, tmp_path, capsys):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"not a checkpoint")
    status = cli(["convert", "jax", str(npz), str(out), "--overwrite"])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "no checkpoint" in lines[0] and str(out) in lines[0]
    assert (out / "holiday.jpg").read_bytes() == b"not a checkpoint"


def test_overwrite_still_replaces_an_earlier_output(npz, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["convert", "jax", str(npz), str(out)]) == 0
    assert cli(["convert", "jax", str(npz), str(out), "--overwrite"]) == 0


def test_every_file_of_a_written_folder_has_the_same_mode(npz, tmp_path):
    out = tmp_path / "out"
    assert cli(["convert", "jax", str(npz), str(out)]) == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"], modes
    assert len(set(modes.values())) == 1, modes


def test_a_legal_240_character_out_is_written(npz, tmp_path):
    out = tmp_path / ("v" * 240)
    assert cli(["convert", "jax", str(npz), str(out)]) == 0
    assert (out / "model.safetensors").is_file()


# --- manifests and sources -------------------------------------------------------------------------------------------


def test_a_csv_manifest_row_with_extra_cells_is_refused_by_line(tmp_path):
    manifest = tmp_path / "zoo.csv"
    manifest.write_text("source,converter,repo_id\ntimm/a,timm,me/a\ntimm/b,timm,me/b,surplus\n")
    with pytest.raises(HubViTError, match=r"zoo.csv: line 3: 4 cells, but the header has 3"):
        read_manifest(manifest)


def test_a_manifest_that_is_a_folder_says_so(tmp_path, capsys):
    (tmp_path / "zoo.yaml").mkdir()
    status = cli(["publish", str(tmp_path / "zoo.yaml"), "--dry-run"])
    lines = errors(capsys)
    assert status == 2 and "a folder, not a manifest file" in lines[0]


def test_a_typo_in_a_local_path_is_not_reported_only_as_a_cache_miss(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    status = cli(["convert", "transformers", "no_such_dir/vit", str(tmp_path / "out")])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "there is no local path no_such_dir/vit either" in lines[0]


# --- fields and options that were passed through or misnamed --------------------------------------------------------


def test_a_1d_jax_patch_kernel_is_named(tmp_path, capsys):
    arrays = jax_arrays()
    arrays["embedding/kernel"] = arrays["embedding/kernel"].reshape(-1)
    np.savez(tmp_path / "vit.npz", **arrays)
    status = cli(["convert", "jax", str(tmp_path / "vit.npz"), str(tmp_path / "out")])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "embedding/kernel has shape (384,)" in lines[0]


def test_drop_pre_logits_on_a_file_without_pre_logits_is_refused(npz, tmp_path, capsys):
    status = cli(["convert", "jax", str(npz), str(tmp_path / "out"), "--drop-pre-logits"])
    lines = errors(capsys)
    assert status == 2 and "--drop-pre-logits" in lines[0] and not (tmp_path / "out").exists()


@pytest.fixture
def torchvision_file(tmp_path):
    tv = pytest.importorskip("torchvision")
    model = tv.models.vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=3
    )
    torch.save(model.state_dict(), tmp_path / "vit.pth")
    return tmp_path / "vit.pth"


@pytest.mark.parametrize("size", ["0", "-8"])
def test_torchvision_image_size_must_be_positive(torchvision_file, tmp_path, capsys, size):
    status = cli(
        [
            "convert",
            "torchvision",
            str(torchvision_file),
            str(tmp_path / "out"),
            "--num-heads",
            "2",
            f"--image-size={size}",
        ]
    )
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and f"image_size={size}" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_2d_torchvision_patch_kernel_is_named(torchvision_file, tmp_path, capsys):
    weights = torch.load(torchvision_file, weights_only=True)
    weights["conv_proj.weight"] = weights["conv_proj.weight"].reshape(16, -1)
    torch.save(weights, torchvision_file)
    status = cli(["convert", "torchvision", str(torchvision_file), str(tmp_path / "out"), "--num-heads", "2"])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "conv_proj.weight has shape (16, 192)" in lines[0]


@pytest.fixture
def timm_folder(tmp_path):
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    model = timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        depth=1,
        embed_dim=32,
        num_heads=2,
        img_size=16,
        patch_size=8,
        num_classes=3,
    )
    save_for_hf(model, tmp_path / "timm")
    return tmp_path / "timm"


def edit_json(path, **changes):
    raw = json.loads(path.read_text())
    for key, value in changes.items():
        target = raw
        *parents, last = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[last] = value
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize(
    "change, named",
    [
        ({"model_args": "depth=1"}, "model_args='depth=1'"),
        ({"model_args.num_classes": -1}, "num_classes=-1"),
        ({"pretrained_cfg.crop_pct": -0.9}, "crop_pct=-0.9"),
    ],
)
def test_bad_timm_config_fields_are_named(timm_folder, tmp_path, capsys, change, named):
    edit_json(timm_folder / "config.json", **change)
    status = cli(["convert", "timm", str(timm_folder), str(tmp_path / "out")])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and named in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_negative_size_in_a_source_preprocessor_is_refused(tmp_path, capsys):
    from test_reliability_sizes import transformers_folder

    src = transformers_folder(tmp_path / "vit")
    (src / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "ViTImageProcessor",
                "do_resize": True,
                "size": {"height": -16, "width": 16},
                "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3,
            }
        )
    )
    capsys.readouterr()
    status = cli(["convert", "transformers", str(src), str(tmp_path / "out")])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "preprocessor_config.json" in lines[0] and "-16" in lines[0]
    assert not (tmp_path / "out").exists()


# --- export and analyze ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", ["0", "999"])
def test_export_onnx_opset_outside_the_exporters_range_is_one_line(tmp_path, capsys, opset):
    pytest.importorskip("onnxruntime")
    src = tiny_folder(tmp_path / "src")
    capsys.readouterr()
    status = cli(["export", "onnx", str(src), str(tmp_path / "m.onnx"), "--opset", opset])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and f"opset={opset}" in lines[0]


@pytest.mark.parametrize("command", ["export", "analyze"])
def test_a_pickled_weights_file_is_refused_without_advising_weights_only_false(tmp_path, capsys, command):
    src = tiny_folder(tmp_path / "src")
    weights = __import__("safetensors.torch", fromlist=["load_file"]).load_file(src / "model.safetensors")
    torch.save(weights, src / "pytorch_model.bin")
    (src / "model.safetensors").unlink()
    capsys.readouterr()
    argv = (
        ["export", "onnx", str(src), str(tmp_path / "m.onnx")]
        if command == "export"
        else ["analyze", "position-similarity", str(src), "--output-dir", str(tmp_path / "a")]
    )
    status = cli(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert status == 2 and len(lines) == 1 and "pytorch_model.bin" in lines[0] and "weights_only=False" not in err
