"""What each element of the fine-tuning recipe does to the main command's accuracy on the embedded digits.

    python scripts/recipe_elements.py --seeds 5 --json docs/analysis/recipe_elements.json [--arms base,ema] [--jobs 2]

Every arm is the main command (`accelerate launch scripts/finetune.py --output_dir DIR --seed S`) with the former
default recipe pinned (20 epochs, affine augmentation, label smoothing 0.1, nothing else) and one element added, so
each row changes one thing. Arms run the same seeds; the table reports each arm's mean and spread and its paired
difference from `base` (same seed, so the same split, initialisation and batch order) with a 95% t interval.
`--jobs 2` runs two launches side by side: accuracies do not depend on it (seeded; `accelerate launch` fixes the
thread count), the wall times then count the neighbour too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from main_command_seeds import environment, run_seed  # noqa: E402
from main_command_seeds import summarise as summarise_seeds  # noqa: E402

BASE = ("--num_train_epochs", "20", "--randaugment", "0", "--drop_path_rate", "0", "--label_smoothing", "0.1")

# name -> (what changes, the flags added to BASE; a later flag overrides BASE's).
ARMS = {
    "base": ("none: 20 epochs, affine augmentation, label smoothing 0.1", ()),
    "epochs40": ("40 epochs instead of 20", ("--num_train_epochs", "40")),
    "ema": ("model EMA, decay 0.998 (the average evaluated)", ("--ema_decay", "0.998")),
    "drop_path": ("drop path 0.1", ("--drop_path_rate", "0.1")),
    "randaugment": ("RandAugment, 2 ops, magnitude 9", ("--randaugment", "2")),
    "mixup": ("mixup, alpha 0.2", ("--mixup_alpha", "0.2")),
    "random_erasing": ("random erasing, probability 0.25", ("--random_erasing", "0.25")),
    "no_smoothing": ("label smoothing 0 instead of 0.1", ("--label_smoothing", "0")),
    "weight_decay": ("weight decay 0.01 instead of 0.05", ("--weight_decay", "0.01")),
}

# The accuracy an arm is judged by: EMA does not change the trained weights (they equal base's), its average does.
METRIC = {"ema": "ema_eval_accuracy"}

# Two-sided 97.5% quantiles of Student's t for n - 1 degrees of freedom (scipy is not a dependency of the scripts).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def paired_difference(arm: list[dict], base: list[dict], metric: str = "eval_accuracy") -> dict | None:
    """Mean of (arm - base) accuracy over the seeds both ran, with its 95% t interval."""
    by_seed = {run["seed"]: run["eval_accuracy"] for run in base}
    differences = [run[metric] - by_seed[run["seed"]] for run in arm if run["seed"] in by_seed]
    if len(differences) < 2:
        return None
    mean = statistics.mean(differences)
    half = T975[len(differences) - 1] * statistics.stdev(differences) / len(differences) ** 0.5
    return {"seeds": len(differences), "mean": mean, "low": mean - half, "high": mean + half}


def summarise(runs: list[dict], metric: str = "eval_accuracy") -> dict:
    """`main_command_seeds.summarise` of `metric`, with the metric's name and its per-seed values."""
    return {"metric": metric, "accuracies": [run[metric] for run in runs], **summarise_seeds(runs, metric)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--jobs", type=int, default=1, help="launches side by side")
    parser.add_argument("--json", type=Path, required=True, help="where to write; runs already there are kept")
    parser.add_argument("--summarise", action="store_true", help="recompute the summaries of --json, run nothing")
    options = parser.parse_args(argv)
    arms = [name.strip() for name in options.arms.split(",") if name.strip()]
    unknown = [name for name in arms if name not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; expected some of {', '.join(ARMS)}")
    report = json.loads(options.json.read_text()) if options.json.is_file() else {"arms": {}}
    jobs = [] if options.summarise else [(arm, seed) for seed in range(options.seeds) for arm in arms]
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(options.jobs) as pool:

        def launch(job):
            arm, seed = job
            flags = BASE + ARMS[arm][1]
            return arm, run_seed(seed, Path(scratch) / f"{arm}-{seed}", flags) | {"flags": list(flags)}

        for arm, run in pool.map(launch, jobs):
            print(
                f"{arm} seed {run['seed']}: accuracy {run['eval_accuracy']:.4f}, {run['wall_time_s']:.0f} s", flush=True
            )
            entry = report["arms"].setdefault(arm, {"change": ARMS[arm][0], "runs": []})
            entry["runs"] = sorted(
                [r for r in entry["runs"] if r["seed"] != run["seed"]] + [run], key=lambda r: r["seed"]
            )
            report["environment"] = environment()
            report["jobs"] = options.jobs
            write(report, options.json)
    write(report, options.json)
    return 0


def write(report: dict, path: Path) -> None:
    """`report` with every arm's summary and paired difference recomputed, to `path`."""
    base = report["arms"].get("base")
    for name, arm in report["arms"].items():
        arm["change"] = ARMS[name][0] if name in ARMS else arm["change"]
        metric = METRIC.get(name, "eval_accuracy")
        arm["summary"] = summarise(arm["runs"], metric)
        arm["vs_base"] = paired_difference(arm["runs"], base["runs"], metric) if base else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
