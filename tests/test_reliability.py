"""Bad input, as an attacker or a careless user would give it: nothing lost, nothing hangs, every bad input named.

One behaviour per test; docs/reliability.md lists them (input, behaviour, test). The converters run through the
`hubvit` command (`scripts/cli.py main`), so what is checked is what a user sees: the exit status and stderr.
"""

import io
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from hubvit import HubViTForImageClassification
from hubvit.conversion.common import ConversionError, read_weights
from hubvit.folder import write_folder
from hubvit.cli import main as cli
from utils import tiny_config

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "PYTHONPATH": str(ROOT),
    "PYTHONDONTWRITEBYTECODE": "1",
}


# --- helpers ------------------------------------------------------------------------------------------------------


def exit_status(argv):
    """The command's exit status, whether argparse refused the text (SystemExit) or the options refused the value."""
    try:
        return cli(argv)
    except SystemExit as error:
        return error.code


def run_python(*args, timeout=600):
    """`python *args` in a fresh interpreter from the repository root, with the tests' environment; text output."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        check=False,
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def jax_arrays(seed=0, width=8, heads=2, mlp=16, patch=4, image=8, classes=3):
    """A one-block ViT in the original vision_transformer .npz layout (FACTS.md section 1), random weights."""
    rng = np.random.default_rng(seed)
    n = lambda *shape: rng.normal(0, 0.3, shape).astype(np.float32)  # noqa: E731
    grid = (image // patch) ** 2
    block = "Transformer/encoderblock_0"
    arrays = {
        "embedding/kernel": n(patch, patch, 3, width),
        "embedding/bias": n(width),
        "cls": n(1, 1, width),
        "Transformer/posembed_input/pos_embedding": n(1, grid + 1, width),
        f"{block}/LayerNorm_0/scale": 1 + n(width),
        f"{block}/LayerNorm_0/bias": n(width),
        f"{block}/LayerNorm_2/scale": 1 + n(width),
        f"{block}/LayerNorm_2/bias": n(width),
        f"{block}/MultiHeadDotProductAttention_1/out/kernel": n(heads, width // heads, width),
        f"{block}/MultiHeadDotProductAttention_1/out/bias": n(width),
        f"{block}/MlpBlock_3/Dense_0/kernel": n(width, mlp),
        f"{block}/MlpBlock_3/Dense_0/bias": n(mlp),
        f"{block}/MlpBlock_3/Dense_1/kernel": n(mlp, width),
        f"{block}/MlpBlock_3/Dense_1/bias": n(width),
        "Transformer/encoder_norm/scale": 1 + n(width),
        "Transformer/encoder_norm/bias": n(width),
        "head/kernel": n(width, classes),
        "head/bias": n(classes),
    }
    for name in ("query", "key", "value"):
        arrays[f"{block}/MultiHeadDotProductAttention_1/{name}/kernel"] = n(width, heads, width // heads)
        arrays[f"{block}/MultiHeadDotProductAttention_1/{name}/bias"] = n(heads, width // heads)
    return arrays


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "src" / "vit.npz"
    path.parent.mkdir()
    np.savez(path, **jax_arrays())
    return path


def hubvit(argv, capsys):
    """(exit status, stderr) of the `hubvit` command."""
    status = cli([str(a) for a in argv])
    return status, capsys.readouterr().err


def tiny_folder(path, seed=0):
    model = HubViTForImageClassification(tiny_config(num_labels=2))
    torch.manual_seed(seed)
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.2)
    return write_folder(model, path)


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


# --- 1. an OUT whose replacement would delete something else ------------------------------------------------------


@pytest.mark.parametrize("out", ["", ".", "..", "SRC", "SRC_PARENT"])
def test_out_that_would_delete_the_current_folder_or_the_source_is_refused(tmp_path, monkeypatch, capsys, out):
    work = tmp_path / "work"
    src = tiny_folder(work / "model")
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    out = {"SRC": src, "SRC_PARENT": work}.get(out, out)
    before = snapshot(tmp_path)
    status, err = hubvit(["export", "transformers", src, out, "--overwrite"], capsys)
    assert status == 2 and "OUT" in err
    assert snapshot(tmp_path) == before, "a refused OUT must leave every file as it was"


def test_root_as_out_is_refused_before_the_source_is_read(tmp_path, capsys):
    # SRC does not exist: the refusal must come from OUT, before anything is read.
    status, err = hubvit(["convert", "jax", tmp_path / "absent.npz", "/", "--overwrite"], capsys)
    assert status == 2 and "root of the file system" in err


# --- 2. replacing an existing OUT (the kill tests are in test_kill_overwrite.py) -----------------------------------


def test_a_failed_swap_puts_the_old_folder_back(tmp_path, monkeypatch):
    from hubvit import folder as folder_module
    from hubvit.folder import replace_folder

    out, new = tmp_path / "out", tmp_path / "new"
    tiny_folder(out, seed=0)
    tiny_folder(new, seed=1)
    old = snapshot(out)
    monkeypatch.setattr(folder_module, "_exchange", lambda first, second: False)  # the rename-aside path
    real_rename, calls = os.rename, []

    def failing_second_rename(source, target):
        calls.append((source, target))
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(target))
        return real_rename(source, target)

    monkeypatch.setattr(os, "rename", failing_second_rename)
    with pytest.raises(OSError):
        replace_folder(new, out)
    assert snapshot(out) == old


def test_stale_staging_folders_of_a_killed_run_are_removed_and_a_set_aside_folder_comes_back(tmp_path):
    from hubvit.folder import clean_stale

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    staging = tmp_path / f".model.hubvit-staging-{pid}-abc"
    aside = tmp_path / f".model.hubvit-old-{pid}-xyz"
    for path in (staging, aside):
        path.mkdir()
        (path / "config.json").write_text("{}")
    clean_stale(tmp_path / "model")
    assert not staging.exists() and not aside.exists()
    assert (tmp_path / "model" / "config.json").read_text() == "{}", "the folder set aside is the user's old folder"
    tiny_folder(tmp_path / "other")
    (tmp_path / f".other.hubvit-staging-{pid}-def").mkdir()
    write_folder(HubViTForImageClassification(tiny_config(num_labels=2)), tmp_path / "other", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "other"]


# --- 3. NaN or infinite weights -----------------------------------------------------------------------------------


def test_jax_checkpoint_with_nan_is_refused_naming_the_tensor(tmp_path, capsys):
    arrays = jax_arrays()
    arrays["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"][0, 0] = np.nan
    arrays["head/bias"][1] = np.inf
    np.savez(tmp_path / "nan.npz", **arrays)
    status, err = hubvit(["convert", "jax", tmp_path / "nan.npz", tmp_path / "out"], capsys)
    assert status == 2
    assert "NaN or infinite" in err and "MlpBlock_3/Dense_0/kernel (1 of 128 values)" in err and "head/bias" in err
    assert not (tmp_path / "out").exists()


def test_infinite_clipping_bounds_pass_and_a_nan_bound_or_infinite_weight_is_refused():
    """timm's Gemma 4 tower stores unbounded clamps as -inf / inf buffers by design; NaN means nothing anywhere."""
    from hubvit.conversion.weights import check_finite
    from hubvit.errors import ConversionError

    bounds = {"blocks.0.attn.input_min": torch.tensor(-np.inf), "blocks.0.attn.output_max": torch.tensor(np.inf)}
    check_finite({**bounds, "blocks.0.attn.qkv.weight": torch.ones(3)}, "model.safetensors")
    bad = {"blocks.0.attn.input_min": torch.tensor(np.nan), "blocks.0.attn.qkv.weight": torch.full((3,), np.inf)}
    for key, value in bad.items():
        with pytest.raises(ConversionError, match=rf"1 tensors hold NaN or infinite values:\s+{re.escape(key)} "):
            check_finite({**bounds, key: value}, "model.safetensors")


def test_clean_jax_checkpoint_converts(npz, tmp_path, capsys):
    """The NaN test's control: the same tiny archive without NaN converts."""
    status, err = hubvit(["convert", "jax", npz, tmp_path / "out"], capsys)
    assert status == 0, err


TIMM_ARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2, "num_classes": 3}


@pytest.mark.parametrize("verify", ["--verify", "--no-verify"])
def test_timm_weights_with_nan_are_refused_before_any_verification(tmp_path, capsys, verify):
    timm = pytest.importorskip("timm")
    weights = timm.create_model("vit_tiny_patch16_224", pretrained=False, **TIMM_ARGS).state_dict()
    weights["blocks.0.mlp.fc1.weight"][3, 2] = float("nan")
    save_file(weights, tmp_path / "nan.safetensors")
    status, err = hubvit(
        [
            "convert",
            "timm",
            tmp_path / "nan.safetensors",
            tmp_path / "out",
            "--architecture",
            "vit_tiny_patch16_224",
            "--model-args",
            json.dumps(TIMM_ARGS),
            verify,
        ],
        capsys,
    )
    assert status == 2
    assert "blocks.0.mlp.fc1.weight" in err and "NaN" in err and "does not reproduce" not in err
    assert not (tmp_path / "out").exists()


# --- 4. a Hub endpoint that never answers, or is closed ------------------------------------------------------------


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers."""

    def __enter__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.held = []
        self.endpoint = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        while True:
            try:
                self.held.append(self.socket.accept()[0])
            except OSError:
                return

    def __exit__(self, *exc):
        self.socket.close()
        for connection in self.held:
            connection.close()


def closed_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def push_folder_path(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("push") / "tiny")


def test_push_to_an_endpoint_that_never_answers_times_out_with_one_line(push_folder_path):
    from hubvit.hub import PushError, push_folder

    with SilentServer() as server:
        started = time.monotonic()
        with pytest.raises(PushError) as error:
            push_folder(push_folder_path, "me/tiny", endpoint=server.endpoint, token="hf_test", timeout=1)
        elapsed = time.monotonic() - started
    assert server.endpoint in str(error.value) and "did not answer in time" in str(error.value)
    assert "\n" not in str(error.value)
    assert elapsed < 30  # one request of 1 s, plus the client's few retries at most


def test_push_to_a_closed_port_gives_one_line_naming_the_endpoint(push_folder_path):
    from hubvit.hub import PushError, push_folder

    endpoint = closed_endpoint()
    with pytest.raises(PushError) as error:
        push_folder(push_folder_path, "me/tiny", endpoint=endpoint, token="hf_test", timeout=5)
    assert f"cannot reach the Hub at {endpoint}" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.heavy
def test_hubvit_push_with_a_silent_endpoint_exits_2_with_one_line(push_folder_path):
    with SilentServer() as server:
        run = subprocess.run(
            [sys.executable, "-m", "hubvit.cli", "push", str(push_folder_path), "me/tiny", "--timeout", "1"],
            cwd=ROOT,
            env={**ENV, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": server.endpoint, "HF_TOKEN": "hf_test"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and server.endpoint in run.stderr


def test_push_help_states_the_timeout_default():
    from hubvit.cli import build_parser

    push = build_parser()._subparsers._group_actions[0].choices["push"]
    text = " ".join(push.format_help().split())
    assert "--timeout SECONDS" in text and "default: 60 s" in text


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_push_timeout_must_be_a_positive_finite_number(value, capsys):
    assert exit_status(["push", "folder", "me/tiny", f"--timeout={value}"]) == 2
    assert "timeout" in capsys.readouterr().err


# --- 5 and 6. fine-tuning from a folder whose config does not match its weights; an unwritable OUTPUT_DIR ------------


@pytest.fixture(scope="module")
def finetune_data(tmp_path_factory):
    from test_finetune import saved_dataset

    return saved_dataset(tmp_path_factory.mktemp("ft") / "saved", n=24)


def finetune(argv, capsys):
    """(exit status, stderr) of scripts/finetune.py main() run in this process."""
    from test_finetune import run_in_process

    try:
        status = run_in_process([str(a) for a in argv])
    except SystemExit as exit_info:
        status = exit_info.code
    return status, capsys.readouterr().err


def data_flags(data):
    return ["--dataset_name", data, "--image_column_name", "img", "--label_column_name", "target"]


TINY = [
    "--config_overrides",
    "patch_size=4,hidden_size=32,num_hidden_layers=2,intermediate_size=64",
    "--image_size",
    "16",
]


def edited_folder(tmp_path, **config_changes):
    """A hubvit folder (3 labels, 2 layers) whose config.json is then edited to say something its weights are not."""
    model = HubViTForImageClassification(tiny_config(num_labels=3, image_size=16, patch_size=4))
    folder = write_folder(model, tmp_path / "start")
    config = json.loads((folder / "config.json").read_text())
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "change, names",
    [
        ({"intermediate_size": 48}, ["hubvit.encoder.layers.0.mlp.fc1.weight (64, 32) vs (48, 32)"]),
        ({"num_hidden_layers": 3}, ["missing keys", "hubvit.encoder.layers.2.mlp.fc1.weight"]),
        ({"position_embedding_type": "none"}, ["unexpected keys", "hubvit.embeddings.position_embedding"]),
    ],
)
def test_finetuning_from_weights_that_do_not_fit_their_config_stops_before_training(
    tmp_path, finetune_data, capsys, change, names
):
    folder = edited_folder(tmp_path, **change)
    out = tmp_path / "out"
    status, err = finetune(
        [*data_flags(finetune_data), "--model_name_or_path", folder, "--max_train_steps", "1", "--output_dir", out],
        capsys,
    )
    assert status == 2
    assert "do not fit its config" in err
    for name in names:
        assert name in err
    assert not (out / "model").exists()


def test_only_the_head_is_replaced_and_only_for_a_new_label_count(tmp_path):
    from hubvit.training import UsageError, load_pretrained

    model = HubViTForImageClassification(tiny_config(num_labels=3))
    folder = write_folder(model, tmp_path / "start")
    config = model.config
    labels = {i: f"c{i}" for i in range(5)}
    tuned = load_pretrained(folder, config, labels, {v: k for k, v in labels.items()})
    assert tuned.classifier.weight.shape[0] == 5
    for name, value in model.hubvit.state_dict().items():
        assert torch.equal(tuned.hubvit.state_dict()[name], value), name
    same = {i: f"c{i}" for i in range(3)}
    assert torch.equal(load_pretrained(folder, config, same, {}).classifier.weight, model.classifier.weight)
    config_file = folder / "config.json"
    edited = json.loads(config_file.read_text())
    edited["intermediate_size"] = 48
    config_file.write_text(json.dumps(edited))
    with pytest.raises(UsageError, match="mlp.fc1"):
        load_pretrained(folder, config, labels, {})


@pytest.mark.parametrize("kind", ["file", "below a file"])
def test_output_dir_that_cannot_be_written_fails_before_the_first_step(tmp_path, finetune_data, capsys, kind):
    blocker = tmp_path / "taken"
    blocker.write_text("a file")
    out = blocker if kind == "file" else blocker / "run"
    status, err = finetune([*data_flags(finetune_data), *TINY, "--max_train_steps", "1", "--output_dir", out], capsys)
    assert status == 2 and str(blocker) in err
    assert "updates over" not in err, "the run must stop before training starts"
    assert blocker.read_text() == "a file"


# --- fine-tuning: arguments and data that would train on garbage or be ignored ------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--learning_rate", "nan"], "--learning_rate must be a finite number >= 0, got nan"),
        (["--max_train_steps", "0"], "--max_train_steps must be >= 1, got 0"),
        (["--max_train_samples", "-5"], "--max_train_samples must be >= 1, got -5"),
        (["--max_eval_samples", "-1"], "--max_eval_samples must be >= 1, got -1"),
        (["--lr_scheduler_type", "cosinus"], "--lr_scheduler_type 'cosinus' cannot be used here"),
        (["--warmup_ratio", "1.5"], "--warmup_ratio must be a finite number in [0, 1), got 1.5"),
        (["--label_smoothing", "inf"], "--label_smoothing must be a finite number in [0, 1), got inf"),
    ],
)
def test_bad_numbers_and_names_fail_before_training(tmp_path, finetune_data, capsys, extra, message):
    out = tmp_path / "out"
    steps = [] if "--max_train_steps" in extra else ["--max_train_steps", "1"]
    status, err = finetune([*data_flags(finetune_data), *TINY, *steps, *extra, "--output_dir", out], capsys)
    assert status == 2 and message in err
    assert not (out / "checkpoints").exists() and not (out / "model").exists()


def test_a_class_too_small_for_the_held_out_split_is_named(tmp_path, capsys):
    from test_finetune import class_image

    import datasets

    labels = [0] * 10 + [1] * 10 + [2]
    features = datasets.Features(
        {"img": datasets.Image(), "target": datasets.ClassLabel(names=["red", "green", "blue"])}
    )
    datasets.Dataset.from_dict(
        {"img": [class_image(y, i) for i, y in enumerate(labels)], "target": labels}, features=features
    ).save_to_disk(str(tmp_path / "thin"))
    status, err = finetune(
        [*data_flags(tmp_path / "thin"), *TINY, "--max_train_steps", "1", "--output_dir", tmp_path / "out"], capsys
    )
    assert status == 2 and "'blue' (1 images)" in err and "--train_val_split" in err


@pytest.mark.parametrize("damage", ["zero bytes", "truncated", "garbage"])
def test_an_unreadable_image_is_named_with_its_index(tmp_path, capsys, damage):
    from test_finetune import write_imagefolder

    train = write_imagefolder(tmp_path / "train", ["a", "b"], 6)
    bad = train / "b" / "3.png"
    data = bad.read_bytes()
    bad.write_bytes({"zero bytes": b"", "truncated": data[: len(data) // 2], "garbage": os.urandom(len(data))}[damage])
    status, err = finetune(
        [
            "--train_dir",
            train,
            *TINY,
            "--train_val_split",
            "0.5",
            "--max_train_steps",
            "3",
            "--per_device_train_batch_size",
            "6",
            "--output_dir",
            tmp_path / "out",
        ],
        capsys,
    )
    assert status == 2
    assert str(bad) in err and "cannot be read" in err
    index = int(err.split("image ")[1].split(" ")[0])
    assert index >= 0


# --- fine-tuning: damaged checkpoints ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory, finetune_data):
    from test_finetune import run_in_process

    out = tmp_path_factory.mktemp("ckpt") / "run"
    run_in_process(
        [
            *map(str, data_flags(finetune_data)),
            *TINY,
            "--max_train_steps",
            "1",
            "--checkpointing_steps",
            "1",
            "--output_dir",
            str(out),
        ]
    )
    return out


class Evil:
    def __reduce__(self):
        return (print, ("this would have run",))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("trainer_state.json garbage", "is not a valid trainer state"),
        ("model.safetensors garbage", "cannot be loaded"),
        ("random_states_0.pkl with code", "random_states_0.pkl cannot be read"),
        ("random_states_0.pkl truncated", "random_states_0.pkl cannot be read"),
        ("random_states_0.pkl missing", "random_states_0.pkl is missing"),
    ],
)
def test_a_damaged_checkpoint_fails_the_resume(tmp_path, checkpoint_run, finetune_data, capsys, damage, message):
    out = tmp_path / "run"
    shutil.copytree(checkpoint_run / "checkpoints", out / "checkpoints")
    checkpoint = out / "checkpoints" / "checkpoint_1"
    name = damage.split(" ")[0]
    target = checkpoint / name
    if damage.endswith("garbage"):
        target.write_bytes(b"\x00garbage" * 16)
    elif damage.endswith("code"):
        buffer = io.BytesIO()
        torch.save({"random_state": Evil()}, buffer)
        target.write_bytes(buffer.getvalue())
    elif damage.endswith("truncated"):
        target.write_bytes(target.read_bytes()[:40])
    else:
        target.unlink()
    status, err = finetune(
        [
            *data_flags(finetune_data),
            *TINY,
            "--max_train_steps",
            "2",
            "--output_dir",
            out,
            "--resume_from_checkpoint",
            checkpoint,
        ],
        capsys,
    )
    assert status == 2 and message in err, err[-2000:]
    assert "this would have run" not in err
    assert not (out / "model").exists()


# --- clear errors from the converters and the CLI ------------------------------------------------------------------


def test_timm_folder_with_invalid_config_json_names_the_file(tmp_path, capsys):
    pytest.importorskip("timm")
    src = tmp_path / "timm"
    src.mkdir()
    (src / "config.json").write_text("{'architecture': vit}")
    save_file({"x": torch.zeros(1)}, src / "model.safetensors")
    status, err = hubvit(["convert", "timm", src, tmp_path / "out"], capsys)
    assert status == 2 and f"{src / 'config.json'}: not valid JSON" in err


@pytest.mark.parametrize("target", ["transformers", "timm"])
def test_export_of_a_missing_folder_says_it_does_not_exist(tmp_path, capsys, target):
    status, err = hubvit(["export", target, tmp_path / "nowhere", tmp_path / "out"], capsys)
    assert status == 2 and "nowhere: no such folder" in err and "model_type" not in err


@pytest.mark.parametrize(
    "command",
    [
        ["convert", "timm"],
        ["convert", "transformers"],
        ["convert", "torchvision", "--num-heads=4"],
        ["convert", "pytorch", "--num-heads=4"],
        ["export", "transformers"],
        ["export", "timm"],
    ],
)
@pytest.mark.parametrize("value", ["0", "-1e-5", "nan", "inf"])
def test_tolerance_must_be_positive_and_finite(tmp_path, capsys, command, value):
    assert exit_status([*command, str(tmp_path / "src"), str(tmp_path / "out"), f"--tolerance={value}"]) == 2
    assert "positive finite" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["0", "-32"])
def test_jax_image_size_must_be_positive(npz, tmp_path, capsys, size):
    status, err = hubvit(["convert", "jax", npz, tmp_path / "out", f"--image-size={size}"], capsys)
    assert status == 2 and f"--image-size must be a positive number of pixels, got {size}" in err


def test_out_below_a_file_is_one_line_with_exit_status_2(npz, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    status, err = hubvit(["convert", "jax", npz, tmp_path / "file" / "out"], capsys)
    assert status == 2 and "Traceback" not in err and str(tmp_path / "file") in err
    assert len(err.strip().splitlines()) == 1


def test_symlink_out_is_refused(npz, tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "keep.txt").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    status, err = hubvit(["convert", "jax", npz, tmp_path / "link", "--overwrite"], capsys)
    assert status == 2 and "symbolic link" in err
    assert (tmp_path / "real" / "keep.txt").read_text() == "mine"


def test_a_full_disk_while_writing_is_one_line_with_exit_status_2(npz, tmp_path):
    """RLIMIT_FSIZE makes every write past 1 kB fail with EFBIG, as a full disk fails with ENOSPC."""
    code = (
        "import resource, sys\n"
        "from hubvit.cli import main\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
        f"sys.exit(main(['convert', 'jax', {str(npz)!r}, {str(tmp_path / 'out')!r}]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "too large" in run.stderr.lower()
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")], "the staging folder must be removed"


# --- the model API -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return HubViTForImageClassification(tiny_config(num_labels=2)).eval()


@pytest.mark.parametrize(
    "shape, message",
    [
        ((0, 3, 32, 32), "batch size 0"),
        ((1, 3, 0, 32), "smaller than one patch"),
        ((1, 3, 32, 0), "smaller than one patch"),
        ((1, 3, 4, 4), "smaller than one patch"),
    ],
)
def test_empty_batches_and_images_smaller_than_a_patch_raise_value_error_naming_the_shape(model, shape, message):
    with pytest.raises(ValueError, match=message) as error:
        model(pixel_values=torch.zeros(shape))
    assert str(shape) in str(error.value)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
def test_integer_or_bool_pixels_are_refused_with_a_hint_to_the_image_processor(model, dtype):
    with pytest.raises(ValueError, match="image processor"):
        model(pixel_values=torch.zeros(1, 3, 32, 32, dtype=dtype))


@pytest.mark.parametrize(
    "field, value",
    [
        ("layer_norm_eps", 0.0),
        ("layer_norm_eps", -1e-6),
        ("layer_norm_eps", math.nan),
        ("hidden_dropout_prob", 1.0),
        ("attention_probs_dropout_prob", -0.1),
        ("drop_path_rate", 1.0),
        ("drop_path_rate", math.nan),
    ],
)
def test_config_ranges_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value})


# --- security -----------------------------------------------------------------------------------------------------


def test_push_refuses_symlinks_that_leave_the_folder_listing_them(tmp_path):
    from hubvit.hub import PushError, check_files

    folder = tiny_folder(tmp_path / "tiny")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the Hub")
    (folder / "notes.txt").symlink_to(secret)
    (folder / "up").symlink_to(tmp_path)
    (folder / "inside.md").symlink_to(folder / "README.md")  # stays inside: allowed
    with pytest.raises(PushError) as error:
        check_files(folder)
    message = str(error.value)
    assert "notes.txt -> " in message and "up -> " in message and "inside.md" not in message


def test_push_without_the_load_check_never_runs_the_folders_code(hub_server, tmp_path, monkeypatch):
    from hubvit import hub

    folder = tiny_folder(tmp_path / "tiny")

    def must_not_run(path, timeout=None):
        raise AssertionError("the folder's code was run")

    monkeypatch.setattr(hub, "check_loads", must_not_run)
    info = hub.push_folder(folder, f"{hub_server.user}/unchecked", load_check=False)
    assert info.commit_url
    assert "config.json" in hub_server.files(f"{hub_server.user}/unchecked")


@pytest.mark.heavy
def test_push_check_refuses_a_folder_whose_position_table_type_differs_from_its_weights(tmp_path):
    from hubvit.hub import PushError, check_loads

    folder = edited_folder(tmp_path, position_embedding_type="none")
    with pytest.raises(PushError) as error:
        check_loads(folder)
    assert "unexpected_keys" in str(error.value) and "hubvit.embeddings.position_embedding" in str(error.value)


def test_the_load_check_runs_once_per_folder_content_and_again_when_a_file_changes(tmp_path, monkeypatch):
    from hubvit import hub

    folder = tiny_folder(tmp_path / "tiny")
    loads = []

    def fake_run(command, **kwargs):
        loads.append(command)
        output = json.dumps({"class": "HubViTForImageClassification", "output": "logits", "shape": [1, 3]})
        return subprocess.CompletedProcess(command, 0, stdout=output + "\n", stderr="")

    monkeypatch.setattr(hub.subprocess, "run", fake_run)
    monkeypatch.setattr(hub, "_LOADED", {})
    first = hub.check_loads(folder)
    (folder / "README.md").write_text("a card edit changes nothing the loader reads\n")
    assert hub.check_loads(folder) == first and len(loads) == 1
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-5}))
    hub.check_loads(folder)
    assert len(loads) == 2


def test_push_help_says_the_load_check_runs_the_folders_code():
    from hubvit.cli import build_parser

    push = build_parser()._subparsers._group_actions[0].choices["push"]
    text = " ".join(push.format_help().split())
    assert "--no-load-check" in text and "RUNS the folder's own modeling_hubvit.py" in text


def test_sharded_index_with_paths_leaving_the_folder_is_refused(tmp_path, capsys):
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
        layer_norm_eps=1e-6,
    )
    src = tmp_path / "vit"
    ViTForImageClassification(config).save_pretrained(src, max_shard_size="20KB")
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / "elsewhere").mkdir()
    shutil.move(src / shard, tmp_path / "elsewhere" / shard)
    index["weight_map"] = {k: (f"../elsewhere/{v}" if v == shard else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    status, err = hubvit(["convert", "transformers", src, tmp_path / "out", "--no-verify"], capsys)
    assert status == 2 and "shard paths leave the folder" in err and f"../elsewhere/{shard}" in err
    from hubvit.conversion.common import shard_files

    with pytest.raises(ConversionError):
        shard_files(index_path)


# --- the readers never unpickle and never leak a raw error ---------------------------------------------------------


def test_corrupted_weight_files_always_give_conversion_error(tmp_path):
    """Truncations and bit flips of each format (300 seeded variants) end in ConversionError naming the file."""
    buffer = io.BytesIO()
    torch.save({"a": torch.ones(30), "b": torch.zeros(4, 4)}, buffer)
    torch_bytes = buffer.getvalue()
    buffer = io.BytesIO()
    np.savez_compressed(buffer, a=np.ones(30))
    npz_bytes = buffer.getvalue()
    from safetensors.torch import save

    formats = [(torch_bytes, ".bin"), (npz_bytes, ".npz"), (save({"a": torch.ones(30)}), ".safetensors")]
    rng = random.Random(0)
    for i in range(300):
        data, suffix = formats[i % 3]
        data = bytearray(data)
        if rng.random() < 0.3:
            data = data[: rng.randrange(0, len(data))]
        else:
            for _ in range(rng.randrange(1, 10)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        path = tmp_path / f"{i}{suffix}"
        path.write_bytes(bytes(data))
        try:
            read_weights(path)
        except ConversionError as error:
            assert str(path) in str(error)


class Shell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("payload", ["print", "os.system"])
def test_pickled_code_in_a_torch_file_is_refused_not_run(tmp_path, capsys, payload):
    """torch words the two refusals differently ('Unsupported global' and 'module ... is blocked')."""
    marker = tmp_path / "ran"
    torch.save({"weight": torch.ones(2), "x": Evil() if payload == "print" else Shell(marker)}, tmp_path / "evil.bin")
    with pytest.raises(ConversionError, match="refused to unpickle"):
        read_weights(tmp_path / "evil.bin")
    assert "this would have run" not in capsys.readouterr().out and not marker.exists()


def test_random_bytes_named_as_torch_or_npz_are_called_corrupt_not_malicious(tmp_path):
    for suffix in (".bin", ".npz"):
        path = tmp_path / f"noise{suffix}"
        path.write_bytes(np.random.default_rng(0).bytes(2000))
        with pytest.raises(ConversionError) as error:
            read_weights(path)
        assert "refused to unpickle" not in str(error.value)
