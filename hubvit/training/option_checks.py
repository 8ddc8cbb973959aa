"""The checks of a run's options, before anything is loaded: types and choices (what argparse checks on a command
line, checked for Python callers too), ranges, options that contradict each other, the output folder, and the
`UsageError` they raise. The options themselves are the dataclasses of arguments.py; checks of the inputs the
options name (folders, images, models) are in checks.py.
"""

import dataclasses
import math
import typing
from pathlib import Path
from typing import Literal

from ..errors import UsageError
from ..modeling.fields_hubvit import matches

from . import checks
from .checkpoints import check_earlier_checkpoints


def expected_type(options, name):
    """(python types, words) the annotation of option `name` of the dataclass `options` allows, None excluded."""
    annotation = typing.get_type_hints(options)[name]
    allowed, choices = [], None
    parts = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else (annotation,)
    for part in parts:
        if typing.get_origin(part) is Literal:
            choices = typing.get_args(part)
        elif part is not type(None):
            allowed.append(part)
    return allowed, choices


def check_types(args):
    """What argparse checks on a command line, checked for Python callers too: types, choices, required values."""
    if isinstance(args.patch_sizes, (list, tuple)):  # Python callers may pass the sizes themselves
        from .patch_sizes import parse_patch_sizes

        args.patch_sizes = ",".join(map(str, parse_patch_sizes(args.patch_sizes)))
    if args.output_dir is None:
        raise UsageError("output_dir is required: the folder that gets model/, all_results.json and checkpoints/")
    if isinstance(args.output_dir, str) and not args.output_dir.strip():
        raise UsageError(f"--output_dir {args.output_dir!r}: expected a folder to write (an unset shell variable?)")
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if value is None:
            continue
        allowed, choices = expected_type(type(args), f.name)
        if isinstance(value, Path) and str in allowed:
            value = str(value)
        if not matches(value, typing.get_type_hints(type(args))[f.name]):
            if choices is not None:
                raise UsageError(f"--{f.name} {value!r}: expected one of {', '.join(map(str, choices))}")
            words = " or ".join(t.__name__ for t in allowed)
            raise UsageError(f"--{f.name} {value!r}: expected {words}, got {type(value).__name__}")
        setattr(args, f.name, float(value) if float in allowed and type(value) is int else value)


def check_args(args):
    """Refuse inconsistent options before anything is loaded."""
    check_types(args)
    check_compile_backend(args.torch_compile)
    if args.validation_dir and not args.train_dir:
        raise UsageError("--validation_dir needs --train_dir")
    if args.dataset_name and args.train_dir:
        raise UsageError("pass either --dataset_name or --train_dir/--validation_dir, not both")
    if not 0.0 < args.train_val_split < 1.0:
        raise UsageError(f"--train_val_split must be in (0, 1), got {args.train_val_split}")
    if args.checkpointing_steps is not None and args.checkpointing_steps != "epoch":
        if not str(args.checkpointing_steps).isdecimal() or int(args.checkpointing_steps) <= 0:
            raise UsageError(
                f"--checkpointing_steps must be a positive int or 'epoch', got {args.checkpointing_steps!r}"
            )
    if args.checkpoints_total_limit is not None and args.checkpoints_total_limit < 1:
        raise UsageError(f"--checkpoints_total_limit must be >= 1, got {args.checkpoints_total_limit}")
    for name in ("gradient_accumulation_steps", "per_device_train_batch_size", "per_device_eval_batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.streaming and not args.dataset_name:
        raise UsageError(
            "--streaming needs --dataset_name (a folder of parquet or webdataset shards, or a `datasets` "
            "source); --train_dir and the embedded digits are loaded, not streamed"
        )
    if args.streaming and args.max_train_samples:
        raise UsageError(f"--max_train_samples {args.max_train_samples} cannot cut a stream; write fewer shards")
    if args.model_name_or_path and args.config_overrides:
        raise UsageError("--config_overrides applies to training from scratch, not to --model_name_or_path")
    check_trackers(args.report_to)
    out = Path(args.output_dir)
    checks.check_model_folder(out, args.model_name_or_path)
    if args.train_dir:
        checks.check_image_folders(args.train_dir, args.validation_dir)
    if (out / "model").exists() and not (args.overwrite_output_dir or args.resume_from_checkpoint):
        raise UsageError(
            f"{out / 'model'} exists; pass --overwrite_output_dir to replace it or "
            "--resume_from_checkpoint to continue the run"
        )
    check_earlier_checkpoints(out, args.overwrite_output_dir, args.resume_from_checkpoint)
    check_values(args)
    if args.patch_sizes is not None:
        from .patch_sizes import parse_patch_sizes

        parse_patch_sizes(args.patch_sizes)
    check_patch_budget(args)
    check_scheduler(args.lr_scheduler_type)
    check_output_dir(out)


def check_patch_budget(args):
    """`--max_num_patches` takes whole images at their own sizes: nothing that mixes or re-cuts a batch of squares."""
    if args.max_num_patches is None:
        if args.naflex_batching is not None:
            raise UsageError(
                f"--naflex_batching {args.naflex_batching} orders NaFlex batches; it needs --max_num_patches"
            )
        return
    if args.naflex_batching == "patch_count" and args.streaming:
        raise UsageError(
            "--naflex_batching patch_count groups a map-style dataset by its images' sizes; --streaming reads its "
            "stream in the buffer's order (--naflex_batching random)"
        )
    if args.max_num_patches < 1:
        raise UsageError(f"--max_num_patches must be >= 1, got {args.max_num_patches}")
    others = {
        "--patch_sizes": args.patch_sizes,
        "--mixup_alpha": args.mixup_alpha or None,
        "--cutmix_alpha": args.cutmix_alpha or None,
    }
    named = [f"{flag} {value}" for flag, value in others.items() if value is not None]
    if named:
        raise UsageError(
            f"--max_num_patches {args.max_num_patches} trains on patch sequences of each image at its own size; it "
            f"does not combine with {', '.join(named)} (a batch of squares)"
        )


def check_trackers(report_to):
    if report_to in ("tensorboard", "all"):
        from accelerate.utils import is_tensorboard_available

        if not is_tensorboard_available():
            raise UsageError("--report_to tensorboard needs `pip install tensorboard`")
    if report_to in ("trackio", "all"):
        from accelerate.utils import is_trackio_available

        if not is_trackio_available():
            raise UsageError("--report_to trackio needs `pip install trackio`")


FINITE_RANGES = {
    "learning_rate": (lambda v: v >= 0, ">= 0"),
    "momentum": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "weight_decay": (lambda v: v >= 0, ">= 0"),
    "layer_decay": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "warmup_ratio": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "label_smoothing": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "max_grad_norm": (lambda v: v >= 0, ">= 0 (0 disables clipping)"),
    "mixup_alpha": (lambda v: v >= 0, ">= 0"),
    "cutmix_alpha": (lambda v: v >= 0, ">= 0"),
    "random_erasing": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "ema_decay": (lambda v: 0 < v < 1, "in (0, 1)"),
    "drop_path_rate": (lambda v: 0 <= v < 1, "in [0, 1)"),
}

AT_LEAST = {
    "max_train_samples": 1,
    "max_eval_samples": 1,
    "max_train_steps": 1,
    "num_train_epochs": 1,
    "num_warmup_steps": 0,
    "logging_steps": 1,
    "randaugment": 0,
    "randaugment_magnitude": 0,
    "dataloader_num_workers": 0,
    "cpu_threads": 1,
    "image_size": 1,
    "shuffle_buffer": 0,
}


def check_compile_backend(backend):
    """A `--torch_compile` backend Accelerate knows (it fails later, inside `Accelerator`, with an enum error)."""
    if backend is None:
        return
    from accelerate.utils import DynamoBackend

    known = [member.name.lower() for member in DynamoBackend if member.name != "NO"]
    if str(backend).upper() not in DynamoBackend.__members__ or str(backend).upper() == "NO":
        raise UsageError(f"--torch_compile {backend!r}: expected a torch.compile backend, one of {', '.join(known)}")


def check_values(args):
    """Numbers the run would otherwise ignore, or train on silently (a NaN learning rate gives NaN weights)."""
    for name, low in AT_LEAST.items():
        value = getattr(args, name, None)
        if value is not None and value < low:
            raise UsageError(f"--{name} must be >= {low}, got {value}")
    for name, (inside, expected) in FINITE_RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and inside(value)):
            raise UsageError(f"--{name} must be a finite number {expected}, got {value}")


def check_scheduler(name):
    """Let transformers' own `get_scheduler` judge the name, on a throwaway optimizer (unknown names, or schedules
    that need arguments this package does not pass, fail here rather than after the data is loaded)."""
    import torch
    from transformers import SchedulerType, get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    try:
        get_scheduler(name, optimizer, num_warmup_steps=1, num_training_steps=10)
    except (ValueError, TypeError, KeyError) as error:
        raise UsageError(
            f"--lr_scheduler_type {name!r} cannot be used here ({str(error).splitlines()[0]}); "
            f"transformers' names: {', '.join(s.value for s in SchedulerType)}"
        ) from None


def check_output_dir(out):
    """OUTPUT_DIR must be a folder this process can write, checked before the first step (not after the run)."""
    import tempfile

    out = Path(out)
    for path in (out, out / "model", out / "checkpoints"):
        if path.exists() and not path.is_dir():
            raise UsageError(f"--output_dir: {path} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        raise UsageError(f"--output_dir {out} is not writable: {error.strerror or error}") from None
