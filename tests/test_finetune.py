"""hubvit.training through scripts/finetune.py and `hubvit.train`: data paths, resumption after SIGKILL, two-process
DDP, bad arguments, the output folder.

Everything runs offline on tiny synthetic images and tiny models; the embedded-default recipe itself (MNIST digits
to >= 0.95) is measured in the README, not here, because it takes minutes.
"""

import re
import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from utils import run_without_hubvit, tiny_config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "finetune.py"
TINY_MODEL = [
    "--image_size",
    "16",
    "--config_overrides",
    "patch_size=4,hidden_size=32,num_hidden_layers=2,intermediate_size=64",
]
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}


def class_image(label, index, size=20):
    """A class is a colour and a bar position; noise makes every image different."""
    rng = np.random.default_rng(1000 * label + index)
    pixels = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
    pixels[:, :, label % 3] += 120
    pixels[label * 4 : label * 4 + 4, :, :] = 250
    return Image.fromarray(pixels)


def write_imagefolder(root, names, per_class):
    for label, name in enumerate(names):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            class_image(label, i + (100 if "val" in root.name else 0)).save(root / name / f"{i}.png")
    return root


def saved_dataset(path, n=30, class_label=True, image="img", label="target"):
    labels = [i % 3 for i in range(n)]
    features = datasets.Features(
        {
            image: datasets.Image(),
            label: datasets.ClassLabel(names=["red", "green", "blue"]) if class_label else datasets.Value("int64"),
        }
    )
    data = datasets.Dataset.from_dict(
        {image: [class_image(y, i) for i, y in enumerate(labels)], label: labels}, features=features
    )
    data.save_to_disk(str(path))
    return path


def run_in_process(argv):
    """Run the script's main() here (no launcher start-up cost), with Accelerate's singletons reset around it."""
    from accelerate.state import AcceleratorState, GradientState

    from hubvit.cli import finetune

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        return finetune.main(argv)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def run_script(argv, launcher=(), extra_env=None, timeout=600):
    command = [sys.executable, *launcher, str(SCRIPT), *argv] if launcher else [sys.executable, str(SCRIPT), *argv]
    return subprocess.run(
        command, cwd=ROOT, env={**ENV, **(extra_env or {})}, capture_output=True, text=True, timeout=timeout
    )


def results(out):
    return json.loads((Path(out) / "all_results.json").read_text())


@pytest.fixture(scope="module")
def digits_like(tmp_path_factory):
    return saved_dataset(tmp_path_factory.mktemp("data") / "saved")


# --- fast unit tests --------------------------------------------------------------------------------------------


def test_metric_modules_load_offline_and_agree_with_scikit_learn():
    from sklearn.metrics import accuracy_score, top_k_accuracy_score

    from hubvit.training.evaluation import load_metric

    rng = np.random.default_rng(0)
    scores = rng.normal(size=(64, 7))
    labels = rng.integers(0, 7, 64)
    accuracy, top5 = load_metric("accuracy"), load_metric("top5_accuracy")
    accuracy.add_batch(predictions=scores.argmax(-1).tolist(), references=labels.tolist())
    top5.add_batch(predictions=np.argsort(-scores, axis=-1)[:, :5].tolist(), references=labels.tolist())
    assert accuracy.compute()["accuracy"] == pytest.approx(accuracy_score(labels, scores.argmax(-1)), abs=1e-12)
    expected = top_k_accuracy_score(labels, scores, k=5, labels=list(range(7)))
    assert top5.compute()["top5_accuracy"] == pytest.approx(expected, abs=1e-12)


def test_parameter_groups_decay_and_layer_scales():
    from hubvit import HubViTForImageClassification
    from hubvit.training.model import parameter_groups

    model = HubViTForImageClassification(tiny_config(num_labels=3, num_register_tokens=1))
    groups = parameter_groups(model, learning_rate=1.0, weight_decay=0.1, layer_decay=0.5)
    decayed = {name for g in groups if g["weight_decay"] > 0 for name in g["names"]}
    plain = {name for g in groups if g["weight_decay"] == 0 for name in g["names"]}
    assert decayed | plain == {name for name, _ in model.named_parameters()}
    for name in plain:
        assert name.endswith("bias") or "norm" in name or "token" in name or "position" in name, name
    assert "classifier.weight" in decayed and "hubvit.embeddings.patch_embedding.weight" in decayed
    lr = {name: g["lr"] for g in groups for name in g["names"]}
    depth = model.config.num_hidden_layers
    assert lr["classifier.weight"] == 1.0
    assert lr["hubvit.encoder.layers.1.mlp.fc1.weight"] == 0.5 ** (depth - 1)
    assert lr["hubvit.embeddings.position_embedding"] == 0.5 ** (depth + 1)


def test_augmentation_depends_only_on_seed_epoch_and_index():
    from hubvit.preprocessing import Preprocessing
    from hubvit.training.data import SeededImages, make_transforms

    data = datasets.Dataset.from_dict({"image": [class_image(0, i) for i in range(3)], "label": [0, 0, 0]})
    train_tf, _ = make_transforms((16, 16), Preprocessing(), "inception", randaugment=2)
    images = SeededImages(data, train_tf, "image", "label", seed=3)
    first = images[1][0]
    torch.rand(10)  # the global RNG must not matter
    assert torch.equal(images[1][0], first)
    images.set_epoch(1)
    assert not torch.equal(images[1][0], first)


# --- runs ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imagefolder_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagefolder")
    names = ["circle", "moon", "square", "star"]
    write_imagefolder(root / "train", names, 8)
    write_imagefolder(root / "val", names, 3)
    out = root / "out"
    run_in_process(
        [
            "--train_dir",
            str(root / "train"),
            "--validation_dir",
            str(root / "val"),
            "--output_dir",
            str(out),
            *TINY_MODEL,
            "--max_train_steps",
            "4",
            "--per_device_train_batch_size",
            "8",
            "--seed",
            "1",
        ]
    )
    return root, out, names


@pytest.mark.heavy
def test_imagefolder_run_writes_a_hubvit_folder_and_results(imagefolder_run):
    _, out, names = imagefolder_run
    summary = results(out)
    for key in ("eval_accuracy", "eval_top5_accuracy", "train_runtime_s", "num_processes"):
        assert key in summary, key
    assert summary["num_processes"] == 1 and summary["eval_samples"] == 12 and summary["global_step"] == 4
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model_type"] == "hubvit" and config["image_size"] == 16
    assert [config["id2label"][str(i)] for i in range(4)] == names
    assert set(config["auto_map"]) >= {"AutoConfig", "AutoModel", "AutoModelForImageClassification"}
    card = (out / "model" / "README.md").read_text()
    assert "finetune.py" in card and f"{summary['eval_accuracy']:.4f}" in card
    processor = json.loads((out / "model" / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 16, "width": 16}


@pytest.mark.heavy
def test_run_draws_the_analysis_pictures_of_its_model(imagefolder_run):
    _, out, _ = imagefolder_run
    for name in ("position_similarity.png", "attention_distance.png", "attention_map_0.png"):
        with Image.open(out / "analysis" / name) as image:
            image.load()
    distance = json.loads((out / "analysis" / "attention_distance.json").read_text())
    assert distance["images"] == 12 and distance["grid"] == [4, 4]


@pytest.mark.heavy
def test_output_loads_with_trust_remote_code_without_hubvit(imagefolder_run):
    root, out, names = imagefolder_run
    folder = out / "model"
    from hubvit import HubViTForImageClassification

    model = HubViTForImageClassification.from_pretrained(folder).eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(pixel_values=pixels).logits
    loaded = run_without_hubvit(
        f"""
        import json, torch
        from PIL import Image
        from transformers import AutoImageProcessor, AutoModelForImageClassification
        model = AutoModelForImageClassification.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        processor = AutoImageProcessor.from_pretrained({str(folder)!r})
        pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        batch = processor(images=[Image.open({str(root / "val" / "star" / "0.png")!r}).convert("RGB")],
                          return_tensors="pt")
        with torch.no_grad():
            logits = model(pixel_values=pixels).logits
            label = model.config.id2label[model(**batch).logits.argmax(-1).item()]
        print(json.dumps({{"module": type(model).__module__, "logits": logits.tolist(), "label": label,
                          "shape": list(batch["pixel_values"].shape)}}))
        """,
        cwd=root,
    )
    assert loaded["module"].split(".")[0] == "transformers_modules"  # the folder's own modeling file ran
    got = torch.tensor(loaded["logits"])
    # Same weights and modeling file in two processes: float32 round-off only (1e-5 of the logit scale).
    assert (got - expected).abs().max() <= 1e-5 * max(expected.abs().max().item(), 1.0)
    assert loaded["shape"] == [1, 3, 16, 16] and loaded["label"] in names


@pytest.mark.heavy
def test_saved_dataset_run_with_paper_recipe_options(digits_like, tmp_path):
    out = tmp_path / "out"
    run_in_process(
        [
            "--dataset_name",
            str(digits_like),
            "--image_column_name",
            "img",
            "--label_column_name",
            "target",
            "--train_val_split",
            "0.3",
            "--max_train_samples",
            "16",
            "--max_eval_samples",
            "7",
            "--output_dir",
            str(out),
            *TINY_MODEL,
            "--optimizer",
            "sgd",
            "--learning_rate",
            "0.03",
            "--layer_decay",
            "0.75",
            "--lr_scheduler_type",
            "cosine",
            "--num_warmup_steps",
            "1",
            "--max_train_steps",
            "3",
            "--gradient_accumulation_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--label_smoothing",
            "0.1",
            "--mixup_alpha",
            "0.2",
            "--cutmix_alpha",
            "1.0",
            "--randaugment",
            "2",
            "--augment",
            "inception",
            "--checkpointing_steps",
            "epoch",
            "--report_to",
            "tensorboard",
            "--mixed_precision",
            "bf16",
        ]
    )
    summary = results(out)
    assert summary["eval_samples"] == 7 and summary["global_step"] == 3 and summary["train_samples"] == 16
    assert summary["mixed_precision"] == "bf16"
    assert list((out / "logs").rglob("events.out.tfevents*")), "tensorboard tracker wrote nothing"
    # an epoch is 4 batches = 2 updates; the last, partial epoch ends at the step limit
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint_2", "checkpoint_3"]
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "red", "1": "green", "2": "blue"}


@pytest.mark.heavy
def test_pretrained_start_gets_a_new_head_and_a_resized_position_table(imagefolder_run, digits_like, tmp_path):
    _, out, _ = imagefolder_run
    new = tmp_path / "new"
    from hubvit import HubViTForImageClassification

    source = HubViTForImageClassification.from_pretrained(out / "model")
    run_in_process(
        [
            "--model_name_or_path",
            str(out / "model"),
            "--dataset_name",
            str(digits_like),
            "--image_column_name",
            "img",
            "--label_column_name",
            "target",
            "--image_size",
            "24",
            "--max_train_steps",
            "1",
            "--output_dir",
            str(new),
            "--learning_rate",
            "0",
        ]
    )
    tuned = HubViTForImageClassification.from_pretrained(new / "model")
    assert tuned.config.image_size == 24
    assert (
        tuned.hubvit.embeddings.position_embedding.shape[1] == (24 // 4) ** 2
    )  # patch 4, no prefix row (mean pooling)
    body = source.hubvit.embeddings.patch_embedding.weight
    # learning rate 0: the body is the checkpoint's, bit for bit
    assert torch.equal(tuned.hubvit.embeddings.patch_embedding.weight, body)
    assert tuned.config.id2label[0] == "red" and tuned.classifier.weight.shape == (3, 32)
    assert source.classifier.weight.shape == (4, 32)


def kill_after_first_checkpoint(argv, checkpoints, timeout=600):
    """Start the script, SIGKILL it from outside as soon as a complete checkpoint (one whose trainer_state.json, written
    last, exists) appears; its exit status."""
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *argv], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None and time.monotonic() < deadline:
            if checkpoints.is_dir() and list(checkpoints.glob("checkpoint_*/trainer_state.json")):
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        return process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.heavy
def test_sigkill_after_checkpoint_then_resume_matches_uninterrupted(digits_like, tmp_path):
    common = [
        "--dataset_name",
        str(digits_like),
        "--image_column_name",
        "img",
        "--label_column_name",
        "target",
        "--max_train_samples",
        "12",
        "--max_eval_samples",
        "6",
        *TINY_MODEL[:-1],
        TINY_MODEL[-1] + ",drop_path_rate=0.2,hidden_dropout_prob=0.1",
        "--per_device_train_batch_size",
        "4",
        "--max_train_steps",
        "6",
        "--checkpointing_steps",
        "2",
        "--checkpoints_total_limit",
        "2",
        "--mixup_alpha",
        "0.4",
        "--cpu_threads",
        "1",
        "--seed",
        "5",
    ]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    done = run_script([*common, "--output_dir", str(whole)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (whole / "checkpoints").iterdir()) == ["checkpoint_4", "checkpoint_6"]

    killed = kill_after_first_checkpoint([*common, "--output_dir", str(broken)], broken / "checkpoints")
    assert killed == -signal.SIGKILL, f"the run ended on its own (exit {killed}) before the kill"
    assert not (broken / "model").exists()
    # A crash in the middle of writing the next checkpoint leaves a folder without trainer_state.json (Accelerate
    # writes in place): it is never resumed, and is removed before the next save.
    partial = broken / "checkpoints" / "checkpoint_6"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"truncated")

    resumed = run_script([*common, "--output_dir", str(broken), "--resume_from_checkpoint", "latest"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    expected = load_file(whole / "model" / "model.safetensors")
    got = load_file(broken / "model" / "model.safetensors")
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        # Same operations in the same order on the same thread count: float32 round-off at most.
        assert (got[name] - value).abs().max() <= 1e-6 * max(value.abs().max().item(), 1.0), name
    assert results(broken)["eval_accuracy"] == results(whole)["eval_accuracy"]
    assert sorted(p.name for p in (broken / "checkpoints").iterdir()) == ["checkpoint_4", "checkpoint_6"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.heavy
@pytest.mark.parametrize(
    "options",
    [[], ["--gradient_checkpointing"], ["--max_num_patches", "12"]],
    ids=["plain", "gradient_checkpointing", "naflex_patch_sequences"],
)
def test_two_ddp_processes_on_cpu(digits_like, tmp_path, options):
    """DDP over gloo, plain, with activation checkpointing (each block recomputed inside DDP's backward) and on
    patch sequences (`--max_num_patches`: each process's batches padded to their own longest sequence)."""
    out = tmp_path / "ddp"
    launcher = (
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--main_process_port",
        str(free_port()),
    )
    run = run_script(
        [
            "--dataset_name",
            str(digits_like),
            "--image_column_name",
            "img",
            "--label_column_name",
            "target",
            "--train_val_split",
            "0.3",
            "--max_train_samples",
            "16",
            "--max_eval_samples",
            "7",
            *TINY_MODEL,
            "--per_device_train_batch_size",
            "4",
            "--per_device_eval_batch_size",
            "2",
            "--max_train_steps",
            "2",
            "--output_dir",
            str(out),
            *options,
        ],
        launcher=launcher,
        extra_env={"ACCELERATE_USE_CPU": "1"},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    summary = results(out)
    assert summary["num_processes"] == 2
    # 7 examples over 2 processes and batches of 2: gather_for_metrics drops the padding, each counted once.
    assert summary["eval_samples"] == 7
    assert "accelerate launch" in (out / "model" / "README.md").read_text()


# --- bad arguments fail before training ---------------------------------------------------------------------------


@pytest.mark.parametrize("data", [[], ["--dataset_name", "some/dataset"]], ids=["embedded", "dataset"])
def test_help_shows_the_default_each_run_uses(capsys, data):
    """Every recipe default resolved for a run appears, as printed, in `--help` (one place for the defaults)."""
    from hubvit import training
    from hubvit.training.arguments import DEFAULTS

    with pytest.raises(SystemExit):
        training.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    args = training.resolve_defaults(training.parse_args([*data, "--output_dir", "unused"]))
    for key in DEFAULTS["dataset"]:
        value = getattr(args, key)
        entry = re.search(rf"--{key} {key.upper()}[, ](?!\])", text)  # the option's help entry, not the usage line
        help_text = text[entry.start() :]
        assert f"{value:g}" in help_text[:400], (key, value)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--image_column_name", "pixels"], "--image_column_name 'pixels' is not a column"),
        (["--label_column_name", "img"], "not a class label"),
        (["--image_size", "30"], "--image_size 30 is not divisible by the patch size 7"),
        (["--checkpointing_steps", "often"], "--checkpointing_steps must be a positive int or 'epoch'"),
    ],
)
def test_bad_arguments_fail_before_training(digits_like, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    argv = ["--dataset_name", str(digits_like), "--label_column_name", "target", "--output_dir", str(out)]
    if "--image_column_name" not in extra:
        argv += ["--image_column_name", "img"]
    with pytest.raises(SystemExit) as exit_info:
        run_in_process([*argv, *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (out / "checkpoints").exists() and not (out / "all_results.json").exists()


def test_integer_labels_train_as_classes_named_label_i(tmp_path):
    """Issue 50: plain integer labels are classes 0..max named LABEL_i, as the streamed path names them (they were
    refused with a hint to cast them)."""
    from hubvit.training import train

    data = saved_dataset(tmp_path / "ints", n=6, class_label=False, image="image", label="label")
    train(dataset_name=str(data), output_dir=str(tmp_path / "out"), max_train_steps=1, train_val_split=0.5)
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}


@pytest.mark.heavy
def test_push_to_hub_publishes_the_model_folder(hub_server, digits_like, tmp_path):
    repo_id = f"{hub_server.user}/tiny-finetuned"
    out = tmp_path / "out"
    run_in_process(
        [
            "--dataset_name",
            str(digits_like),
            "--image_column_name",
            "img",
            "--label_column_name",
            "target",
            *TINY_MODEL,
            "--max_train_steps",
            "1",
            "--output_dir",
            str(out),
            "--push_to_hub",
            repo_id,
        ]
    )
    files = hub_server.files(repo_id)
    assert files["model.safetensors"] == (out / "model" / "model.safetensors").read_bytes()
    assert {"config.json", "modeling_hubvit.py", "preprocessor_config.json", "README.md"} <= set(files)
    assert not any(name.startswith(("checkpoints", "logs", "all_results")) for name in files)
    assert f'"{repo_id}"' in files["README.md"].decode()


# --- the Python API and the `hubvit train` command ------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"learning_rate": float("nan")}, "--learning_rate must be a finite number >= 0, got nan"),
        ({"optimizer": "adam"}, "--optimizer 'adam': expected one of adamw, sgd"),
        ({"max_train_steps": "10"}, "--max_train_steps '10': expected int, got str"),
        ({"learning_rat": 0.1}, "unknown option(s) learning_rat"),
    ],
)
def test_train_with_a_bad_argument_raises_a_hubvit_error_naming_it(tmp_path, options, message):
    import hubvit

    with pytest.raises(hubvit.HubViTError) as error:
        hubvit.train(output_dir=str(tmp_path / "out"), **options)
    assert isinstance(error.value, ValueError) and message in str(error.value)
    assert not (tmp_path / "out" / "checkpoints").exists() and not (tmp_path / "out" / "model").exists()


def test_train_takes_the_argument_dataclasses_and_keywords_alike():
    from hubvit.training import Arguments, DataArguments, OutputArguments, TrainingArguments

    built = Arguments.build(
        DataArguments(max_train_samples=8),
        TrainingArguments(seed=3),
        OutputArguments(output_dir="out"),
        learning_rate=0.5,
    )
    assert (built.max_train_samples, built.seed, built.output_dir, built.learning_rate) == (8, 3, "out", 0.5)
    parsed = Arguments.build(*built.groups())
    assert parsed == built


def test_importing_hubvit_does_not_import_the_training_stack():
    code = (
        "import sys, hubvit; print(sorted(m for m in ('datasets', 'hubvit.training', 'evaluate') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


def test_hubvit_train_parses_the_options_of_finetune(tmp_path, capsys):
    """`hubvit train` and scripts/finetune.py share one parser: the same refusal, under its own name."""
    from hubvit.cli import main as cli

    with pytest.raises(SystemExit) as exit_info:
        cli(["train", "--output_dir", str(tmp_path), "--warmup_ratio", "1.5"])
    assert exit_info.value.code == 2
    assert "hubvit train: error: --warmup_ratio must be a finite number in [0, 1), got 1.5" in capsys.readouterr().err


@pytest.mark.heavy
def test_hubvit_train_help_works_from_the_installed_wheel(tmp_path):
    """The wheel (not the checkout) carries the training package, its metric scripts and the command."""
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    # Offline, so no build isolation: the interpreter building needs a setuptools with bdist_wheel (>= 70.1); a
    # venv's own ensurepip setuptools may be older, its base interpreter's is the one installed with the project.
    probe = [sys.executable, "-c", "import setuptools.command.bdist_wheel"]
    builder = sys.executable if subprocess.run(probe, capture_output=True).returncode == 0 else sys._base_executable
    built = subprocess.run(
        [builder, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("hubvit-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # The dependencies come from the environment running the tests (a virtual environment's packages are not the
    # base interpreter's "system" ones): its site-packages go on the new venv's path after the venv's own, as plain
    # paths, so the checkout's editable hubvit (a finder that a .pth file installs) is not seen, only the wheel's.
    packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    (Path(packages) / "test-environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = subprocess.run(
        [builder, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run(
        [str(venv / "bin" / "hubvit"), "train", "--help"],
        cwd=elsewhere,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("usage: hubvit train") and "--per_device_train_batch_size" in run.stdout
    where = subprocess.run(
        [str(python), "-c", "import hubvit.training.evaluation as e; print(e.METRICS_DIR)"],
        cwd=elsewhere,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    metrics = Path(where.stdout.strip())
    assert str(venv) in str(metrics) and (metrics / "accuracy" / "accuracy.py").is_file()
