"""What every experiment shares: data splits, the ViT they train, the call into the main command's `fit`, writing.

Each experiment builds its training arguments with the Python API (`hubvit.training.Arguments`, the dataclasses
`hubvit train` parses), so a model here is trained exactly as `scripts/finetune.py` would train it with the same
options, by the same loop.
"""

import argparse
import json
import logging
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "experiments"
# The experiments' ViT: the main command's default preset (4 heads, mean pooling) with 4-px patches, so 28 x 28
# digits give a 7 x 7 grid where geometry matters, narrowed to 64 wide and 4 blocks so that a run takes a minute or two
# on a CPU core.
VIT_FIELDS = dict(patch_size=4, hidden_size=64, intermediate_size=128, num_hidden_layers=4)


def fields_text(fields):
    """Config fields as the reports print them: `name=value,...`."""
    return ",".join(f"{k}={v}" for k, v in fields.items())


VIT_OVERRIDES = fields_text(VIT_FIELDS)
# Five seeds: a paired 95% t interval then uses t(4) = 2.78 standard errors; with three, t(2) = 4.30.
DEFAULT_SEEDS = 5
VALIDATION_SIZE = 600


def parser(description, quick_help="a tiny run (seconds to a minute) for the tests: structure, not accuracy"):
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--output_dir", default=str(DOCS), help="where the JSON, PNG and markdown go (default docs/experiments)"
    )
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--seeds", type=int, help=f"number of seeds (default {DEFAULT_SEEDS}; 1 with --quick)")
    p.add_argument("--cpu_threads", type=int, help="torch threads (default: OMP_NUM_THREADS or torch's choice)")
    p.add_argument("--first_seed", type=int, default=0, help="seeds are first_seed, first_seed + 1, ...")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="instead of training, pool the runs of these results "
        "files (the same experiment run with different --first_seed, side by side) and write the report",
    )
    return p


def setup_quietly(threads=None):
    """Thread count; datasets' and transformers' own progress and warnings off (a script's entry point only)."""
    import datasets
    import transformers

    if threads:
        torch.set_num_threads(threads)
    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("TQDM_DISABLE", "1")


def setup(options):
    """Seeds list, quiet logging, thread count; returns the seeds."""
    setup_quietly(options.cpu_threads)
    Path(options.output_dir).mkdir(parents=True, exist_ok=True)
    count = options.seeds or (1 if options.quick else DEFAULT_SEEDS)
    return list(range(options.first_seed, options.first_seed + count))


def concatenate(parts):
    """Nested dicts of per-seed lists, pooled: lists are joined in order, dicts merged key by key."""
    first = parts[0]
    if isinstance(first, dict):
        return {key: concatenate([part[key] for part in parts]) for key in first}
    if isinstance(first, list):
        return [item for part in parts for item in part]
    return first


def merged(paths):
    """One results dict from the results files of runs of one experiment over different seeds."""
    parts = [json.loads(Path(path).read_text()) for path in paths]
    results = dict(parts[0])
    if len({json.dumps(part["setup"], sort_keys=True) for part in parts}) != 1:
        raise SystemExit(f"--merge: the runs in {paths} differ in their setup; only seeds may differ")
    results["runs"] = concatenate([part["runs"] for part in parts])
    results["command"] = " ; ".join([part["command"] for part in parts] + [command(results["name"])])
    results["environment"] = dict(
        parts[0]["environment"],
        wall_time_s=max(p["environment"]["wall_time_s"] for p in parts),
        parallel_parts=len(parts),
        load_average_at_end=max((p["environment"]["load_average_at_end"] for p in parts)),
    )
    return results


def training_args(output_dir, seed, **options):
    """The main command's arguments (its defaults and recipe) for one run of the experiment, built with the Python
    API: `options` are fields of `hubvit.training.Arguments`."""
    from hubvit import training

    args = training.Arguments.build(output_dir=str(output_dir), seed=seed, logging_steps=1_000_000, **options)
    return training.resolve_defaults(args)


def accelerator_for(output_dir):
    from hubvit import training

    return training.make_accelerator(training_args(output_dir, 0))


def build_vit(args, label_names, fields=None):
    """The main command's model from its preset, with VIT_FIELDS and the experiment's `fields` (seeded by
    `args.seed`); returns (model, Preprocessing)."""
    from accelerate.utils import set_seed

    from hubvit import training

    set_seed(args.seed)
    return training.load_model(args, label_names, config_fields={**VIT_FIELDS, **(fields or {})})


def fit(accelerator, args, train, test, model, preprocessing):
    """The main command's training loop; returns the unwrapped model in eval mode and fit's results."""
    from accelerate.utils import set_seed

    from hubvit import training

    set_seed(args.seed)
    model, results = training.fit(args, accelerator, train, test, model, preprocessing)
    model = accelerator.unwrap_model(model).eval()
    accelerator.free_memory()
    return model, results


def digits_splits(quick=False):
    """The main command's 5,000 embedded MNIST digits, split once (stratified, seed 0): 4,000 train / 1,000 test.

    The split is the same for every seed and every experiment; nothing is tuned on it.
    """
    from hubvit import training

    parts = training.embedded_digits().train_test_split(test_size=0.2, seed=0, stratify_by_column="label")
    train, test = parts["train"], parts["test"]
    if quick:
        train, test = train.select(range(300)), test.select(range(200))
    return train, test


def digits_train_validation_test(quick=False):
    """`digits_splits`' 4,000 training digits carved once more (stratified, seed 0) into 3,400 train / 600
    validation; the 1,000 test digits are the same as every other experiment's. The plateau and the checkpoint are
    chosen on validation; test is evaluated once, at the end."""
    train, test = digits_splits(quick)
    size = 100 if quick else VALIDATION_SIZE
    parts = train.train_test_split(test_size=size, seed=0, stratify_by_column="label")
    return parts["train"], parts["test"], test


@dataclass(frozen=True)
class Plateau:
    """When a run stops: after the first epoch at which the best validation accuracy of the last `patience` epochs is
    not more than `min_delta` above the best before them (at least `min_epochs` epochs), or at `max_epochs`. The
    learning-rate schedule (the main command's cosine with warmup) spans `max_epochs`; the weights kept are those of
    the epoch with the best validation accuracy (the earliest among ties)."""

    max_epochs: int = 30
    patience: int = 5
    min_delta: float = 0.003
    min_epochs: int = 10

    def text(self):
        return (
            f"validation accuracy checked after every epoch; stop when the last {self.patience} epochs do not "
            f"beat the best before them by more than {100 * self.min_delta:.1f} points (at least "
            f"{self.min_epochs} epochs), or at the cap of {self.max_epochs} epochs (the cosine schedule spans "
            "the cap); the best-validation weights are kept and the test set is evaluated once with them"
        )

    def reached(self, history):
        if len(history) < max(self.min_epochs, self.patience + 1):
            return False
        return max(history[-self.patience :]) <= max(history[: -self.patience]) + self.min_delta


QUICK_PLATEAU = Plateau(max_epochs=1, patience=1, min_delta=0.0, min_epochs=1)


def prepare_run(args, accelerator, train, model, preprocessing, lr_scale=None):
    """`hubvit.training.loop.prepare` with no eval loader (validation is scored per epoch by the caller) and the
    learning rate of the parameters whose name contains a key of `lr_scale` multiplied by its value."""
    from hubvit.training import loop

    return loop.prepare(args, accelerator, train, None, model, preprocessing, lr_scale=lr_scale)


def _item_in_memory(self, index):
    return self.pixels[index], int(self.labels[index])


def deterministic_transform(args):
    return args.augment == "none" and not args.randaugment and not args.random_erasing


def keep_in_memory(run, split, preprocessing, size):
    """Decode and transform the training images once instead of every epoch: only for a deterministic training
    transform (no augmentation), whose output then equals what it gives every epoch, so the batches are the same."""
    if not deterministic_transform(run.args):
        return False
    pixels, labels = eval_tensors(split, preprocessing, size)
    data = run.train_set
    data.__class__ = type("ImagesInMemory", (type(data),), {"__getitem__": _item_in_memory})
    data.pixels, data.labels = pixels, labels
    run.train_loader.num_workers = 0  # a loader process would only copy tensors; the sampler's order is the same
    return True


def save_atomically(obj, path):
    """`torch.save` to a temporary file in the same folder, then a rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, temporary)
    os.replace(temporary, path)


def rng_states():
    import random

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_states(states):
    import random

    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def fit_to_plateau(
    accelerator,
    args,
    train,
    validation,
    model,
    preprocessing,
    plateau,
    lr_scale=None,
    checkpoint=None,
    eval_every=1,
    score=None,
):
    """Train with the main command's update step (`hubvit.training.loop.train_epoch`) one epoch at a time until
    `plateau` says stop; returns the best-validation model (unwrapped, eval mode) and a record of the run:
    epochs run, updates run, the best epoch and its updates, its validation accuracy, the per-epoch history, and
    whether the plateau or the cap stopped it. With `eval_every` > 1, validation is scored after every
    `eval_every`-th epoch (and the last) only, and `plateau` counts its patience and minimum in those scores: a
    run on a small subset, whose epochs are a few updates each, then checks as often per update as a full run.
    `score(model, pixels, labels)` replaces the validation accuracy (a model trained at several patch sizes is
    scored at all of them).

    With `checkpoint` (a file path), the whole state (model, optimizer, schedule, plateau history, best weights,
    RNG states, epoch) is saved there after every epoch, and a call that finds it resumes exactly where it
    stopped: a unit of the campaign cut short by the end of a session loses one epoch at most. A finished fit
    leaves its best weights and record there, so that a caller interrupted later does not train it again; the
    caller deletes the file when it no longer needs it.
    """
    from accelerate.utils import set_seed
    from hubvit.training import loop
    from tqdm.auto import tqdm

    set_seed(args.seed)
    args.max_train_steps, args.num_train_epochs = None, plateau.max_epochs
    started = time.time()
    size = tuple(model.config.image_size_2d)
    run = prepare_run(args, accelerator, train, model, preprocessing, lr_scale)
    in_memory = keep_in_memory(run, train, preprocessing, size)
    inner = accelerator.unwrap_model(run.model)
    saved = torch.load(checkpoint, weights_only=False) if checkpoint and Path(checkpoint).is_file() else None
    if saved is not None and saved.get("finished"):
        inner.load_state_dict(saved["best_state"])
        return inner.eval(), saved["record"]
    pixels, labels = eval_tensors(validation, preprocessing, size)
    position, progress, history = loop.Position(), tqdm(disable=True), []
    best_state, best_index, best_epoch, stopped, spent, evaluating = None, -1, 0, "cap", 0.0, 0.0
    if saved is not None:
        inner.load_state_dict(saved["model"])
        run.optimizer.load_state_dict(saved["optimizer"])
        run.scheduler.load_state_dict(saved["scheduler"])
        position = loop.Position(global_step=saved["global_step"], epoch=saved["epoch"])
        history, best_state = saved["history"], saved["best_state"]
        best_index = saved.get("best_index", saved["best_epoch"])  # states saved before eval_every: 0-based epoch
        best_epoch = saved["best_epoch"] if "best_index" in saved else saved["best_epoch"] + 1
        spent, evaluating = saved["seconds"], saved["eval_seconds"]
        set_rng_states(saved["rng"])
        logger.info("resumed %s after epoch %d", checkpoint, position.epoch)
    run.model.train()
    while position.epoch < plateau.max_epochs:
        loop.train_epoch(run, position, progress, loop.Window())
        position.epoch += 1
        if position.epoch % eval_every and position.epoch < plateau.max_epochs:
            continue
        scored = time.time()
        history.append(score(inner, pixels, labels) if score else accuracy(predict(inner, pixels), labels))
        evaluating += time.time() - scored
        inner.train()
        if best_state is None or history[-1] > history[best_index]:
            best_index, best_epoch = len(history) - 1, position.epoch
            best_state = {k: v.detach().clone() for k, v in inner.state_dict().items()}
        if plateau.reached(history):
            stopped = "plateau"
            break
        if checkpoint and position.epoch < plateau.max_epochs:
            save_atomically(
                {
                    "model": inner.state_dict(),
                    "optimizer": run.optimizer.state_dict(),
                    "scheduler": run.scheduler.state_dict(),
                    "global_step": position.global_step,
                    "epoch": position.epoch,
                    "history": history,
                    "best_state": best_state,
                    "best_index": best_index,
                    "best_epoch": best_epoch,
                    "seconds": spent + time.time() - started,
                    "eval_seconds": evaluating,
                    "rng": rng_states(),
                },
                checkpoint,
            )
    inner.load_state_dict(best_state)
    accelerator.free_memory()
    record = {
        "epochs": position.epoch,
        "updates": position.global_step,
        "best_epoch": best_epoch,
        "best_updates": best_epoch * run.schedule.updates_per_epoch,
        "validation_accuracy": history[best_index],
        "validation_history": history,
        **({"evaluated_every_epochs": eval_every} if eval_every != 1 else {}),
        "stopped_by": stopped,
        "train_seconds": round(spent + time.time() - started, 1),
        "eval_seconds": round(evaluating, 1),
        "images_in_memory": in_memory,
    }
    if checkpoint:
        save_atomically({"finished": True, "best_state": best_state, "record": record}, checkpoint)
    return inner.eval(), record


REQUIRED_SEEDS = DEFAULT_SEEDS
TIMING_KEYS = ("train_seconds", "eval_seconds", "unit_seconds", "minutes")


class Context:
    """What every unit of one experiment shares in one process (splits, test tensors, the Accelerator), built on
    first use by the experiment's `build`, so that a runner going through many units pays for it once."""

    def __init__(self, options):
        self.options = options
        self._accelerator = None
        self.build()

    def build(self):
        pass

    @property
    def accelerator(self):
        if self._accelerator is None:
            self._accelerator = accelerator_for(self.options.output_dir)
        return self._accelerator


def checkpoint_file(folder, name):
    return None if folder is None else Path(folder) / f"{name}.pt"


def fit_summary(fitted):
    """What a unit keeps of a `fit_to_plateau` record besides the values its experiment reports."""
    keys = ("epochs", "updates", "best_epoch", "validation_accuracy", "validation_history", "stopped_by")
    return {k: fitted[k] for k in keys} | {k: fitted[k] for k in ("train_seconds", "eval_seconds") if k in fitted}


def unit_record(experiment, arm, seed, quick, setup, values, fits, extra=None):
    """The JSON-able record of one finished (experiment, arm, seed) unit: the setup it ran under (units are pooled
    only when it is the same), the per-seed values its experiment reports, its fits (`fit_summary`), its minutes
    of training (the fits' seconds, resumed parts added), and where it ran."""
    return {
        "experiment": experiment,
        "arm": arm,
        "seed": seed,
        "quick": quick,
        "setup": setup,
        "values": values,
        "fits": fits,
        "minutes": round(sum(f.get("train_seconds", 0.0) for f in fits.values()) / 60, 2),
        **(extra or {}),
        "environment": {
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "torch": torch.__version__,
        },
    }


def gather(records, arms, keys):
    """(setup, runs) from unit records: `runs[arm][key]` lists ordered by seed, as the experiments' summaries read
    them; records whose setup differs from the first are refused."""
    setups = {json.dumps(r["setup"], sort_keys=True) for r in records}
    if len(setups) != 1:
        raise ValueError(f"the unit records of {records[0]['experiment']} differ in their setup; only seeds may differ")
    runs = {arm: {key: [] for key in keys} for arm in arms}
    for record in sorted(records, key=lambda r: (r["seed"], arms.index(r["arm"]))):
        run = runs[record["arm"]]
        run["seeds"].append(record["seed"])
        for key in keys:
            if key != "seeds":
                run[key].append(record["values"][key])
    return records[0]["setup"], runs


def minutes_per_run(records):
    """Measured minutes per unit (whole unit, resumed parts added): min, median, max and count."""
    minutes = sorted(r["minutes"] for r in records if r.get("minutes") is not None)
    if not minutes:
        return None
    return {
        "min": minutes[0],
        "median": float(np.median(minutes)),
        "max": minutes[-1],
        "runs": len(minutes),
        "torch_threads": sorted({r["environment"]["torch_threads"] for r in records}),
    }


def seed_counts(runs):
    return {arm: len(run["seeds"]) for arm, run in runs.items()}


def undecided(verdicts, runs, required=REQUIRED_SEEDS):
    """Verdicts as they may be stated: while an arm has fewer than `required` seeds, each says "not yet decided"
    and how many seeds each arm has, then what the seeds so far show."""
    short = {arm: n for arm, n in seed_counts(runs).items() if n < required}
    if not short:
        return verdicts
    counts = ", ".join(f"{arm} {n}" for arm, n in short.items())
    return [
        dict(v, verdict=f"not yet decided (seeds of {required} so far: {counts}); the seeds so far: {v['verdict']}")
        for v in verdicts
    ]


def write_json_atomically(path, data):
    """JSON through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary, path)


def paired_difference(a, b, confidence=0.95):
    """Mean of the per-seed differences a - b (same seed, same split) with its two-sided t interval; the interval
    is infinite with fewer than two pairs, so that no verdict is drawn from a single run."""
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(d)
    if n < 2:
        return {
            "difference": float(d.mean()),
            "low": -float("inf"),
            "high": float("inf"),
            "half_width": float("inf"),
            "pairs": n,
        }
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
    return {
        "difference": float(d.mean()),
        "low": float(d.mean()) - half,
        "high": float(d.mean()) + half,
        "half_width": half,
        "pairs": n,
    }


def paired(runs, a, b, key="accuracy"):
    """`paired_difference` of two arms' `key`, matched by seed (the seeds both arms ran)."""
    left, right = dict(zip(runs[a]["seeds"], runs[a][key])), dict(zip(runs[b]["seeds"], runs[b][key]))
    seeds = sorted(set(left) & set(right))
    return paired_difference([left[s] for s in seeds], [right[s] for s in seeds])


def interval_text(diff, scale=100):
    return (
        f"{scale * diff['difference']:+.2f} points (95% CI {scale * diff['low']:+.2f} to "
        f"{scale * diff['high']:+.2f}, {diff['pairs']} paired seeds)"
    )


def equivalence(diff, margin):
    """Verdict on |a - b| < `margin` from a paired 95% interval: equivalent when the interval lies inside
    (-margin, margin), different when it lies outside, otherwise not resolved (with the smallest margin the
    interval could have shown equivalence for)."""
    low, high = diff["low"], diff["high"]
    if -margin < low and high < margin:
        return "equivalent"
    if low >= margin or high <= -margin:
        return "different"
    return "not resolved"


def resolvable_margin(diff):
    """The smallest margin m for which this interval would lie inside (-m, m)."""
    return max(abs(diff["low"]), abs(diff["high"]))


def eval_tensors(dataset, preprocessing, size):
    """The evaluation transform of the main command (for a `Preprocessing`) applied to every image: (pixels, labels)."""
    from hubvit import training

    _, eval_tf = training.make_transforms(tuple(size), preprocessing, "none")
    pixels = torch.stack([eval_tf(image.convert("RGB")) for image in dataset["image"]])
    return pixels, torch.tensor(dataset["label"])


@torch.no_grad()
def predict(model, pixels, batch_size=250):
    model.eval()
    return torch.cat(
        [model(pixel_values=pixels[i : i + batch_size]).logits.float() for i in range(0, len(pixels), batch_size)]
    )


def accuracy(logits, labels):
    return (logits.argmax(-1) == labels).float().mean().item()


def mean_std(values):
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def difference(a, b):  # kept for the experiments not yet moved to paired intervals
    """Mean of a - b and its standard error (independent seeds), in the units of a and b; infinite with one seed,
    so that no verdict is drawn from a single run."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    if min(len(a), len(b)) < 2:
        return ma - mb, float("inf")
    return ma - mb, float(np.sqrt(sa**2 / len(a) + sb**2 / len(b)))


def command(name, argv=None):
    """The command line that made these results, as a reader would retype it: the script's own, or the one
    `main(argv)` stands for when called from Python."""
    launched = "ACCELERATE_MIXED_PRECISION" in os.environ
    argv = sys.argv[1:] if argv is None else argv
    return ("accelerate launch " if launched else "python ") + shlex.join(
        [f"scripts/experiments/{name}.py", *map(str, argv)]
    )


def environment(started):
    return {
        "wall_time_s": round(time.time() - started, 1),
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
    counts = seed_counts(results["runs"])
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
