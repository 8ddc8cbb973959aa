"""Experiment 2 (design document section 6): do CNNs win on small data, with the gap narrowing as data grows?

A compact CNN and the ViT, at about the same parameter count, are trained by the main command's loop with the same
recipe, augmentation and number of updates on 5%, 10%, 25%, 50% and 100% of the training split of the embedded
digits (a different stratified subset per seed), and evaluated on the same held-out test split.

    accelerate launch scripts/experiments/inductive_bias.py              # default run, writes docs/experiments/
    python scripts/experiments/inductive_bias.py --quick --output_dir /tmp/ib
"""

import itertools
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from torch import nn
from transformers.modeling_outputs import ImageClassifierOutput

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hubvit.scripts.experiments import common  # noqa: E402

NAME = "inductive_bias"
FRACTIONS = [0.05, 0.10, 0.25, 0.50, 1.0]
MODELS = ["cnn", "vit"]


class ConvNet(nn.Module):
    """A compact VGG-style CNN for 28 x 28 inputs: three stages of two 3 x 3 conv + BN + ReLU, max pooling between
    stages, global average pooling, a linear head. Width 24 gives about the ViT's parameter count.

    It has what `training.fit` reads from a model: `config.image_size_2d`, `config.num_hidden_layers` and a forward
    over `pixel_values` returning `.logits`.
    """

    def __init__(self, num_labels, width=24, image_size=28):
        super().__init__()
        self.config = SimpleNamespace(image_size_2d=(image_size, image_size), num_hidden_layers=0)

        def stage(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                    nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(*stage(3, width), nn.MaxPool2d(2), *stage(width, 2 * width), nn.MaxPool2d(2),
                                      *stage(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(4 * width, num_labels)

    def forward(self, pixel_values):
        return ImageClassifierOutput(logits=self.classifier(self.features(pixel_values)))


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=250, help="optimizer updates per run, the same for every model and size")
    return p.parse_args(argv)


def subset(train, fraction, seed):
    if fraction >= 1.0:
        return train
    return train.train_test_split(train_size=fraction, seed=seed, stratify_by_column="label")["train"]


def main(argv=None):
    from accelerate.utils import set_seed

    options = parse_args(argv)
    started = time.time()
    seeds = common.setup(options)
    if options.merge:
        results = common.merged(options.merge)
        fractions = [float(f) for f in results["runs"]["cnn"]]
        results["summary"], results["verdicts"] = summarise(results["runs"], fractions)
        common.write(options.output_dir, NAME, results, figure(results, fractions), markdown(results, fractions))
        return 0
    accelerator = common.accelerator_for(options.output_dir)
    steps = 4 if options.quick else options.steps
    fractions = [0.25, 1.0] if options.quick else FRACTIONS
    train, test = common.digits_splits(options.quick)
    labels = train.features["label"].names
    runs = {m: {str(f): {"seeds": [], "train_images": [], "accuracy": []} for f in fractions} for m in MODELS}
    parameters, test_pixels = {}, None
    for seed, fraction, kind in itertools.product(seeds, fractions, MODELS):
        data = subset(train, fraction, seed)
        args = common.training_args(options.output_dir, seed, ["--max_train_steps", steps, "--augment", "none"])
        if kind == "vit":
            model, preprocessing = common.build_vit(args, labels, "position_embedding_type=learned")
        else:
            set_seed(seed)
            model, preprocessing = ConvNet(len(labels)), ((0.5,) * 3, (0.5,) * 3, 2)
        parameters[kind] = sum(p.numel() for p in model.parameters())
        if test_pixels is None:
            test_pixels, test_labels = common.eval_tensors(test, preprocessing, (28, 28))
        model, _ = common.fit(accelerator, args, data, None, model, preprocessing)
        record = runs[kind][str(fraction)]
        record["seeds"].append(seed)
        record["train_images"].append(len(data))
        record["accuracy"].append(common.accuracy(common.predict(model, test_pixels), test_labels))
        print(f"{kind} {fraction:.0%} seed {seed}: {record['accuracy'][-1]:.4f}", file=sys.stderr, flush=True)

    results = {
        "name": NAME,
        "quick": options.quick,
        "command": common.command(NAME),
        "setup": {
            "vit": f"main-command preset `default` with `{common.VIT_OVERRIDES}`, learned 1D position table: "
                   f"{parameters['vit']} parameters",
            "cnn": f"compact VGG-style CNN (widths 24/48/96, BN, global average pooling): {parameters['cnn']} parameters",
            "recipe": f"the main command's embedded recipe for both (AdamW lr 2e-3, cosine with warmup, weight decay "
                      f"0.05, label smoothing 0.1, batch 64) without augmentation for both, {steps} updates per run whatever the "
                      "training-set size",
            "data": f"stratified subsets (one per seed) of the {len(train)} training digits; {len(test)} test digits "
                    "(fixed split, seed 0)",
        },
        "runs": runs,
    }
    results["summary"], results["verdicts"] = summarise(runs, fractions)
    results["environment"] = common.environment(started)
    if accelerator.is_main_process:
        common.write(options.output_dir, NAME, results, figure(results, fractions), markdown(results, fractions))
    return 0


def summarise(runs, fractions):
    summary = {}
    for f in fractions:
        row = {m: dict(zip(("mean", "std"), common.mean_std(runs[m][str(f)]["accuracy"]))) for m in MODELS}
        gap, se = common.difference(runs["cnn"][str(f)]["accuracy"], runs["vit"][str(f)]["accuracy"])
        row["cnn_minus_vit"] = {"difference": gap, "standard_error": se}
        summary[str(f)] = row
    small, large = summary[str(fractions[0])]["cnn_minus_vit"], summary[str(fractions[-1])]["cnn_minus_vit"]
    narrowing = small["difference"] - large["difference"]
    narrowing_se = float(np.hypot(small["standard_error"], large["standard_error"]))
    wins = small["difference"] > 2 * small["standard_error"]
    narrows = narrowing > 2 * narrowing_se
    if wins and narrows:
        verdict = (f"holds at this scale: the CNN wins and the gap narrows by {100 * narrowing:.1f} ± "
                   f"{200 * narrowing_se:.1f} points (2 SE) from {fractions[0]:.0%} to {fractions[-1]:.0%}")
    elif not wins and small["difference"] < -2 * small["standard_error"]:
        verdict = "does not hold at this scale: the ViT wins on the smallest split"
    elif wins:
        verdict = "half holds: the CNN wins on small data, but the narrowing is not resolved"
    else:
        verdict = "not resolved at this scale: the gap on the smallest split is within the seed noise"
    measured = (f"CNN - ViT: {100 * small['difference']:+.2f} ± {200 * small['standard_error']:.2f} points at "
                f"{fractions[0]:.0%}, {100 * large['difference']:+.2f} ± {200 * large['standard_error']:.2f} at "
                f"{fractions[-1]:.0%} (2 SE)")
    return summary, [{"claim": "CNNs win on small data; the gap narrows with more data", "measured": measured,
                      "verdict": verdict}]


def figure(results, fractions):
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
            ax.scatter([size] * len(runs[kind][str(f)]["accuracy"]), [100 * a for a in runs[kind][str(f)]["accuracy"]],
                       color=colour, s=8, alpha=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("training images (log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("CNN vs ViT at ~equal parameters, equal updates")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def markdown(results, fractions):
    runs, summary = results["runs"], results["summary"]
    lines = [common.header("Inductive bias: CNN vs ViT against training-set size (design document section 6)",
                           results, "CNNs, with their locality and translation-equivariance built in, win on small "
                           "data; with more data the ViT closes the gap.")]
    lines += ["## Setup", ""] + [f"- {k}: {v}" for k, v in results["setup"].items()]
    lines += ["", "## Results", "", "| fraction | training images | CNN (%) | ViT (%) | CNN - ViT (points, ± 2 SE) |",
              "|---|---|---|---|---|"]
    for f in fractions:
        s = summary[str(f)]
        lines.append(f"| {f:.0%} | {int(np.mean(runs['cnn'][str(f)]['train_images']))} | {common.pct(s['cnn']['mean'])} ± "
                     f"{common.pct(s['cnn']['std'])} | {common.pct(s['vit']['mean'])} ± {common.pct(s['vit']['std'])} | "
                     f"{100 * s['cnn_minus_vit']['difference']:+.2f} ± {200 * s['cnn_minus_vit']['standard_error']:.2f} |")
    lines += ["", "± is the standard deviation over seeds unless marked.", "", "## Verdict", ""]
    lines += [f"- **{v['claim']}** — {v['verdict']}. Measured: {v['measured']}." for v in results["verdicts"]]
    lines += ["", "## What this small setting can and cannot show", "",
              "\"More data\" here tops out at 4,000 digits, three to four orders of magnitude below where the paper sees "
              "ViTs overtake ResNets (ImageNet-21k, JFT-300M); this measures only the small-data end of the claim. "
              "A fixed number of updates means the smallest subsets are seen for many more epochs (no augmentation), "
              "the usual way to give both models the same compute; with a short budget the ViT is far from converged "
              "and the gap mostly measures how much faster the CNN learns per update. Neither model was tuned; both use the main "
              "command's recipe, which was chosen for the ViT.", "", common.SCHEDULE_NOTE]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
