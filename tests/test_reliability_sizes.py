"""Issue 27, POOR: absurd sizes and malformed configs end in one line (exit status 2) before anything is allocated.

Each file here declares more than any machine holds (a 4 TB array, 10^9-wide layers, a million-pixel-square image)
or has the wrong JSON shape; what is checked is the exit status, one `hubvit ...: error:` line naming the file or
field, and that no OUT appears. Budgets that depend on this machine's memory are pinned with HUBVIT_MAX_WEIGHT_BYTES.
"""

import json
import struct
import zipfile

import numpy as np
import pytest
from hubvit.cli import main as cli
from test_reliability import tiny_folder


def errors(capsys):
    """The `hubvit ...: error:` lines of stderr (progress bars of helpers that write fixtures are not errors)."""
    return [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]


def npz_declaring(path, name, shape):
    """An .npz whose one member's .npy header declares `shape` float32 but holds only 16 bytes of data."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.float32))
    header["shape"] = shape
    buffer = __import__("io").BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}.npy", buffer.getvalue() + b"\0" * 16)
    return path


def test_an_npz_header_declaring_a_4_tb_array_is_refused_by_name(tmp_path, capsys):
    path = npz_declaring(tmp_path / "vit.npz", "embedding/kernel", (10**12,))
    status = cli(["convert", "jax", str(path), str(tmp_path / "out")])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1
    assert "'embedding/kernel'" in lines[0] and "declares shape (1000000000000,)" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_sparse_12_gb_safetensors_file_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    """The readers are replaced by ones that fail the test: code that reached them would fill 12 GB of memory."""
    import safetensors
    import safetensors.torch

    def never(*args, **kwargs):
        raise AssertionError("the 12 GB file was opened for reading")

    monkeypatch.setattr(safetensors.torch, "load_file", never)
    monkeypatch.setattr(safetensors.torch, "load", never)
    monkeypatch.setattr(safetensors, "safe_open", never)
    monkeypatch.setenv("HUBVIT_MAX_WEIGHT_BYTES", str(10**9))
    path = tmp_path / "vit.safetensors"
    size = 12 * 10**9
    header = json.dumps({"conv_proj.weight": {"dtype": "F32", "shape": [size // 4], "data_offsets": [0, size]}})
    header = header.encode() + b" " * (-len(header) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(header)) + header)
        file.truncate(8 + len(header) + size)  # sparse: no disk used
    status = cli(["convert", "torchvision", str(path), str(tmp_path / "out"), "--architecture", "vit_b_16"])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1
    assert str(path) in lines[0] and "12.0 GB" in lines[0] and "HUBVIT_MAX_WEIGHT_BYTES" in lines[0]


def transformers_folder(path, **changes):
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=16,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=2,
    )
    ViTForImageClassification(config).save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, **changes}))
    return path


@pytest.mark.parametrize("field, value", [("hidden_size", 10**9), ("image_size", 10**6)])
def test_convert_transformers_refuses_an_absurd_config_naming_the_field(tmp_path, capsys, field, value):
    src = transformers_folder(tmp_path / "vit", **{field: value})
    capsys.readouterr()
    status = cli(["convert", "transformers", str(src), str(tmp_path / "out")])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "config.json" in lines[0]
    assert (field if field == "hidden_size" else "image_size 1000000x1000000") in lines[0]


def edited_hubvit_folder(tmp_path, **changes):
    folder = tiny_folder(tmp_path / "src")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, **changes}))
    return folder


@pytest.mark.parametrize("field, value", [("hidden_size", 10**9), ("image_size", 10**6)])
def test_export_refuses_an_absurd_config_before_building_the_model(tmp_path, capsys, field, value):
    src = edited_hubvit_folder(tmp_path, **{field: value})
    capsys.readouterr()
    status = cli(["export", "onnx", str(src), str(tmp_path / "model.onnx")])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "config.json" in lines[0] and field.split("_")[0] in lines[0]


def test_analyze_refuses_an_absurd_config(tmp_path, capsys):
    src = edited_hubvit_folder(tmp_path, hidden_size=10**9)
    capsys.readouterr()
    status = cli(["analyze", "position-similarity", str(src), "--output-dir", str(tmp_path / "a")])
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "hidden_size" in lines[0]


def test_analyze_refuses_an_image_size_whose_attention_cannot_fit(tmp_path, capsys):
    status = cli(
        ["analyze", "position-similarity", "s/16", "--image-size", "160000", "--output-dir", str(tmp_path / "a")]
    )
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1 and "160000x160000" in lines[0] and "tokens" in lines[0]


@pytest.mark.parametrize("command", ["convert transformers", "export onnx", "push"])
def test_a_config_json_that_is_a_list_is_one_line_naming_the_file(tmp_path, capsys, command):
    if command == "convert transformers":
        src = transformers_folder(tmp_path / "vit")
    else:
        src = tiny_folder(tmp_path / "src")
    (src / "config.json").write_text("[1, 2, 3]")
    capsys.readouterr()
    argv = {
        "convert transformers": ["convert", "transformers", str(src), str(tmp_path / "out")],
        "export onnx": ["export", "onnx", str(src), str(tmp_path / "m.onnx")],
        "push": ["push", str(src), "me/tiny", "--no-load-check"],
    }[command]
    status = cli(argv)
    lines = errors(capsys)
    assert status == 2 and len(lines) == 1
    assert "config.json" in lines[0] and "expected a JSON object" in lines[0]


def test_the_budget_accepts_vit_huge_at_518_pixels():
    from hubvit.limits import check_config_sizes

    check_config_sizes(
        {
            "hidden_size": 1280,
            "num_hidden_layers": 32,
            "intermediate_size": 5120,
            "num_attention_heads": 16,
            "image_size": 518,
            "patch_size": 14,
        }
    )


def test_the_budget_refuses_a_billion_wide_layer_by_name():
    from hubvit.limits import SizeError, check_config_sizes

    with pytest.raises(SizeError, match="hidden_size=1000000000"):
        check_config_sizes({"hidden_size": 10**9, "num_hidden_layers": 1})


def test_a_hubvit_config_is_sized_by_its_counted_parameters(monkeypatch):
    """A converted config is counted on its model (a gated MLP's third matrix included), not bounded from the plain
    ViT's formula: a budget between the two refuses the gated model and passes the plain one."""
    from hubvit import HubViTConfig
    from hubvit.limits import SizeError, check_config_sizes, counted_parameters

    sizes = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, image_size=32)
    plain, gated = HubViTConfig(**sizes), HubViTConfig(**sizes, mlp_type="gated", hidden_act="silu")
    assert counted_parameters(gated) - counted_parameters(plain) == 4 * (256 * 1024 + 1024)  # fc1 twice as wide
    monkeypatch.setenv("HUBVIT_MAX_MODEL_BYTES", str(4 * (counted_parameters(plain) + 300_000)))
    check_config_sizes(plain)
    with pytest.raises(SizeError, match="intermediate_size=1024"):
        check_config_sizes(gated)


SPARSE_CHILD = """
import json, resource, sys
from pathlib import Path
from hubvit.cli import main
import timm  # imported before the limit, as the converters would
argv_list = json.loads(sys.argv[1])
for argv in argv_list:
    used = next(int(l.split()[1]) * 1024 for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmSize:"))
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (used + 3 * 10**9, hard))
    print("status", main(argv), flush=True)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
"""


def sparse_safetensors(path, name, size=12 * 10**9):
    """A safetensors file whose header declares one float32 tensor of `size` bytes; sparse, so no disk is used."""
    header = json.dumps({name: {"dtype": "F32", "shape": [size // 4], "data_offsets": [0, size]}})
    header = header.encode() + b" " * (-len(header) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(header)) + header)
        file.truncate(8 + len(header) + size)
    return path


def test_a_sparse_12_gb_safetensors_file_under_ulimit_v_is_refused_naming_the_limit(tmp_path):
    """The machine has more memory available than the file declares, but `ulimit -v` leaves the process 3 GB:
    safetensors' reader raised MemoryError ("Cannot allocate memory (os error 12)") in the converters and in a
    folder load. Each route now refuses before reading, naming the file, the largest tensor's size and the limit."""
    from test_reliability import run_python

    weights = sparse_safetensors(tmp_path / "vit.safetensors", "patch_embed.weight")
    folder = tiny_folder(tmp_path / "folder")
    sparse_safetensors(folder / "model.safetensors", "hubvit.embeddings.patch_embedding.weight")
    routes = [
        ["convert", "pytorch", str(weights), str(tmp_path / "out1"), "--num-heads", "4"],
        ["convert", "timm", str(weights), str(tmp_path / "out2"), "--architecture", "vit_tiny_patch16_224"],
        ["export", "onnx", str(folder), str(tmp_path / "m.onnx")],
    ]
    run = run_python("-c", SPARSE_CHILD, json.dumps(routes))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["status", "2"] * 3, run.stdout + run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if ": error: " in line]
    assert len(lines) == 3 and "Traceback" not in run.stderr and "MemoryError" not in run.stderr, run.stderr[-3000:]
    for line, path in zip(lines, [weights, weights, folder / "model.safetensors"]):
        assert str(path) in line and "12.0 GB" in line and "ulimit -v" in line, line
    assert "'patch_embed.weight', 12.0 GB" in lines[0]
    assert not any((tmp_path / name).exists() for name in ("out1", "out2", "m.onnx"))
