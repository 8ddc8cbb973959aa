"""Fine-tuning hubvit image classifiers with Accelerate over `datasets` (`hubvit train`, `hubvit.train`,
`scripts/finetune.py`).

arguments (the options as dataclass groups, parsed by `hubvit.options`), option_checks (their checks), data (splits and
seeded pipelines), model (the starting model and its optimizer), loop (`fit`, the one training loop), checkpoints
(Accelerate's `save_state`/`load_state` with rotation), evaluation (`evaluate` metrics), run (`train`, the whole
run); streaming (`--streaming`: shards per process, resumable), shards (writing them), ema (`--ema_decay`), recipes
(`--recipe`, random erasing, drop path), patch_sizes (`--patch_sizes`: a random patch size per update, FlexiViT).
"""

from .arguments import (
    Arguments,
    DataArguments,
    ModelArguments,
    OutputArguments,
    TrainingArguments,
    UsageError,
    parse_args,
    parser,
    resolve_defaults,
)
from .data import embedded_digits, make_transforms
from .loop import fit, make_accelerator
from .model import load_model, load_pretrained
from .run import TrainingResult, train

__all__ = [
    "Arguments",
    "DataArguments",
    "ModelArguments",
    "OutputArguments",
    "TrainingArguments",
    "UsageError",
    "TrainingResult",
    "train",
    "fit",
    "make_accelerator",
    "load_model",
    "load_pretrained",
    "embedded_digits",
    "make_transforms",
    "parse_args",
    "parser",
    "resolve_defaults",
]
