"""Starting a run into a folder an earlier run wrote: nothing is overwritten without a flag, and an empty
--output_dir (an unset shell variable) is refused rather than taken as the current folder."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hubvit.errors import HubViTError
from hubvit.training import train

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "image_size": 16,
    "config_overrides": "patch_size=4,hidden_size=32,num_hidden_layers=2,intermediate_size=64",
    "max_train_samples": 32,
    "max_eval_samples": 16,
    "per_device_train_batch_size": 8,
    "dataloader_num_workers": 0,  # in the test process, which must not fork (tests/conftest.py)
}


def interrupted_run(out):
    """OUT as a killed run leaves it: checkpoints, no model (a kill before the end never writes one)."""
    state = {"global_step": 2, "epoch": 0, "batches_in_epoch": 2}
    folder = out / "checkpoints" / "checkpoint_2"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps(state))
    return folder


def test_a_rerun_into_an_interrupted_runs_folder_is_refused_naming_both_ways_on(tmp_path):
    checkpoint = interrupted_run(tmp_path / "out")
    with pytest.raises(HubViTError) as caught:
        train(output_dir=str(tmp_path / "out"), **TINY)
    message = str(caught.value)
    assert "holds 1 checkpoint(s) of an earlier run (checkpoint_2)" in message
    assert "--resume_from_checkpoint latest" in message and "--overwrite_output_dir" in message
    assert sorted(p.name for p in checkpoint.iterdir()) == ["trainer_state.json"], "nothing touched"


def test_overwrite_output_dir_starts_again_without_the_earlier_checkpoints(tmp_path):
    """Left there, `latest` would later pick the earlier run's checkpoint_2 over this run's checkpoint_1."""
    interrupted_run(tmp_path / "out")
    train(
        output_dir=str(tmp_path / "out"), overwrite_output_dir=True, max_train_steps=1, checkpointing_steps="1", **TINY
    )
    assert [p.name for p in (tmp_path / "out" / "checkpoints").iterdir()] == ["checkpoint_1"]
    assert (tmp_path / "out" / "model" / "config.json").is_file()


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_output_dir_is_refused_and_nothing_is_written_here(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HubViTError, match=rf"--output_dir '{value}': expected a folder to write \(an unset shell"):
        train(output_dir=value, **TINY)
    assert not list(tmp_path.iterdir())


def test_the_command_line_refuses_an_empty_output_dir_with_status_2(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, str(ROOT / "scripts" / "finetune.py"), "--output_dir", ""]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == (
        "finetune.py: error: --output_dir '': expected a folder to write (an unset shell variable?)"
    )
    assert not list(tmp_path.iterdir())
