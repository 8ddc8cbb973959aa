"""The experiment campaign: every (experiment, arm, seed) unit the experiments need, run in pieces that each finish.

A working session ends after a few hours and ends every process with it, while five seeds of every arm take far
longer on this 2-core machine. So each unit runs alone and writes its own record,
`docs/experiments/runs/<experiment>/<arm>-seed<k>.json` (atomically: a temporary file, then a rename), which is
committed; `run` skips finished units and resumes an interrupted one from its last per-epoch checkpoint (under the
gitignored `runs/campaign/`); `report` rebuilds each experiment's page, and docs/experiments/README.md, from the
union of the finished records. See docs/experiments/campaign.md.

    nohup nice -n 10 .venv/bin/python scripts/experiments/campaign.py run --jobs 2 > /tmp/campaign.log 2>&1 &
    python scripts/experiments/campaign.py status
    python scripts/experiments/campaign.py report
"""

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.experiments import common  # noqa: E402

# The experiments that run as units, in the order their units are queued within a seed. position_embeddings comes
# first: its learned and sin-cos arms decide the campaign's first "done when".
EXPERIMENTS = [
    "position_embeddings",
    "attention_distance",
    "inductive_bias",
    "resolution",
    "patch_size",
    "native_resolution",
]
SEEDS = common.REQUIRED_SEEDS
RUNS = common.DOCS / "runs"
CHECKPOINTS = common.ROOT / "runs" / "campaign"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["run", "status", "report"])
    p.add_argument("--jobs", type=int, default=1, help="units run side by side, one process each (default 1)")
    p.add_argument("--threads", type=int, help="torch threads per process (default: the cores / --jobs)")
    p.add_argument("--seeds", type=int, default=SEEDS, help=f"seeds 0 .. N-1 of every arm (default {SEEDS})")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="EXPERIMENT[:ARM[:SEED]]",
        help="run only these units (e.g. position_embeddings:learned:0)",
    )
    p.add_argument("--max_units", type=int, help="stop after this many units (per process)")
    p.add_argument("--quick", action="store_true", help="tiny units at the experiments' --quick sizes (tests)")
    p.add_argument("--runs_dir", default=str(RUNS), help="where finished unit records go")
    p.add_argument("--checkpoints_dir", default=str(CHECKPOINTS), help="per-epoch state of unfinished units")
    p.add_argument("--output_dir", default=str(common.DOCS), help="where `report` writes the pages")
    return p.parse_args(argv)


def module(name):
    return importlib.import_module(f"scripts.experiments.{name}")


def queue(seeds=SEEDS, experiments=EXPERIMENTS):
    """Every unit, seed-major: all arms of every experiment at seed 0, then seed 1, ..., so that paired
    comparisons over the first seeds are available early."""
    return [(name, arm, seed) for seed in range(seeds) for name in experiments for arm in module(name).ARMS]


def selected(units, only):
    if not only:
        return units
    wanted = [tuple(item.split(":")) for item in only]
    return [u for u in units if any(tuple(map(str, u[: len(w)])) == w for w in wanted)]


def record_path(runs_dir, unit):
    name, arm, seed = unit
    return Path(runs_dir) / name / f"{arm}-seed{seed}.json"


def load_records(runs_dir, name):
    folder = Path(runs_dir) / name
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def process_start(pid):
    """The start time of process `pid` (clock ticks since boot), or None when there is no such process: a lock is
    held only while the process that wrote it runs, even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def claim(lock):
    """Take the lock file of a unit; a lock left by a process that has ended is taken over."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    mine = json.dumps({"pid": os.getpid(), "start": process_start(os.getpid())})
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                held = json.loads(lock.read_text())
            except (OSError, ValueError):
                return False
            if process_start(held["pid"]) == held["start"]:
                return False
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        return True
    return False


def lock_path(options, unit):
    name, arm, seed = unit
    return Path(options.checkpoints_dir) / "locks" / f"{name}-{arm}-seed{seed}.lock"


def unit_options(options, name):
    argv = ["--output_dir", options.output_dir, "--cpu_threads", str(options.threads)]
    unit = module(name).parse_args(argv + (["--quick"] if options.quick else []))
    if hasattr(unit, "models_dir"):
        unit.models_dir = str(Path(options.checkpoints_dir) / "models" / name)
    return unit


def run_one(options, unit, contexts):
    """Train one unit (resuming its checkpoint if any), write its record atomically, drop its checkpoints."""
    name, arm, seed = unit
    experiment = module(name)
    if name not in contexts:
        contexts[name] = experiment.Context(unit_options(options, name))
    context = contexts[name]
    folder = Path(options.checkpoints_dir) / name / f"{arm}-seed{seed}"
    started = time.time()
    record = experiment.run_unit(context.options, arm, seed, context, folder)
    record["unit_seconds"] = round(time.time() - started, 1)
    record["command"] = common.command("campaign", ["run", "--only", f"{name}:{arm}:{seed}"])
    common.write_json_atomically(record_path(options.runs_dir, unit), record)
    shutil.rmtree(folder, ignore_errors=True)
    return record


def work(options):
    """One process: take the first unit that is neither finished nor held by another process, run it, repeat."""
    common.setup_quietly(options.threads)
    contexts, done, failed = {}, 0, set()
    units = selected(queue(options.seeds), options.only)
    while options.max_units is None or done < options.max_units:
        for unit in units:
            if unit in failed or record_path(options.runs_dir, unit).is_file():
                continue
            lock = lock_path(options, unit)
            if not claim(lock):
                continue
            try:
                if record_path(options.runs_dir, unit).is_file():
                    continue
                print(f"[campaign {os.getpid()}] {unit[0]} {unit[1]} seed {unit[2]}", file=sys.stderr, flush=True)
                try:
                    record = run_one(options, unit, contexts)
                except Exception:  # one unit's error (say, a module mid-edit by someone) must not stop the rest
                    traceback.print_exc()
                    print(f"[campaign {os.getpid()}] FAILED {unit}; next unit", file=sys.stderr, flush=True)
                    failed.add(unit)
                    contexts.pop(unit[0], None)
                    break
                print(
                    f"[campaign {os.getpid()}] finished {unit[0]} {unit[1]} seed {unit[2]}: "
                    f"{record['minutes']:.1f} min of training",
                    file=sys.stderr,
                    flush=True,
                )
            finally:
                lock.unlink(missing_ok=True)
            done += 1
            break
        else:
            break
    return 1 if failed else 0


def run(options, argv):
    if options.jobs <= 1:
        return work(options)
    rest, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in ("--jobs", "--threads"):
            skip = True
        elif not item.startswith(("--jobs=", "--threads=")):
            rest.append(item)
    command = [sys.executable, str(Path(__file__).resolve()), *rest, "--jobs", "1", "--threads", str(options.threads)]
    workers = [subprocess.Popen(command) for _ in range(options.jobs)]
    return max(worker.wait() for worker in workers)


def progress(options, unit):
    """Where a started unit's fits are: `fit finished` or `fit at epoch k`, from its checkpoints."""

    name, arm, seed = unit
    parts = []
    for path in sorted((Path(options.checkpoints_dir) / name / f"{arm}-seed{seed}").glob("*.pt")):
        try:
            state = common.load_checkpoint(path)
        except Exception:  # being replaced this moment, or cut short: the next status will read it
            parts.append(f"{path.stem} unreadable now")
            continue
        parts.append(f"{path.stem} finished" if state.get("finished") else f"{path.stem} at epoch {state['epoch']}")
    return ", ".join(parts) or "no epoch finished yet"


def minutes_left(records, left):
    """Minutes the units `left` should take: each as long as its own arm's latest finished run (arms differ
    several-fold, e.g. relative_2d's attention runs, and the latest run was timed under the machine's load and the
    code as they are now); an arm with no finished run at the experiment's median."""
    overall = common.minutes_per_run(records)["median"]
    latest = {}
    for record in sorted(records, key=lambda r: r["seed"]):
        latest[record["arm"]] = record["minutes"]
    return sum(latest.get(arm, overall) for _, arm, _ in left)


def status(options):
    """Done / remaining per experiment, measured minutes per finished unit, and the estimate of what is left."""
    units = queue(options.seeds)
    lines, total_left, unknown = [], 0.0, []
    for name in EXPERIMENTS:
        mine = [u for u in units if u[0] == name]
        records = load_records(options.runs_dir, name)
        finished = {(r["arm"], r["seed"]) for r in records}
        left = [u for u in mine if (u[1], u[2]) not in finished]
        busy = [u for u in left if (Path(options.checkpoints_dir) / name / f"{u[1]}-seed{u[2]}").is_dir()]
        timing = common.minutes_per_run(records)
        if timing:
            estimate = minutes_left(records, left)
            total_left += estimate
            timing_text = (
                f"{timing['median']:.1f} min per run (median of {timing['runs']}, {timing['min']:.1f}-"
                f"{timing['max']:.1f}, torch threads {timing['torch_threads']}); about {estimate / 60:.1f} h left"
                " (each unit as its arm's latest run)"
            )
        else:
            timing_text = "no finished run yet: no estimate"
            if left:
                unknown.append(name)
        per_arm = ", ".join(f"{arm} {sum(1 for r in records if r['arm'] == arm)}" for arm in module(name).ARMS)
        started = [f"{u[1]} seed {u[2]}: {progress(options, u)}" for u in busy]
        lines.append(
            f"{name}: {len(mine) - len(left)} done / {len(left)} remaining"
            + (f" (started, with checkpoints: {'; '.join(started)})" if busy else "")
            + f"; seeds per arm: {per_arm}; {timing_text}"
        )
    lines.append(
        f"left: about {total_left / 60:.1f} process-hours of measured runs"
        + (f" plus {', '.join(unknown)} (not yet timed)" if unknown else "")
        + "; with --jobs N side by side, about that / N of wall time"
    )
    print("\n".join(lines))
    return 0


def campaign_environment(records):
    """What the pages print about where and how long the runs took, from the records."""
    import platform

    import torch

    minutes = [r["minutes"] for r in records]
    return {
        "wall_time_s": round(60 * sum(minutes), 1),
        "units": len(records),
        "minutes_per_run": common.minutes_per_run(records),
        "torch_threads": max(r["environment"]["torch_threads"] for r in records),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": max((r["environment"]["load_average_at_end"] for r in records)),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def missing_arms(runs_dir, name, quick=False):
    """The arms of experiment `name` with no finished run yet: its page waits for one run of each."""
    arms = {r["arm"] for r in load_records(runs_dir, name) if r["quick"] == quick}
    return [arm for arm in module(name).ARMS if arm not in arms]


def report(options):
    """Each experiment's page from its finished units (once every arm has one), then the README's table."""
    from scripts.experiments import summary

    for name in EXPERIMENTS:
        experiment = module(name)
        records = [r for r in load_records(options.runs_dir, name) if r["quick"] == options.quick]
        missing = missing_arms(options.runs_dir, name, options.quick)
        if missing:
            print(f"{name}: page kept as it is, no finished run yet for {', '.join(missing)}", file=sys.stderr)
            continue
        command = "python scripts/experiments/campaign.py run --jobs 2 ; python scripts/experiments/campaign.py report"
        results = experiment.report(records, command, campaign_environment(records))
        common.write(options.output_dir, name, results, experiment.figure(results), experiment.markdown(results))
        print(f"{name}: page rebuilt from {len(records)} runs", file=sys.stderr)
    status = summary.main(["--output_dir", options.output_dir])
    if status == 0 and Path(options.output_dir).resolve() == Path(common.DOCS).resolve():
        from scripts import render_docs

        status = render_docs.main([])  # the pages other docs quote (docs/analysis.md) follow the new figures
    return status


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    options = parse_args(argv)
    options.threads = options.threads or max(1, (os.cpu_count() or 1) // max(1, options.jobs))
    if options.command == "run":
        return run(options, argv)
    if options.command == "status":
        return status(options)
    return report(options)


def log_progress():
    """The experiments' own log lines (a unit resumed, from which epoch) on stderr, for the campaign's log file."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[campaign %(process)d] %(message)s"))
    log = logging.getLogger("scripts.experiments")
    log.addHandler(handler)
    log.setLevel(logging.INFO)


if __name__ == "__main__":
    log_progress()
    sys.exit(main())
