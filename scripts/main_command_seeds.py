"""Run the README's main command once per seed and record its accuracy and wall time.

    python scripts/main_command_seeds.py --seeds 5 --json docs/analysis/main_command_seeds.json

Each run is `accelerate launch scripts/finetune.py --output_dir DIR --seed S` exactly as a user types it (plus the
seed), timed from launch to exit, so the wall time includes the launcher, data loading and the analysis pictures.
Runs go one after another: side by side they would share the machine's cores and the times would mean nothing;
each run records the load average before and after it. The accuracy does not depend on the load (the run is seeded
and `accelerate launch` fixes the thread count), so seeds may also run in several sittings (`--first_seed`,
`--merge`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_seed(seed: int, output_dir: Path, flags: tuple[str, ...] = ()) -> dict:
    """One launch of the main command with `--seed seed` (and `flags`): its all_results.json plus the wall time."""
    command = ["accelerate", "launch", str(ROOT / "scripts" / "finetune.py"), "--output_dir", str(output_dir)]
    command += ["--seed", str(seed), *flags]
    load_before, started = os.getloadavg()[0], time.time()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.time() - started
    results = json.loads((output_dir / "all_results.json").read_text())
    load = {"load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2)}
    return {"seed": seed, "wall_time_s": round(wall, 1), **load, **results}


def summarise(runs: list[dict], metric: str = "eval_accuracy") -> dict:
    accuracies = [run[metric] for run in runs]
    walls = [run["wall_time_s"] for run in runs]
    return {
        "seeds": len(runs),
        "mean_accuracy": statistics.mean(accuracies),
        "std_accuracy": statistics.stdev(accuracies) if len(runs) > 1 else 0.0,
        "min_accuracy": min(accuracies),
        "max_accuracy": max(accuracies),
        "median_wall_time_s": statistics.median(walls),
    }


def markdown(record: dict, markdown_table) -> str:
    """The record as the README and docs/fine-tuning.md show it (`scripts/render_docs.py` renders it)."""
    rows = [
        (
            run["seed"],
            f"{run['eval_accuracy']:.4f} ({round(run['eval_accuracy'] * run['eval_samples'])} of {run['eval_samples']})",
            f"{run['wall_time_s'] / 60:.1f} min (load {run['load_average_before']:.1f} before, "
            f"{run['load_average_after']:.1f} after)",
        )
        for run in record["runs"]
    ]
    s, env = record["summary"], record["environment"]
    rows.append(
        (
            f"**{s['seeds']} seeds**",
            f"**{s['mean_accuracy']:.4f} +- {s['std_accuracy']:.4f}** (sd; {s['min_accuracy']:.4f}-{s['max_accuracy']:.4f})",
            f"median {s['median_wall_time_s'] / 60:.1f} min",
        )
    )
    note = (
        f"{env['cpu_count']} cores, CPU ISA {env['cpu_isa']}, torch {env['torch']}; wall time from launch to exit, "
        "launcher and analysis pictures included; the load average counts the runs themselves (a training process and "
        "its data-loader worker, about 2), so a figure well above 2 means something else shared the machine."
    )
    return markdown_table(["seed", "held-out accuracy", "wall time"], rows) + "\n\n" + note


def environment() -> dict:
    import torch

    from hubvit.cpu import cpu_isa

    return {
        "cpu_isa": cpu_isa(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_at_end": list(os.getloadavg()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first_seed", type=int, default=0)
    parser.add_argument("--json", type=Path, required=True, help="where to write (or, with --merge, add to) runs")
    parser.add_argument("--merge", action="store_true", help="keep the runs already in --json, add these")
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's folder under this directory")
    options = parser.parse_args(argv)
    runs = json.loads(options.json.read_text())["runs"] if options.merge and options.json.is_file() else []
    with tempfile.TemporaryDirectory() as scratch:
        base = options.keep or Path(scratch)
        for seed in range(options.first_seed, options.first_seed + options.seeds):
            run = run_seed(seed, base / f"seed{seed}")
            print(f"seed {seed}: accuracy {run['eval_accuracy']:.4f}, {run['wall_time_s']:.0f} s", flush=True)
            runs = [r for r in runs if r["seed"] != seed] + [run]
    runs.sort(key=lambda r: r["seed"])
    report = {
        "command": "accelerate launch scripts/finetune.py --output_dir OUT --seed S",
        "environment": environment(),
        "summary": summarise(runs),
        "runs": runs,
    }
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(report, indent=1) + "\n")
    s = report["summary"]
    print(
        f"{s['seeds']} seeds: accuracy {s['mean_accuracy']:.4f} +- {s['std_accuracy']:.4f} (sd), median wall {s['median_wall_time_s']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
