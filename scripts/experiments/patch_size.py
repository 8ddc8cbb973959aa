"""Experiment: one checkpoint at any patch size (FlexiViT's PI-resize, Beyer et al., 2023), on the digits.

Accuracy and images/s at each patch size P of 28 x 28 digits for (a) a model trained at one P (`--base_patch`) and
PI-resized to the others, (b) the same model with its kernel plainly interpolated, (c) a model trained natively at
each P, (d) one model trained with a random P per update (`--patch_sizes`, its kernel stored at the largest P).
Every model is the experiments' ViT trained by the main command's loop to its validation plateau (the
random-P model scored by its mean validation accuracy over the sizes, and capped at as many times the native cap as
there are sizes, since it sees each size on about that fraction of its updates); accuracies are on the test digits.

    python scripts/experiments/patch_size.py --cpu_threads 1            # writes docs/experiments/patch_size.*
    python scripts/experiments/patch_size.py --quick --output_dir /tmp/ps
"""

import copy
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.experiments import common  # noqa: E402

NAME = "patch_size"
SIZE = 28
ARMS_TEXT = {
    "pi": "(a) trained at the base P, PI-resized",
    "interpolate": "(b) trained at the base P, kernel interpolated",
    "native": "(c) trained natively at each P",
    "random": "(d) trained with a random P per update",
}


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--patch_sizes", default="4,7,14", help="patch sides that divide 28 (default 4,7,14)")
    p.add_argument("--base_patch", type=int, default=BASE, help="the P of arms (a) and (b) (default 7)")
    p.add_argument(
        "--max_epochs",
        type=int,
        default=PLATEAU.max_epochs,
        help="cap on the epochs of each native model; the random-P model gets it times the number of sizes",
    )
    p.add_argument(
        "--interpolation",
        choices=["bilinear", "bicubic"],
        default="bilinear",
        help="the pixel resize B that PI-resize inverts and (b) applies to the kernel; bilinear + antialias "
        "is the resize of the main command's preprocessing",
    )
    return p.parse_args(argv)


def cpu_isa():
    """The CPU model and its widest vector ISA, printed with every speed figure."""
    try:
        text = subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "?")
    flags = next((line for line in text.splitlines() if line.startswith("Flags")), "")
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model} ({isa})"


@torch.no_grad()
def images_per_second(model, pixels, repeats=3, batch_size=250):
    """Best of `repeats` passes over `pixels` (inference, batch 250): the least disturbed by other jobs."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        common.predict(model, pixels, batch_size)
        best = min(best, time.perf_counter() - started)
    return len(pixels) / best


class AtPatchSize:
    """The model called at one patch size (its kernel resized on the fly), for `common.predict`."""

    def __init__(self, model, patch_size):
        self.model, self.patch_size = model, patch_size

    def __call__(self, **inputs):
        return self.model(**inputs, patch_size=self.patch_size)

    def eval(self):
        self.model.eval()
        return self


def set_interpolation(model, interpolation):
    model.hubvit.embeddings.patch_resize_options.update(interpolation=interpolation, antialias=True)


PLATEAU = common.Plateau(max_epochs=30, patience=5, min_delta=0.003, min_epochs=10)
SIZES = [4, 7, 14]
BASE = 7
FLEXIVIT_MARGIN = 0.01  # "within about a point" (FlexiViT), as a fraction of accuracy
# One unit per trained model: the native model at each P (the base P's also gives arms (a) and (b)) and the
# random-P model.
ARMS = [f"native-{p}" for p in SIZES] + ["random"]


def check_sizes(options):
    from hubvit.training import patch_sizes as flexi

    sizes = flexi.parse_patch_sizes(options.patch_sizes)
    if options.base_patch not in sizes:
        raise SystemExit(f"--base_patch {options.base_patch} is not one of --patch_sizes {sizes}")
    bad = [p for p in sizes if SIZE % p]
    if bad:
        raise SystemExit(f"--patch_sizes {bad} do not divide the image size {SIZE}")
    return sizes


class Context(common.Context):
    """Splits and the test tensors, built once per process for every unit."""

    def build(self):
        self.splits = common.digits_train_validation_test(self.options.quick)
        self.pixels = None


def accuracy_at_every_size(sizes):
    """A `fit_to_plateau` score for the random-P model: its mean validation accuracy over the patch sizes."""

    def score(model, pixels, labels):
        return float(np.mean([common.accuracy(common.predict(AtPatchSize(model, p), pixels), labels) for p in sizes]))

    return score


def run_unit(options, arm, seed, context=None, checkpoints=None):
    """One trained model (`native-P` or `random`) at one seed, to its validation plateau, evaluated on the test
    digits at every patch size it serves; returns the unit's record."""
    context = context or Context(options)
    accelerator = context.accelerator
    sizes = check_sizes(options)
    plateau = common.QUICK_PLATEAU if options.quick else dataclasses.replace(PLATEAU, max_epochs=options.max_epochs)
    random_cap = plateau.max_epochs * len(sizes)
    train, validation, test = context.splits
    labels = train.features["label"].names
    checkpoint = common.checkpoint_file(checkpoints, "digits")
    values, speed = {}, {}
    if arm == "random":
        args = common.training_args(options.output_dir, seed, augment="none", patch_sizes=options.patch_sizes)
        model, preprocessing = common.build_vit(args, labels, dict(patch_size=max(sizes)))
        set_interpolation(model, options.interpolation)
        score = accuracy_at_every_size(sizes)
        fit_plateau = dataclasses.replace(plateau, max_epochs=random_cap)
    else:
        patch = int(arm.split("-")[1])
        args = common.training_args(options.output_dir, seed, augment="none")
        model, preprocessing = common.build_vit(args, labels, dict(patch_size=patch))
        score, fit_plateau = None, plateau
    if context.pixels is None:
        context.pixels = common.eval_tensors(test, preprocessing, (SIZE, SIZE))
    pixels, targets = context.pixels
    model, fitted = common.fit_to_plateau(
        accelerator, args, train, validation, model, preprocessing, fit_plateau, None, checkpoint, score=score
    )
    if arm == "random":
        values["random"] = {
            str(p): common.accuracy(common.predict(AtPatchSize(model, p), pixels), targets) for p in sizes
        }
    else:
        values["native"] = {str(patch): common.accuracy(common.predict(model, pixels), targets)}
        speed[str(patch)] = images_per_second(model, pixels)
        if patch == options.base_patch:
            for method in ("pi", "interpolate"):
                values[method] = {}
                for p in sizes:
                    resized = copy.deepcopy(model).resize_patch_embeddings(p, method, options.interpolation, True)
                    values[method][str(p)] = common.accuracy(common.predict(resized, pixels), targets)
    print(f"{arm} seed {seed}: {values} ({fitted['updates']} updates)", file=sys.stderr, flush=True)
    setup = {
        "patch_sizes": sizes,
        "base_patch": options.base_patch,
        "interpolation": options.interpolation,
        "plateau": dataclasses.asdict(plateau),
        "random_max_epochs": random_cap,
        "splits": {"train": len(train), "validation": len(validation), "test": len(test)},
    }
    extra = {
        "images_per_second": speed,
        "encoder_parameters": sum(p.numel() for p in model.hubvit.encoder.parameters()),
        "cpu": cpu_isa(),
    }
    return common.unit_record(
        NAME, arm, seed, options.quick, setup, values, {"digits": common.fit_summary(fitted)}, extra
    )


def main(argv=None):
    options = parse_args(argv)
    started = time.time()
    sizes = check_sizes(options)
    if options.merge:
        results = common.merged(options.merge)
        results["verdicts"] = verdicts(results)
        common.write(options.output_dir, NAME, results, figure(results), markdown(results))
        return 0
    seeds = common.setup(options)
    context = Context(options)
    arms = [f"native-{p}" for p in sizes] + ["random"]
    records = [run_unit(options, arm, seed, context) for seed in seeds for arm in arms]
    results = report(records, common.command(NAME, argv), common.environment(started))
    if context.accelerator.is_main_process:
        common.write(options.output_dir, NAME, results, figure(results), markdown(results))
    return 0


FIT_KEYS = ("validation_accuracy", "updates", "stopped_by")


def report(records, command, environment):
    """The results dict (setup, runs, summary, verdicts) from finished unit records, one per (model, seed)."""
    setups = {json.dumps(r["setup"], sort_keys=True) for r in records}
    if len(setups) != 1:
        raise ValueError("the unit records of patch_size differ in their setup; only seeds may differ")
    setup = records[0]["setup"]
    sizes, base, interpolation = setup["patch_sizes"], setup["base_patch"], setup["interpolation"]
    largest, plateau, splits = max(sizes), common.Plateau(**setup["plateau"]), setup["splits"]
    units = {arm: {"seeds": []} for arm in [f"native-{p}" for p in sizes] + ["random"]}
    runs = {arm: {str(p): [] for p in sizes} for arm in ARMS_TEXT}
    run_seeds = {arm: {str(p): [] for p in sizes} for arm in ARMS_TEXT}
    fits = {arm: {key: [] for key in ("seeds", *FIT_KEYS)} for arm in units}
    speed, first = {}, {}
    for record in sorted(records, key=lambda r: r["seed"]):
        units[record["arm"]]["seeds"].append(record["seed"])
        fits[record["arm"]]["seeds"].append(record["seed"])
        for key in FIT_KEYS:
            fits[record["arm"]][key].append(record["fits"]["digits"][key])
        for arm, per_size in record["values"].items():
            for p, value in per_size.items():
                runs[arm][p].append(value)
                run_seeds[arm][p].append(record["seed"])
        for p, value in record.get("images_per_second", {}).items():
            speed.setdefault(p, value)
        first.setdefault("encoder_parameters", record["encoder_parameters"])
        first.setdefault("cpu", record["cpu"])
    patch_list = ",".join(map(str, sizes))
    results = {
        "name": NAME,
        "quick": records[0]["quick"],
        "command": command,
        "setup": {
            "model": f"main-command preset `default` with `{common.VIT_OVERRIDES}` and the patch size of each arm: "
            f"mean pooling, learned position table over the grid (resized with bicubic + antialias, the "
            f"config's default), {first['encoder_parameters']} encoder parameters",
            "training": "the main command's embedded recipe (AdamW lr 2e-3, cosine, label smoothing 0.1, batch 64) "
            f"without augmentation; {plateau.text()} (the random-P model is scored by its mean validation accuracy "
            f"over the patch sizes and capped at {setup['random_max_epochs']} epochs: it sees each size on about "
            f"1/{len(sizes)} of its updates), to the validation plateau for every model",
            "patch sizes": f"{sizes} on {SIZE} x {SIZE} digits: grids "
            + ", ".join(f"{SIZE // p} x {SIZE // p}" for p in sizes),
            "(a), (b)": f"the native P = {base} model of (c), resized by `resize_patch_embeddings(P, "
            f"method)` with B = {interpolation} + antialias; position table resized to the new grid",
            "(d)": f"`--patch_sizes {patch_list}`: kernel stored at P = {largest}, table at its "
            f"{SIZE // largest} x {SIZE // largest} grid, both resized on the fly each update (PI-resize, "
            f"{interpolation} + antialias); each P drawn for about 1/{len(sizes)} of the updates",
            "throughput": f"inference images/s of the native model at each P (identical cost to any resized model at "
            f"that P), {splits['test']} images in batches of 250, best of 3, CPU {first['cpu']}; from the first "
            "seed's run, on a shared machine",
            "data": f"{splits['train']} train / {splits['validation']} validation / {splits['test']} test embedded "
            "digits (fixed stratified splits, seed 0); accuracies are on the test digits",
        },
        "patch_sizes": sizes,
        "base_patch": base,
        "images_per_second": speed,
        "fits": fits,
        "runs": runs,
        "run_seeds": run_seeds,
        "minutes_per_run": common.minutes_per_run(records),
    }
    common.decide(results, verdicts(results), units)
    results["environment"] = environment
    return results


def paired_at(results, a, b, p):
    """Paired difference of arms a and b at patch size p over the seeds both ran (results merged from runs before
    `run_seeds` was kept ran every arm for each seed, in seed order)."""
    runs = results["runs"]
    seeds = results.get("run_seeds") or {arm: {q: list(range(len(v))) for q, v in r.items()} for arm, r in runs.items()}
    arms = {arm: {"seeds": seeds[arm][p], "accuracy": runs[arm][p]} for arm in (a, b)}
    return common.paired(arms, a, b)


def verdicts(results):
    """FlexiViT's "within about a point": every size's paired interval of random - native lies above -1 point
    (holds), some lies wholly below it (does not hold), or the seeds cannot tell. PI-resize beats interpolation
    where the paired interval of PI - interpolate lies above 0."""
    runs, sizes, base = results["runs"], [str(p) for p in results["patch_sizes"]], str(results["base_patch"])
    summary = {
        arm: {p: dict(zip(("mean", "std"), common.mean_std(v))) for p, v in r.items()} for arm, r in runs.items()
    }
    results["summary"] = summary
    gaps = {p: paired_at(results, "random", "native", p) for p in sizes}
    others = [p for p in sizes if p != base]
    pi_vs = {p: paired_at(results, "pi", "interpolate", p) for p in others}
    fmt = lambda arm, p: f"{common.pct(summary[arm][p]['mean'])}"  # noqa: E731
    if min(d["pairs"] for d in gaps.values()) < 2:
        flexivit = "not resolved (one seed)"
    elif all(d["low"] > -FLEXIVIT_MARGIN for d in gaps.values()):
        flexivit = f"holds at this scale: every size's interval lies above -{100 * FLEXIVIT_MARGIN:.0f} point"
    elif any(d["high"] < -FLEXIVIT_MARGIN for d in gaps.values()):
        worst = min(sizes, key=lambda p: gaps[p]["high"])
        flexivit = (
            f"does not hold at this scale: at P={worst} the random-P model is {-100 * gaps[worst]['high']:.1f} "
            "points or more below native"
        )
    else:
        flexivit = (
            f"not resolved: the seeds place random - native only above {100 * min(d['low'] for d in gaps.values()):.1f}"
            " points"
        )
    better = [p for p in others if pi_vs[p]["pairs"] > 1 and pi_vs[p]["low"] > 0]
    if min((d["pairs"] for d in pi_vs.values()), default=0) < 2:
        pi = "not resolved (one seed)"
    else:
        pi = (
            "holds at this scale"
            if len(better) == len(others)
            else (
                "PI-resize is better at "
                + (", ".join(f"P={p}" for p in better) or "no size")
                + " (paired 95% interval above 0)"
            )
        )
    return [
        {
            "claim": "FlexiViT: one model trained with a random patch size is within about a point of a model trained "
            "natively at every patch size",
            "measured": "; ".join(
                f"P={p}: random {fmt('random', p)}% vs native {fmt('native', p)}%, {common.interval_text(gaps[p])}"
                for p in sizes
            ),
            "verdict": flexivit,
        },
        {
            "claim": "PI-resize keeps a model trained at one patch size usable at others, where plain interpolation of "
            "the kernel does not",
            "measured": "; ".join(
                f"P={p}: PI {fmt('pi', p)}% vs interpolate {fmt('interpolate', p)}%, {common.interval_text(pi_vs[p])}"
                for p in others
            )
            + f" (trained at P={base}: {fmt('native', base)}%)",
            "verdict": pi,
        },
    ]


def figure(results):
    plt = common.pyplot()
    sizes = [str(p) for p in results["patch_sizes"]]
    s, runs = results["summary"], results["runs"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    x = np.arange(len(sizes))
    for k, (arm, label) in enumerate(ARMS_TEXT.items()):
        means = [100 * s[arm][p]["mean"] for p in sizes]
        stds = [100 * s[arm][p]["std"] for p in sizes]
        ax.errorbar(x + (k - 1.5) * 0.06, means, yerr=stds, marker="o", capsize=3, label=label)
        for i, p in enumerate(sizes):
            ax.scatter(
                [i + (k - 1.5) * 0.06] * len(runs[arm][p]), [100 * v for v in runs[arm][p]], s=6, color="k", zorder=3
            )
    ax.set_xticks(x, [f"P={p}\n{28 // int(p)}x{28 // int(p)} patches" for p in sizes])
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Accuracy at each patch size: mean ± std over seeds (dots: seeds)")
    ax.legend(fontsize=8)
    speed = results["images_per_second"]
    bx.bar(x, [speed[p] for p in sizes], color="#9ecae1")
    bx.set_xticks(x, [f"P={p}" for p in sizes])
    bx.set_ylabel("images / s (inference, batch 250)")
    bx.set_title("Throughput at each patch size (same encoder)")
    return fig


def markdown(results):
    sizes = [str(p) for p in results["patch_sizes"]]
    s, runs, speed = results["summary"], results["runs"], results["images_per_second"]
    seeds = len(runs["native"][sizes[0]])
    lines = [
        common.header(
            "One checkpoint at any patch size: PI-resize and random-patch-size training",
            results,
            "(FlexiViT, Beyer et al., 2023) resizing the patch-embedding kernel with the pseudo-inverse "
            "of the pixel resize keeps a model usable at other patch sizes where plain interpolation "
            "does not, and one model trained with a random patch size per batch comes within about a "
            "point of models trained natively at each size.",
        )
    ]
    lines += ["## Setup", ""] + [f"- {k}: {v}" for k, v in results["setup"].items()]
    lines += [
        f"- seeds: {seeds}",
        "",
        "## Results",
        "",
        "Test accuracy (%), mean ± standard deviation over seeds, and inference throughput:",
        "",
        "| arm | " + " | ".join(f"P={p}" for p in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for arm, label in ARMS_TEXT.items():
        lines.append(
            f"| {label} | "
            + " | ".join(f"{common.pct(s[arm][p]['mean'])} ± {common.pct(s[arm][p]['std'])}" for p in sizes)
            + " |"
        )
    lines.append("| images/s (inference) | " + " | ".join(f"{speed[p]:,.0f}" for p in sizes) + " |")
    lines += ["", "Per seed:", ""]
    for arm, label in ARMS_TEXT.items():
        lines.append(
            f"- {label}: " + "; ".join(f"P={p}: " + ", ".join(common.pct(v) for v in runs[arm][p]) for p in sizes)
        )
    lines += [
        "",
        "Validation accuracy (%) at the chosen checkpoint, per seed (the random-P model's: its mean over the"
        " patch sizes), and updates run, stopped by:",
        "",
    ]
    for arm, fit in results.get("fits", {}).items():
        lines.append(
            f"- {arm}: "
            + ", ".join(common.pct(v) for v in fit["validation_accuracy"])
            + "; "
            + ", ".join(f"{u} ({why})" for u, why in zip(fit["updates"], fit["stopped_by"]))
        )
    lines += ["", "## Verdicts", ""]
    lines += [f"- **{v['claim']}** — {v['verdict']}. Measured: {v['measured']}." for v in results["verdicts"]]
    params = results["setup"]["model"].split(", ")[-1]
    lines += [
        "",
        "## What this scale can and cannot show",
        "",
        (
            f"Every model here is the experiments' ViT ({params}) trained to its validation plateau on 28 x 28 "
            f"digits, {seeds} seed(s), on a 2-core CPU shared with other jobs. FlexiViT trained ViT-B-sized models "
            "on ImageNet with far longer schedules and a wider range of patch sizes; here P=14 leaves a 2 x 2 grid. "
            "The (d) model's learned table lives at the largest patch's grid (2 x 2) and is upsampled for finer "
            "grids, as FlexiViT stores one small table and resizes it; at this size that leaves the finest grid only "
            "four learned positions, and the model sees each size for about a third of its updates. So the figures "
            "say which way the effects go on small data, not how large they are at scale. Throughput is measured "
            "once per P on a machine shared with other jobs: compare the ratios between sizes, not the absolute "
            "figures."
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
