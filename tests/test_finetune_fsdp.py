"""scripts/finetune.py under Accelerate FSDP2 with transformer-layer wrapping (2 processes).

Measured with accelerate 1.16 / torch 2.14: Accelerate enables FSDP only for GPU-like device types (its
`AcceleratorState` sets `DistributedType.FSDP` for MULTI_GPU/XPU/NPU/HPU/..., never for MULTI_CPU). On CPU,
`accelerate launch --use_fsdp` gives DDP over gloo (with ACCELERATE_USE_CPU=1) or two unconnected processes
(without it), with no warning. The script therefore refuses FSDP that did not happen; the full FSDP run is expected
to fail until 2 GPUs are present, and is strict so that an Accelerate that adds CPU FSDP shows up as XPASS.
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from test_finetune import TINY_MODEL, free_port, results, run_script, saved_dataset

FSDP2 = (
    "--use_fsdp",
    "--fsdp_version",
    "2",
    "--fsdp_auto_wrap_policy",
    "TRANSFORMER_BASED_WRAP",
    "--fsdp_transformer_layer_cls_to_wrap",
    "HubViTLayer",
    "--fsdp_state_dict_type",
    "SHARDED_STATE_DICT",
    "--fsdp_sync_module_states",
    "false",
    "--fsdp_cpu_ram_efficient_loading",
    "false",
    "--fsdp_use_orig_params",
    "true",
)
TWO_GPUS = torch.cuda.device_count() >= 2


def launcher():
    return (
        "-m",
        "accelerate.commands.launch",
        *FSDP2,
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--main_process_port",
        str(free_port()),
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return saved_dataset(tmp_path_factory.mktemp("data") / "saved")


def arguments(data, out, *extra):
    return [
        "--dataset_name",
        str(data),
        "--image_column_name",
        "img",
        "--label_column_name",
        "target",
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "6",
        *TINY_MODEL,
        "--per_device_train_batch_size",
        "4",
        "--max_train_steps",
        "4",
        "--checkpointing_steps",
        "2",
        "--seed",
        "3",
        "--output_dir",
        str(out),
        *extra,
    ]


@pytest.mark.heavy
@pytest.mark.skipif(TWO_GPUS, reason="FSDP is available with 2 GPUs; the refusal is for CPU")
@pytest.mark.parametrize("use_cpu", ["1", "0"], ids=["ACCELERATE_USE_CPU=1", "default"])
def test_fsdp_on_cpu_is_refused_with_the_reason(data, tmp_path, use_cpu):
    run = run_script(
        arguments(data, tmp_path / "out"),
        launcher=launcher(),
        extra_env={"ACCELERATE_USE_CPU": use_cpu} if use_cpu == "1" else None,
    )
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("finetune.py: error:")]
    assert errors and "FSDP was requested but Accelerate set up" in errors[0], run.stderr[-3000:]
    assert ("MULTI_CPU" if use_cpu == "1" else "NO") in errors[0] and "not on CPU" in errors[0]
    assert not (tmp_path / "out" / "model").exists()


@pytest.mark.heavy
@pytest.mark.skipif(
    not TWO_GPUS,
    reason="Accelerate 1.16 runs FSDP only on GPU-like devices; on CPU this launch is the refusal test's [default] case",
)
def test_fsdp2_trains_checkpoints_and_resumes(data, tmp_path):
    whole = tmp_path / "whole"
    run = run_script(arguments(data, whole), launcher=launcher())
    assert run.returncode == 0, run.stderr[-3000:]
    assert results(whole)["num_processes"] == 2
    assert sorted(p.name for p in (whole / "checkpoints").iterdir()) == ["checkpoint_2", "checkpoint_4"]

    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(whole / "checkpoints" / "checkpoint_2", resumed / "checkpoints" / "checkpoint_2")
    run = run_script(arguments(data, resumed, "--resume_from_checkpoint", "latest"), launcher=launcher())
    assert run.returncode == 0, run.stderr[-3000:]
    assert "resumed from" in run.stderr
    expected, got = (load_file(out / "model" / "model.safetensors") for out in (whole, resumed))
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        # Same sharded updates replayed from the step-2 state; GPU reductions may reorder: 1e-5 of the weight scale.
        assert (got[name] - value).abs().max() <= 1e-5 * max(value.abs().max().item(), 1.0), name
