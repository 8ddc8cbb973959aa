"""What each experiment's page is made of: the command that made it, where it ran, the header with its claim, and
the files (JSON, PNG, markdown) it is written to."""

import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from scripts.experiments.statistics import REQUIRED_SEEDS


def command(name, argv=None):
    """The command line that made these results, as a reader would retype it: the script's own, or the one
    `main(argv)` stands for when called from Python."""
    launched = "ACCELERATE_MIXED_PRECISION" in os.environ
    argv = sys.argv[1:] if argv is None else argv
    return ("accelerate launch " if launched else "python ") + shlex.join(
        [f"scripts/experiments/{name}.py", *map(str, argv)]
    )


def environment(started):
    from hubvit.cpu import cpu_isa, cpu_model

    return {
        "wall_time_s": round(time.time() - started, 1),
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def write(output_dir, name, results, figure, markdown):
    """`<name>.json`, `<name>.png` (the figure, closed after) and `<name>.md` in `output_dir`."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    figure.savefig(out / f"{name}.png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    (out / f"{name}.md").write_text(markdown.rstrip() + "\n")
    return out


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


SCHEDULE_NOTE = (
    "The main command's 20-epoch recipe of the time reached 96.7% on these digits (60 epochs since, see the "
    "README). Runs recorded before the plateau schedule (a few hundred updates, no validation split) stop short "
    "of that, and their verdicts describe that regime only; runs with a `validation_accuracy` per seed are "
    "trained to their validation plateau."
)


def pct(x):
    return f"{100 * x:.2f}"


def campaign_text(results):
    """For a page built from campaign runs: seeds per arm against the five required, minutes per run."""
    counts = results["seeds_per_arm"]
    seeds = ", ".join(f"{arm} {n} of {REQUIRED_SEEDS} seeds" for arm, n in counts.items())
    short = [arm for arm, n in counts.items() if n < REQUIRED_SEEDS]
    timing = results["environment"]["minutes_per_run"]
    return (
        f"**Built from {results['environment']['units']} campaign runs** (`docs/experiments/runs/{results['name']}/`, "
        "one JSON per arm and seed; `python scripts/experiments/campaign.py report` rebuilds this page). "
        f"Seeds so far: {seeds}"
        + (f"; verdicts stay *not yet decided* until every arm has {REQUIRED_SEEDS}" if short else "")
        + f". Minutes of training per run: median {timing['median']:.1f} ({timing['min']:.1f}-{timing['max']:.1f}, "
        f"{timing['runs']} runs, {', '.join(map(str, timing['torch_threads']))} torch thread(s) each).\n\n"
    )


def header(title, results, claim):
    """The top of every experiment's markdown: what was claimed, how it was measured, where, how long."""
    env = results["environment"]
    quick = (
        "\n**Quick run (`--quick`): a smoke test at toy size; its numbers say nothing about the claim.**\n"
        if results["quick"]
        else ""
    )
    return (
        f"# {title}\n{quick}\n**Claim.** {claim}\n\n**Command.** `{results['command']}`\n\n"
        + (campaign_text(results) if env.get("units") else "")
        + f"Measured on a shared 2-core CPU machine ({env['torch_threads']} torch thread(s), load average "
        f"{env['load_average_at_end'][0]} at the end, other jobs running): "
        + (
            f"{env['wall_time_s'] / 60:.0f} min of training in all"
            if env.get("units")
            else f"wall time {env['wall_time_s'] / 60:.1f} min"
        )
        + (
            f" ({env['parallel_parts']} processes side by side, one per seed, pooled with `--merge`)"
            if env.get("parallel_parts")
            else ""
        )
        + ". "
        f"Results: [`{results['name']}.json`]({results['name']}.json), figure "
        f"[`{results['name']}.png`]({results['name']}.png).\n\n![{results['name']}]({results['name']}.png)\n"
    )
