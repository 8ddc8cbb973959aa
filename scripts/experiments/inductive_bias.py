"""Experiment 2 (ViT from First Principles, section 6): do CNNs win on small data, with the gap narrowing as data grows?

A compact CNN of about the ViT's multiply-accumulates per image (MACs) and the ViT are trained by the main command's
loop with the same recipe on 5%, 10%, 25%, 50% and 100% of the 3,400 training digits (a different stratified subset
per seed). The ViT trains to its validation plateau (600 fixed validation digits; the plateau criterion counted in
full-data epochs' worth of updates, so a 5% subset gets 20 times the epochs); the CNN then gets the same training
FLOPs (the ViT's updates times the ratio of MACs, batch 64 both). Both are evaluated once on the same test split.

    accelerate launch scripts/experiments/inductive_bias.py              # default run, writes docs/experiments/
    python scripts/experiments/inductive_bias.py --quick --output_dir /tmp/ib
"""

import dataclasses
import itertools
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn
from transformers.modeling_outputs import ImageClassifierOutput

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hubvit.preprocessing import Preprocessing  # noqa: E402
from scripts.experiments import common  # noqa: E402

NAME = "inductive_bias"
FRACTIONS = [0.05, 0.10, 0.25, 0.50, 1.0]
MODELS = ["cnn", "vit"]
CNN_WIDTH = 15
PLATEAU = common.Plateau(max_epochs=30, patience=5, min_delta=0.003, min_epochs=10)  # at 100%; plateau_for: subsets


def macs(model, size=28):
    """Multiply-accumulates of one forward pass on one image (torch's FLOP counter halved)."""
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(pixel_values=torch.zeros(1, 3, size, size))
    model.train(was_training)
    return counter.get_total_flops() // 2


def plateau_for(fraction, plateau=PLATEAU):
    """`plateau` for a subset scored once per 1 / fraction epochs: the cap in the subset's epochs (the same updates
    as at 100%); patience and minimum unchanged, as `fit_to_plateau` counts them in scores, not epochs."""
    return dataclasses.replace(plateau, max_epochs=math.ceil(plateau.max_epochs / fraction))


class ConvNet(nn.Module):
    """A compact VGG-style CNN for 28 x 28 inputs: three stages of two 3 x 3 conv + BN + ReLU, max pooling between
    stages, global average pooling, a linear head. Width 15 gives about the ViT's MACs per image (6.6M); width 24,
    the earlier default, gave about its parameter count at 2.5 times its MACs.

    It has what `training.fit` reads from a model: `config.image_size_2d`, `config.num_hidden_layers` and a forward
    over `pixel_values` returning `.logits`.
    """

    def __init__(self, num_labels, width=CNN_WIDTH, image_size=28):
        super().__init__()
        self.config = SimpleNamespace(image_size_2d=(image_size, image_size), num_hidden_layers=0)

        def stage(cin, cout):
            return [
                nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            ]

        self.features = nn.Sequential(
            *stage(3, width),
            nn.MaxPool2d(2),
            *stage(width, 2 * width),
            nn.MaxPool2d(2),
            *stage(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(4 * width, num_labels)

    def forward(self, pixel_values):
        return ImageClassifierOutput(logits=self.classifier(self.features(pixel_values)))


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument(
        "--max_epochs",
        type=int,
        default=PLATEAU.max_epochs,
        help="cap on the ViT's epochs at 100%% of the data (scaled by 1 / fraction)",
    )
    return p.parse_args(argv)


def subset(train, fraction, seed):
    if fraction >= 1.0:
        return train
    return train.train_test_split(train_size=fraction, seed=seed, stratify_by_column="label")["train"]


ARMS = [str(f) for f in FRACTIONS]
QUICK_FRACTIONS = [0.25, 1.0]
KEYS = ["seeds", "train_images", "accuracy", "validation_accuracy", "updates", "train_seconds"]


class Context(common.Context):
    """Splits and the test tensors, built once per process for every unit."""

    def build(self):
        self.splits = common.digits_train_validation_test(self.options.quick)
        self.test_pixels = None


def run_unit(options, arm, seed, context=None, checkpoints=None):
    """One training-set fraction (`arm`, e.g. "0.05") at one seed: the ViT to its plateau (checkpointed per
    evaluation), then the CNN for the same training FLOPs; returns the unit's record."""
    from accelerate.utils import set_seed

    context = context or Context(options)
    accelerator = context.accelerator
    fraction = float(arm)
    base = common.QUICK_PLATEAU if options.quick else dataclasses.replace(PLATEAU, max_epochs=options.max_epochs)
    plateau, every = (base, 1) if options.quick else (plateau_for(fraction, base), math.ceil(1 / fraction))
    train, validation, test = context.splits
    labels = train.features["label"].names
    data = subset(train, fraction, seed)
    args = common.training_args(options.output_dir, seed, augment="none")
    vit, preprocessing = common.build_vit(args, labels, {"position_embedding_type": "learned"})
    parameters, cost = {"vit": sum(p.numel() for p in vit.parameters())}, {"vit": macs(vit)}
    if context.test_pixels is None:
        context.test_pixels, context.test_labels = common.eval_tensors(test, preprocessing, (28, 28))
    vit, fitted = common.fit_to_plateau(
        accelerator,
        args,
        data,
        validation,
        vit,
        preprocessing,
        plateau,
        None,
        common.checkpoint_file(checkpoints, "vit"),
        every,
    )
    set_seed(seed)
    cnn = ConvNet(len(labels))
    parameters["cnn"], cost["cnn"] = sum(p.numel() for p in cnn.parameters()), macs(cnn)
    cnn_updates = max(1, round(fitted["updates"] * cost["vit"] / cost["cnn"]))
    cnn_args = common.training_args(options.output_dir, seed, max_train_steps=cnn_updates, augment="none")
    started_cnn = time.time()
    cnn, _ = common.fit(accelerator, cnn_args, data, None, cnn, Preprocessing())
    cnn_pixels = common.eval_tensors(validation, Preprocessing(), (28, 28))
    cnn_seconds = round(time.time() - started_cnn, 1)
    values = {}
    for kind, model, updates, valid, seconds in (
        ("vit", vit, fitted["updates"], fitted["validation_accuracy"], fitted["train_seconds"]),
        ("cnn", cnn, cnn_updates, common.accuracy(common.predict(cnn, cnn_pixels[0]), cnn_pixels[1]), cnn_seconds),
    ):
        values[kind] = {
            "train_images": len(data),
            "accuracy": common.accuracy(common.predict(model, context.test_pixels), context.test_labels),
            "validation_accuracy": valid,
            "updates": updates,
            "train_seconds": seconds,
        }
        print(
            f"{kind} {fraction:.0%} seed {seed}: {values[kind]['accuracy']:.4f} ({updates} updates, {seconds:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    setup = {
        "plateau": dataclasses.asdict(base),
        "macs_per_image": cost,
        "parameters": parameters,
        "splits": {"train": len(train), "validation": len(validation), "test": len(test)},
    }
    fits = {"vit": common.fit_summary(fitted), "cnn": {"updates": cnn_updates, "train_seconds": cnn_seconds}}
    return common.unit_record(NAME, arm, seed, options.quick, setup, values, fits)


def main(argv=None):
    options = parse_args(argv)
    started = time.time()
    seeds = common.setup(options)
    if options.merge:
        results = common.merged(options.merge)
        fractions = [float(f) for f in results["runs"]["cnn"]]
        results["summary"], results["verdicts"] = summarise(results["runs"], fractions)
        common.write(options.output_dir, NAME, results, figure(results, fractions), markdown(results, fractions))
        return 0
    context = Context(options)
    fractions = QUICK_FRACTIONS if options.quick else FRACTIONS
    records = [run_unit(options, str(f), seed, context) for seed, f in itertools.product(seeds, fractions)]
    results = report(records, common.command(NAME, argv), common.environment(started))
    if context.accelerator.is_main_process:
        fractions = results["fractions"]
        common.write(options.output_dir, NAME, results, figure(results, fractions), markdown(results, fractions))
    return 0


def report(records, command, environment):
    """The results dict (setup, runs, summary, verdicts) from finished unit records, one per (fraction, seed)."""
    arms = sorted({r["arm"] for r in records}, key=float)
    fractions = [float(a) for a in arms]
    setup = records[0]["setup"]
    runs = {}
    for kind in MODELS:
        per_model = [dict(r, values=r["values"][kind]) for r in records]
        runs[kind] = common.gather(per_model, arms, KEYS)[1]
    stops = common.gather([dict(r, values=r["fits"]["vit"]) for r in records], arms, ["seeds", "stopped_by"])[1]
    for arm in arms:
        runs["vit"][arm]["stopped_by"] = stops[arm]["stopped_by"]
    base, cost, parameters, splits = (
        common.Plateau(**setup["plateau"]),
        setup["macs_per_image"],
        setup["parameters"],
        setup["splits"],
    )
    results = {
        "name": NAME,
        "quick": records[0]["quick"],
        "command": command,
        "fractions": fractions,
        "setup": {
            "vit": f"main-command preset `default` with `{common.VIT_OVERRIDES}`, learned 1D position table: "
            f"{parameters['vit']} parameters, {cost['vit'] / 1e6:.2f}M MACs per image",
            "cnn": f"compact VGG-style CNN (widths {CNN_WIDTH}/{2 * CNN_WIDTH}/{4 * CNN_WIDTH}, BN, global average "
            f"pooling): {parameters['cnn']} parameters, {cost['cnn'] / 1e6:.2f}M MACs per image",
            "recipe": "the main command's embedded recipe for both (AdamW lr 2e-3, cosine with warmup, weight decay "
            "0.05, label smoothing 0.1, batch 64) without augmentation",
            "budget": f"ViT: {base.text()}, with the cap scaled by 1 / fraction in epochs and validation scored once "
            "per 1 / fraction epochs (once per full-data epoch's worth of updates), patience and minimum counted in "
            "those scores (the same updates as the full-data criterion); CNN: the ViT's updates x (ViT MACs / CNN "
            "MACs) updates, its cosine schedule spanning them, so both spend the same training FLOPs; the CNN's "
            "last weights are used",
            "data": f"stratified subsets (one per seed) of the {splits['train']} training digits; "
            f"{splits['validation']} validation and {splits['test']} test digits (fixed stratified splits, seed 0)",
            "macs_per_image": cost,
            "splits": splits,
        },
        "runs": runs,
        "minutes_per_run": common.minutes_per_run(records),
    }
    results["summary"], verdicts = summarise(runs, fractions)
    common.decide(results, verdicts, runs["vit"])
    results["environment"] = environment
    return results


def paired_at(runs, fraction):
    return common.paired({m: runs[m][str(fraction)] for m in MODELS}, "cnn", "vit")


def summarise(runs, fractions):
    summary = {}
    for f in fractions:
        row = {m: dict(zip(("mean", "std"), common.mean_std(runs[m][str(f)]["accuracy"]))) for m in MODELS}
        row["cnn_minus_vit"] = paired_at(runs, f)
        summary[str(f)] = row
    small, large = summary[str(fractions[0])]["cnn_minus_vit"], summary[str(fractions[-1])]["cnn_minus_vit"]
    # Narrowing: per seed, (CNN - ViT at the smallest fraction) - (CNN - ViT at all the data), paired by seed.
    gaps = {
        f: {
            s: c - v
            for s, c, v in zip(
                runs["cnn"][str(f)]["seeds"], runs["cnn"][str(f)]["accuracy"], runs["vit"][str(f)]["accuracy"]
            )
        }
        for f in (fractions[0], fractions[-1])
    }
    seeds = sorted(set(gaps[fractions[0]]) & set(gaps[fractions[-1]]))
    narrowing = common.paired_difference(
        [gaps[fractions[0]][s] for s in seeds], [gaps[fractions[-1]][s] for s in seeds]
    )
    wins, loses = small["low"] > 0, small["high"] < 0
    narrows = narrowing["low"] > 0
    if wins and narrows:
        verdict = (
            f"holds at this scale: the CNN wins at {fractions[0]:.0%} and the gap narrows by "
            f"{common.interval_text(narrowing)} to {fractions[-1]:.0%}"
        )
    elif loses:
        verdict = "does not hold at this scale: the ViT wins on the smallest split"
    elif wins:
        verdict = "half holds: the CNN wins on small data, but the narrowing is not resolved (its interval contains 0)"
    else:
        verdict = "not resolved at this scale: the gap on the smallest split's 95% interval contains 0"
    measured = (
        f"CNN - ViT at equal training FLOPs: {common.interval_text(small)} at {fractions[0]:.0%}, "
        f"{common.interval_text(large)} at {fractions[-1]:.0%}"
    )
    return summary, [
        {"claim": "CNNs win on small data; the gap narrows with more data", "measured": measured, "verdict": verdict}
    ]


def figure(results, fractions=None):
    fractions = fractions or results["fractions"]
    plt = common.pyplot()
    runs, summary = results["runs"], results["summary"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for kind, colour in zip(MODELS, ("#d95f02", "#1b9e77")):
        sizes = [np.mean(runs[kind][str(f)]["train_images"]) for f in fractions]
        means = np.array([100 * summary[str(f)][kind]["mean"] for f in fractions])
        stds = np.array([100 * summary[str(f)][kind]["std"] for f in fractions])
        ax.plot(sizes, means, "o-", color=colour, label=f"{kind.upper()} (mean ± std over seeds)")
        ax.fill_between(sizes, means - stds, means + stds, color=colour, alpha=0.2)
        for f, size in zip(fractions, sizes):
            ax.scatter(
                [size] * len(runs[kind][str(f)]["accuracy"]),
                [100 * a for a in runs[kind][str(f)]["accuracy"]],
                color=colour,
                s=8,
                alpha=0.6,
            )
    ax.set_xscale("log")
    ax.set_xlabel("training images (log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("CNN vs ViT at equal training FLOPs, ViT at its plateau")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def markdown(results, fractions=None):
    fractions = fractions or results["fractions"]
    runs, summary = results["runs"], results["summary"]
    lines = [
        common.header(
            "Inductive bias: CNN vs ViT against training-set size (ViT from First Principles, section 6)",
            results,
            "CNNs, with their locality and translation-equivariance built in, win on small "
            "data; with more data the ViT closes the gap.",
        )
    ]
    lines += ["## Setup", ""] + [f"- {k}: {v}" for k, v in results["setup"].items() if isinstance(v, str)]
    lines += [
        "",
        "## Results",
        "",
        ("| fraction | training images | ViT updates (run) | CNN (%) | ViT (%) | CNN - ViT (points, paired 95% CI) |"),
        "|---|---|---|---|---|---|",
    ]
    for f in fractions:
        s, d = summary[str(f)], summary[str(f)]["cnn_minus_vit"]
        lines.append(
            f"| {f:.0%} | {int(np.mean(runs['cnn'][str(f)]['train_images']))} | "
            f"{', '.join(map(str, runs['vit'][str(f)]['updates']))} | {common.pct(s['cnn']['mean'])} ± "
            f"{common.pct(s['cnn']['std'])} | {common.pct(s['vit']['mean'])} ± {common.pct(s['vit']['std'])} | "
            f"{common.interval_cell(d)} |"
        )
    lines += ["", "± is the standard deviation over seeds.", "", "## Verdict", ""]
    lines += [f"- **{v['claim']}** — {v['verdict']}. Measured: {v['measured']}." for v in results["verdicts"]]
    lines += [
        "",
        "## What this small setting can and cannot show",
        "",
        '"More data" here tops out at 3,400 digits, three to four orders of magnitude below where the paper sees '
        "ViTs overtake ResNets (ImageNet-21k, JFT-300M); this measures only the small-data end of the claim. "
        "The ViT is trained to its validation plateau or its cap at every size and the CNN gets the same "
        "training FLOPs, so the gap compares the two at the ViT's budget, not their learning speed. Neither model "
        "was tuned; both use the main command's recipe, which was chosen for the ViT.",
    ]
    capped = {f: runs["vit"][str(f)].get("stopped_by", []).count("cap") for f in fractions}
    if any(capped.values()):
        lines += [
            "",
            "ViT runs stopped by the cap rather than at a validation plateau, by fraction: "
            + ", ".join(f"{f:.0%} {n} of {len(runs['vit'][str(f)]['seeds'])}" for f, n in capped.items())
            + ".",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
