"""Two "machines" on 127.0.0.1 (two `accelerate launch --num_machines 2` of one process each, gloo, CPU), streaming
parquet shards, train and save a model equal to what one process with the same global batches saves.

Each machine reads one shard; the one-process run reads a single shard that holds the same examples in the order
that gives it the same global batches (4 from shard A, then 4 from shard B). With no shuffling, no augmentation and
no dropout, the two runs differ only in the order float32 sums are taken (DDP averages two means of 4 where one
process takes one mean of 8), so the saved weights agree to 1e-5 of their scale. On GPUs the same launch runs with
the FSDP2 and DeepSpeed ZeRO-2 config files (configs/accelerate/).
"""

import subprocess
import sys

import datasets
import pytest
import torch
from safetensors.torch import load_file
from test_finetune import ENV, ROOT, SCRIPT, TINY_MODEL, class_image, free_port

from hubvit.training import shards

STEPS_AND_BATCH = [
    "--max_train_steps",
    "4",
    "--optimizer",
    "sgd",
    "--learning_rate",
    "0.1",
    "--augment",
    "none",
    "--shuffle_buffer",
    "0",
    "--seed",
    "5",
    "--max_eval_samples",
    "6",
    "--warmup_ratio",
    "0",
]


def labelled(ids):
    features = datasets.Features(
        {
            "id": datasets.Value("int64"),
            "img": datasets.Image(),
            "target": datasets.ClassLabel(names=["red", "green", "blue"]),
        }
    )
    return datasets.Dataset.from_dict(
        {"id": ids, "img": [class_image(i % 3, i) for i in ids], "target": [i % 3 for i in ids]}, features=features
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two-shard folder for the machines; one-shard folder with the same global batches for one process."""
    root = tmp_path_factory.mktemp("multinode")
    a, b = list(range(8)), list(range(8, 16))
    write = {"image_column": "img", "label_column": "target", "shuffle_seed": None}
    two, one = root / "two", root / "one"
    shards.write_shards(datasets.concatenate_datasets([labelled(a), labelled(b)]), two, 2, **write)
    shards.write_shards(labelled(a[:4] + b[:4] + a[4:] + b[4:]), one, 1, **write)
    for folder in (two, one):
        shards.write_shards(labelled(list(range(100, 106))), folder, 1, split="validation", **write)
    return two, one


def arguments(folder, out, batch):
    return [
        "--streaming",
        "--dataset_name",
        str(folder),
        "--image_column_name",
        "img",
        "--label_column_name",
        "target",
        *TINY_MODEL,
        "--per_device_train_batch_size",
        str(batch),
        *STEPS_AND_BATCH,
        "--output_dir",
        str(out),
    ]


def launch_machines(argv, port, config=None):
    """Two launches, as two machines would run them (docs/fine-tuning-at-scale.md shows the command)."""
    machines = []
    for rank in (0, 1):
        launcher = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            *(["--config_file", str(config), "--mixed_precision", "no"] if config else ["--multi_gpu"]),
            "--num_machines",
            "2",
            "--num_processes",
            "2",
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
        ]
        env = {**ENV, "ACCELERATE_USE_CPU": "1"} if config is None else {**ENV, "CUDA_VISIBLE_DEVICES": str(rank)}
        machines.append(
            subprocess.Popen(
                [*launcher, str(SCRIPT), *argv],
                cwd=ROOT,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    return machines


def one_process(argv, gpu=False):
    env = {**ENV, "CUDA_VISIBLE_DEVICES": "0"} if gpu else ENV
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *argv],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(processes, timeout=600):
    errors = [p.communicate(timeout=timeout)[1] for p in processes]
    assert [p.returncode for p in processes] == [0] * len(processes), "\n---\n".join(e[-3000:] for e in errors)
    return errors


def assert_same_weights(path, reference):
    saved, expected = load_file(path), load_file(reference)
    assert saved.keys() == expected.keys()
    for key in saved:
        scale = expected[key].abs().max().item() or 1.0
        torch.testing.assert_close(saved[key], expected[key], rtol=0, atol=1e-5 * scale, msg=key)


@pytest.mark.heavy
def test_two_loopback_machines_train_the_model_one_process_trains(data, tmp_path):
    two, one = data
    runs = [
        *launch_machines(arguments(two, tmp_path / "machines", 4), free_port()),
        one_process(arguments(one, tmp_path / "single", 8)),
    ]
    machine0, _, single = finish(runs)
    assert "2 process(es), batch 8, 4 updates" in machine0
    assert "1 process(es), batch 8, 4 updates" in single
    assert_same_weights(
        tmp_path / "machines" / "model" / "model.safetensors", tmp_path / "single" / "model" / "model.safetensors"
    )


@pytest.mark.parametrize("config, kind", [("fsdp2.yaml", "FSDP"), ("deepspeed_zero2.yaml", "DEEPSPEED")])
def test_sharded_configs_load_in_accelerate_and_wrap_encoder_blocks(config, kind):
    from accelerate.commands.config.config_args import load_config_from_file
    from utils import tiny_config

    from hubvit import HubViTForImageClassification

    loaded = load_config_from_file(str(ROOT / "configs" / "accelerate" / config))
    assert loaded.distributed_type.value == kind
    if kind == "FSDP":
        wrap = loaded.fsdp_config["fsdp_transformer_layer_cls_to_wrap"]
        assert loaded.fsdp_config["fsdp_version"] == 2
        assert loaded.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        model = HubViTForImageClassification(tiny_config(num_labels=3))
        blocks = [m for m in model.modules() if type(m).__name__ == wrap]
        assert len(blocks) == model.config.num_hidden_layers and wrap in model._no_split_modules
    else:
        assert loaded.deepspeed_config["zero_stage"] == 2


TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.heavy
@pytest.mark.skipif(not TWO_GPUS, reason="FSDP2 and DeepSpeed ZeRO-2 run on GPUs only (Accelerate 1.16)")
@pytest.mark.parametrize("config", ["fsdp2.yaml", "deepspeed_zero2.yaml"])
def test_two_loopback_gpu_machines_with_sharded_configs(data, tmp_path, config):
    """Sharded reductions sum in another order than one GPU: 1e-3 of the weights' scale after 4 updates."""
    if config.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    two, one = data
    runs = [
        *launch_machines(
            arguments(two, tmp_path / "machines", 4), free_port(), config=ROOT / "configs" / "accelerate" / config
        ),
        one_process(arguments(one, tmp_path / "single", 8), gpu=True),
    ]
    finish(runs)
    saved, expected = (load_file(tmp_path / run / "model" / "model.safetensors") for run in ("machines", "single"))
    assert saved.keys() == expected.keys()
    for key in expected:
        scale = expected[key].abs().max().item() or 1.0
        torch.testing.assert_close(saved[key].float(), expected[key].float(), rtol=0, atol=1e-3 * scale, msg=key)
