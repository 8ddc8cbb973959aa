"""Fine-tuning with a random patch size per batch (FlexiViT, Beyer et al., 2023): `--patch_sizes 4,7,14`.

The model keeps one stored kernel (at its config's patch size; FlexiViT keeps the largest) and one position table;
each update draws a patch size, and the forward pass PI-resizes the kernel and resizes the table to that grid on the
fly (`HubViTModel.forward(patch_size=...)`), so gradients flow into the stored parameters and the trained model
serves every listed size. The draw depends on (seed, update) only: every process of a distributed run and a resumed
run draw the same sizes.
"""

import argparse
import json
import random
from pathlib import Path

from hubvit.analysis.info import PATCH_ACCURACY_FILE as ACCURACY_FILE

from hubvit.errors import HubViTError


class PatchSizeError(HubViTError):
    """A --patch_sizes value that no model can use."""


def parse_patch_sizes(text):
    """`4,7,14` as [4, 7, 14] (argparse type): positive ints, no repeats."""
    parts = [part.strip() for part in str(text).split(",")]
    if not parts or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise PatchSizeError(f"--patch_sizes {text!r}: expected comma-separated positive ints, e.g. 4,7,14")
    sizes = [int(part) for part in parts]
    if len(set(sizes)) != len(sizes):
        raise PatchSizeError(f"--patch_sizes {text!r} repeats a size")
    return sizes


def patch_sizes_argument(text):
    """`parse_patch_sizes` for argparse, which prints the message of an `ArgumentTypeError` as it is."""
    try:
        return parse_patch_sizes(text)
    except PatchSizeError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def check_patch_sizes(patch_sizes, config):
    """Every size must cut the model's training resolution into whole patches."""
    height, width = config.image_size_2d
    for size in patch_sizes:
        if height % size or width % size:
            raise PatchSizeError(f"--patch_sizes: {size} does not divide the image size {height}x{width}")


def sampler(patch_sizes, config, seed):
    """`draw(update)`: the forward keywords of that update ({} without --patch_sizes), the same on every process."""
    if not patch_sizes:
        return lambda update: {}
    check_patch_sizes(patch_sizes, config)
    return lambda update: {"patch_size": random.Random(seed * 1_000_003 + update).choice(patch_sizes)}


class AtPatchSize:
    """A model called at one patch size, for code that calls `model(pixel_values=...)` (the evaluation loop)."""

    def __init__(self, model, patch_size):
        self.model, self.patch_size = model, patch_size

    def __call__(self, **inputs):
        return self.model(**inputs, patch_size=self.patch_size)

    def eval(self):
        self.model.eval()
        return self

    def train(self, mode=True):
        self.model.train(mode)
        return self


def evaluate_each(evaluate, accelerator, model, loader, patch_sizes):
    """{patch size: the evaluation loop's metrics at that size}; {} without --patch_sizes or an eval split."""
    if not patch_sizes or loader is None:
        return {}
    return {str(size): evaluate(accelerator, AtPatchSize(model, size), loader) for size in patch_sizes}


def write_accuracy(folder, results, eval_split, command):
    """`patch_size_accuracy.json` beside the weights, which `hubvit info --patch-sizes` reads."""
    measured = results.get("patch_sizes")
    if not measured or folder is None:
        return None
    record = {
        "accuracy": {size: metrics["eval_accuracy"] for size, metrics in measured.items()},
        "eval_samples": next(iter(measured.values()))["eval_samples"],
        "split": eval_split,
        "command": command,
        "note": "measured after training with a random patch size per batch (FlexiViT) by scripts/finetune.py",
    }
    path = Path(folder) / ACCURACY_FILE
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
