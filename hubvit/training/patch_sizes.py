"""Fine-tuning with a random patch size per update (FlexiViT, Beyer et al., CVPR 2023): `--patch_sizes 4,7,14`.

The model keeps one stored kernel (at its config's patch size; FlexiViT keeps the largest) and one position table;
each update draws a patch size, and the forward pass PI-resizes the kernel and resizes the table to that grid on the
fly (`HubViTModel.forward(patch_size=...)`), so gradients flow into the stored parameters and the trained model
serves every listed size. The draw depends on (seed, update) only: every process of a distributed run and a resumed
run draw the same sizes.
"""

import json
import random
from pathlib import Path

from ..errors import UsageError
from ..folder import ACCURACY_FILE


class PatchSizeError(UsageError):
    """A --patch_sizes value that no model can use."""


def parse_patch_sizes(value):
    """`'4,7,14'` (or a list of ints) as [4, 7, 14]: positive ints, no repeats; None stays None."""
    if value is None:
        return None
    parts = value if isinstance(value, (list, tuple)) else [part.strip() for part in str(value).split(",")]
    sizes = []
    for part in parts:
        if (
            isinstance(part, bool)
            or not (isinstance(part, int) or (isinstance(part, str) and part.isdecimal()))
            or int(part) <= 0
        ):
            raise PatchSizeError(f"--patch_sizes {value!r}: expected comma-separated positive ints, e.g. 4,7,14")
        sizes.append(int(part))
    if len(set(sizes)) != len(sizes):
        raise PatchSizeError(f"--patch_sizes {value!r} repeats a size")
    return sizes


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


def write_accuracy(folder, results, eval_split, command):
    """`patch_size_accuracy.json` beside the weights, which `hubvit info --patch-sizes` reads; None without
    per-size results."""
    measured = results.get("patch_sizes")
    if not measured or folder is None:
        return None
    record = {
        "accuracy": {size: metrics["eval_accuracy"] for size, metrics in measured.items()},
        "eval_samples": next(iter(measured.values()))["eval_samples"],
        "split": eval_split,
        "command": command,
        "note": "measured after training with a random patch size per update (FlexiViT) by hubvit's training "
        "package (`--patch_sizes`)",
    }
    path = Path(folder) / ACCURACY_FILE
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
