"""Checkpoints through Accelerate: `save_state`/`load_state` with its automatic naming and rotation.

Accelerate writes `OUTPUT_DIR/checkpoints/checkpoint_<N>` (N = the update count here) and, with
`ProjectConfiguration(total_limit=K)`, deletes the oldest before writing the next. It writes in place, so a run
killed during a save leaves a partial folder: `trainer_state.json` is therefore written last, atomically, and only a
folder holding it counts as a checkpoint. Partial folders are never resumed and are removed before the next save.
With K = 1 Accelerate deletes the only checkpoint before writing its successor; K >= 2 keeps one complete
checkpoint through a kill at any moment.

The streaming loader's position and the model EMA are written here, not registered with Accelerate: Accelerate
pickles registered objects and unpickles them on load with `torch.load`'s weights-only guard off, which runs
whatever a checkpoint file holds. Each process's loader position is JSON (`data_loader_state_<rank>.json`), the
EMA is safetensors (`model_ema.safetensors`), both written before the trainer state.
"""

import json
import os
import re
import shutil
from pathlib import Path

from ..errors import UsageError
from .checks import writing_checkpoint

CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")
STATE_FILE = "trainer_state.json"
LOADER_STATE = "data_loader_state_{}.json"
EMA_WEIGHTS = "model_ema.safetensors"


def project_configuration(args):
    """Accelerate's project layout for a run: checkpoints under OUTPUT_DIR/checkpoints, trackers under logs/."""
    from accelerate.utils import ProjectConfiguration

    return ProjectConfiguration(
        project_dir=str(args.output_dir),
        logging_dir=str(Path(args.output_dir) / "logs"),
        automatic_checkpoint_naming=True,
        total_limit=args.checkpoints_total_limit,
    )


def checkpoint_folders(root):
    """Every `checkpoint_<N>` folder under `root`, complete or not, as (N, path) oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_NAME.match(p.name)) and p.is_dir())


def list_checkpoints(root):
    """Complete checkpoints under `root` (those with their trainer state), oldest first."""
    return [p for _, p in checkpoint_folders(root) if (p / STATE_FILE).is_file()]


def check_earlier_checkpoints(output_dir, overwrite, resume):
    """A run started without `--resume_from_checkpoint` into a folder holding an interrupted run's checkpoints would
    start from step 0 and write over them."""
    found = list_checkpoints(Path(output_dir) / "checkpoints")
    if found and not (overwrite or resume):
        names = ", ".join(p.name for p in found[-3:])
        raise UsageError(
            f"{Path(output_dir) / 'checkpoints'} holds {len(found)} checkpoint(s) of an earlier run ({names}); pass "
            "--resume_from_checkpoint latest to continue it or --overwrite_output_dir to start again (deleting them)"
        )


def discard_checkpoints(accelerator, output_dir):
    """Remove an earlier run's checkpoints (`--overwrite_output_dir` without resuming): left there, `latest` could
    later resume the earlier run, and Accelerate's rotation would count them against `--checkpoints_total_limit`."""
    root = Path(output_dir) / "checkpoints"
    if accelerator.is_main_process:
        for _, path in checkpoint_folders(root):
            shutil.rmtree(path)
    accelerator.wait_for_everyone()


def save_checkpoint(accelerator, state, loader=None, ema=None):
    """`accelerator.save_state()` as `checkpoint_<global_step>`, the streaming `loader`'s position and the `ema`
    weights when given, then the trainer state that marks it complete."""
    root = Path(accelerator.project_dir) / "checkpoints"
    final = root / f"checkpoint_{state['global_step']}"
    if accelerator.is_main_process:
        for _, path in checkpoint_folders(root):
            if path == final or not (path / STATE_FILE).is_file():
                shutil.rmtree(path)
    accelerator.wait_for_everyone()
    accelerator.project_configuration.iteration = state["global_step"]
    with writing_checkpoint(final):
        accelerator.save_state()
        save_extra_state(accelerator, final, loader, ema)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            staging = final / f".{STATE_FILE}.tmp"
            staging.write_text(json.dumps(state, indent=2))
            os.replace(staging, final / STATE_FILE)
    accelerator.wait_for_everyone()
    return final


def save_extra_state(accelerator, folder, loader=None, ema=None):
    """This process's loader position as JSON; the EMA (the same on every process) as safetensors, once."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if loader is not None:
        (folder / LOADER_STATE.format(accelerator.process_index)).write_text(json.dumps(loader.state_dict()))
    if ema is not None and accelerator.is_main_process:
        save_file({k: v.detach().cpu().clone() for k, v in ema.state_dict().items()}, folder / EMA_WEIGHTS)


def load_extra_state(accelerator, folder, loader=None, ema=None):
    """What `save_extra_state` wrote, read without unpickling anything; UsageError naming a missing or bad file."""
    from safetensors.torch import load_file

    if loader is not None:
        written = len(list(folder.glob(LOADER_STATE.format("*"))))
        file = folder / LOADER_STATE.format(accelerator.process_index)
        if written != accelerator.num_processes or not file.is_file():
            raise UsageError(
                f"--resume_from_checkpoint {folder}: it holds the data-loader positions of {written} "
                f"streaming process(es); expected {accelerator.num_processes} (resume a --streaming run "
                "with the number of processes that wrote it)"
            )
        try:
            loader.load_state_dict(json.loads(file.read_text()))
        except DAMAGED_CHECKPOINT_ERRORS as error:
            raise UsageError(f"--resume_from_checkpoint: {file} is not a data-loader position ({error!r})") from None
    if ema is not None:
        file = folder / EMA_WEIGHTS
        if not file.is_file():
            raise UsageError(
                f"--resume_from_checkpoint: {file} is missing; the checkpoint was written without "
                "--ema_decay, so the average cannot continue"
            )
        try:
            ema.load_state_dict(load_file(file))
        except DAMAGED_CHECKPOINT_ERRORS as error:
            raise UsageError(
                f"--resume_from_checkpoint: {file} does not hold this model's EMA "
                f"({type(error).__name__}: {' '.join(str(error).split())[:300]})"
            ) from None


def resolve_checkpoint(value, output_dir):
    if value == "latest":
        found = list_checkpoints(Path(output_dir) / "checkpoints")
        if not found:
            raise UsageError(
                f"--resume_from_checkpoint latest: no complete checkpoint in {Path(output_dir) / 'checkpoints'}"
            )
        return found[-1]
    path = Path(value)
    if not (path / STATE_FILE).is_file():
        raise UsageError(f"--resume_from_checkpoint {value!r} is not a complete checkpoint folder (no {STATE_FILE})")
    return path


def _damaged_checkpoint_errors():
    import pickle
    import struct
    import zipfile

    from safetensors import SafetensorError

    return (
        OSError,
        EOFError,
        ValueError,
        RuntimeError,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
        pickle.UnpicklingError,
        struct.error,
        zipfile.BadZipFile,
        SafetensorError,
    )


# What safetensors, torch's weights-only unpickler and Accelerate raise on a truncated, garbage or refused file.
DAMAGED_CHECKPOINT_ERRORS = _damaged_checkpoint_errors()


RECORDED_OPTIONS = ("max_num_patches",)
"""Options a checkpoint records: a run resumed with another value would train another model on the same weights."""


def recorded_options(args):
    return {name: getattr(args, name, None) for name in RECORDED_OPTIONS}


def check_recorded_options(path, args):
    """Refuse a resume whose recorded options (`RECORDED_OPTIONS`) differ from this run's, naming both values;
    a checkpoint written before they were recorded is not checked."""
    try:
        state = json.loads((Path(path) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return  # read_trainer_state names the problem
    for name, value in recorded_options(args).items():
        if isinstance(state, dict) and name in state and state[name] != value:
            was = "without it" if state[name] is None else f"with --{name} {state[name]}"
            now = "none" if value is None else str(value)
            raise UsageError(
                f"--resume_from_checkpoint {path} was trained {was}; this run has --{name} {now}: resume with the "
                "checkpoint's value, or start a new run"
            )


def read_trainer_state(path):
    """(global_step, epoch, batches_in_epoch) of a checkpoint, or UsageError naming what is wrong."""
    file = Path(path) / STATE_FILE
    try:
        state = json.loads(file.read_text())
        values = tuple(state[key] for key in ("global_step", "epoch", "batches_in_epoch"))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UsageError(f"--resume_from_checkpoint: {file} is not a valid trainer state ({error!r})") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise UsageError(f"--resume_from_checkpoint: {file} holds {values}; expected three counts >= 0")
    return values


def check_random_states(path, process_index):
    """Read the RNG file the way Accelerate does; Accelerate itself only logs a failure, and the resumed run would
    then not replay the same dropout and stochastic depth."""
    from accelerate.utils import load
    from accelerate.utils.constants import RNG_STATE_NAME

    file = Path(path) / f"{RNG_STATE_NAME}_{process_index}.pkl"
    if not file.is_file():
        raise UsageError(f"--resume_from_checkpoint: {file} is missing, so the run could not resume exactly")
    try:
        states = load(str(file))
        missing = [k for k in ("random_state", "numpy_random_seed", "torch_manual_seed") if k not in states]
    except DAMAGED_CHECKPOINT_ERRORS as error:
        raise UsageError(
            f"--resume_from_checkpoint: {file} cannot be read ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[-1] if str(error).strip() else ''})"
        ) from None
    if missing:
        raise UsageError(f"--resume_from_checkpoint: {file} lacks {missing}, so the run could not resume exactly")


def load_checkpoint(accelerator, path, loader=None, ema=None):
    """`accelerator.load_state(path)` after checking what Accelerate would skip silently, then the streaming
    `loader`'s position and the `ema` weights when given; returns the trainer state."""
    state = read_trainer_state(path)
    check_random_states(path, accelerator.process_index)
    try:
        accelerator.load_state(str(path))
    except DAMAGED_CHECKPOINT_ERRORS as error:
        raise UsageError(
            f"--resume_from_checkpoint {path} cannot be loaded ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''})"
        ) from None
    load_extra_state(accelerator, Path(path), loader, ema)
    return state
