"""Native resolution (issue 49): images at their own aspect ratios (NaFlex) against one fixed square, same budget.

The main command's embedded NaFlex default places each digit on a black canvas of one of five aspect ratios (1:2 to
2:1) and trains with `--max_num_patches 16` at patch 7: each canvas keeps its aspect ratio, resized by SigLIP 2's
rule to the largest size of whole patches within 16 (15 or 16 patches). The same model is trained on the same
canvases at one fixed size of the same budget, 28 x 28 (4 x 4 = 16 patches), each canvas squashed to the square
(what the main command does with any image). Each model is trained to its validation plateau; the test canvases
are scored once, overall and per aspect ratio.

    python scripts/experiments/native_resolution.py --quick --output_dir /tmp/native
    python scripts/experiments/campaign.py run --only native_resolution    # the five seeds, as campaign units
"""

import dataclasses
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.experiments import common  # noqa: E402

NAME = "native_resolution"
PATCH = 7
BUDGET = 16  # the embedded NaFlex default's `--max_num_patches`; 28 x 28 at patch 7 is the same 16 patches
SIZE = 28
FIELDS = dict(patch_size=PATCH)
ARMS = ["naflex", "square"]
LABELS = {
    "naflex": "NaFlex: own aspect ratio, at most 16 patches",
    "square": "fixed 28 x 28: squashed (16 patches)",
}
# A 40-epoch cap stopped every arm of seed 0 at the cap (the slowest still gaining 0.3 points per epoch in its last
# ten), so the cap is twice that and the patience that of position_embeddings' augmented runs.
PLATEAU = common.Plateau(max_epochs=80, patience=10, min_delta=0.003, min_epochs=20)
AUGMENT = "affine"  # the main command's default recipe, in both arms (NaFlex applies it before its budget resize)
FIT_KEYS = ["validation_accuracy", "updates", "best_updates", "stopped_by", "train_seconds"]


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--max_epochs", type=int, default=PLATEAU.max_epochs, help="cap on the epochs of each fit")
    return p.parse_args(argv)


def aspect(image):
    return f"{image.height}x{image.width}"


class Context(common.Context):
    """The digits' fixed splits, each placed on canvases once (seeds 0, 1, 2 for train, validation, test): every
    arm and seed sees the same canvases."""

    def build(self):
        from hubvit.training.naflex import digits_on_canvases

        splits = common.digits_train_validation_test(self.options.quick)
        self.canvases = [digits_on_canvases(split, seed=k) for k, split in enumerate(splits)]
        self.aspects = [aspect(image) for image in self.canvases[2]["image"]]


def plateau(options):
    return common.QUICK_PLATEAU if options.quick else dataclasses.replace(PLATEAU, max_epochs=options.max_epochs)


def unit_setup(options, context):
    train, validation, test = context.canvases
    return {
        "patch_size": PATCH,
        "budget": BUDGET,
        "size": SIZE,
        "augment": AUGMENT,
        "batching": "batches of 64; NaFlex's of one patch count (the default `--naflex_batching patch_count`)",
        "splits": {"train": len(train), "validation": len(validation), "test": len(test)},
        "plateau": dataclasses.asdict(plateau(options)),
    }


def per_aspect(correct, aspects):
    return {name: float(np.mean([c for c, a in zip(correct, aspects) if a == name])) for name in sorted(set(aspects))}


def run_unit(options, arm, seed, context=None, checkpoints=None):
    """One seed of one arm: the model trained to its validation plateau on the arm's inputs, scored on the test
    canvases (overall, per aspect ratio) and the patches it read per image."""
    context = context or Context(options)
    train, validation, test = context.canvases
    budget = dict(max_num_patches=BUDGET, naflex_batching="patch_count") if arm == "naflex" else {}
    args = common.training_args(options.output_dir, seed, augment=AUGMENT, **budget)
    model, preprocessing = common.build_vit(args, train.features["label"].names, FIELDS)
    model, fitted = common.fit_to_plateau(
        context.accelerator,
        args,
        train,
        validation,
        model,
        preprocessing,
        plateau(options),
        None,
        common.checkpoint_file(checkpoints, "digits"),
    )
    pixels, labels = common.eval_tensors(test, preprocessing, (SIZE, SIZE), common.patch_budget(args, model))
    correct = (common.predict(model, pixels).argmax(-1) == labels).float().tolist()
    patches = pixels.mask.sum(1).float().mean().item() if arm == "naflex" else float((SIZE // PATCH) ** 2)
    values = {
        "accuracy": float(np.mean(correct)),
        "per_aspect": per_aspect(correct, context.aspects),
        "patches_per_image": patches,
        **{k: fitted[k] for k in FIT_KEYS},
    }
    print(f"{NAME} {arm} seed {seed}: test {values['accuracy']:.4f}", file=sys.stderr, flush=True)
    parameters = sum(p.numel() for p in model.parameters())
    fits = {"digits": common.fit_summary(fitted)}
    return common.unit_record(
        NAME, arm, seed, options.quick, unit_setup(options, context), values, fits, {"parameters": parameters}
    )


def main(argv=None):
    return common.run_experiment(sys.modules[__name__], argv)


def report(records, command, environment):
    """The results dict (setup, runs, summary, verdicts) from finished unit records."""
    setup, runs = common.gather(records, ARMS, ["seeds", "accuracy", "per_aspect", "patches_per_image", *FIT_KEYS])
    first = records[0]
    results = {
        "name": NAME,
        "quick": first["quick"],
        "command": command,
        "setup": {
            "model": f"main-command preset `default` with `{common.fields_text({**common.VIT_FIELDS, **FIELDS})}`: "
            f"learned 1D table of 4 x 4 rows (resized to each image's grid in the NaFlex arm, bilinear + antialias "
            f"as SigLIP 2), mean pooling, {first['parameters']} parameters",
            "data": f"{setup['splits']['train']} train / {setup['splits']['validation']} validation / "
            f"{setup['splits']['test']} test embedded digits (fixed stratified splits), each placed once at a random "
            "spot of a black canvas of 28x56, 28x42, 28x28, 42x28 or 56x28 pixels (the main command's NaFlex "
            "default, `digits_on_canvases`, seeds 0 / 1 / 2 for the three splits): the same canvases in every arm",
            "inputs": "; ".join(f"{arm}: {label}" for arm, label in LABELS.items()),
            "training": "the main command's embedded recipe (AdamW lr 2e-3, cosine, label smoothing 0.1, batch 64) "
            f"with its `{setup['augment']}` augmentation; {common.Plateau(**setup['plateau']).text()}",
            "splits": setup["splits"],
            "plateau": setup["plateau"],
            "comparisons": "fixed before any run: NaFlex against the fixed square on all test canvases, paired by seed",
        },
        "runs": runs,
        "minutes_per_run": common.minutes_per_run(records),
    }
    results["summary"] = {arm: dict(zip(("mean", "std"), common.mean_std(runs[arm]["accuracy"]))) for arm in ARMS}
    common.decide(results, verdicts(results), runs)
    results["environment"] = environment
    return results


def verdicts(results):
    runs, s, out = results["runs"], results["summary"], []
    for other in ARMS[1:]:
        diff = common.paired(runs, "naflex", other)
        verdict = (
            "holds: NaFlex is more accurate (interval above 0)"
            if diff["low"] > 0
            else "does not hold: the fixed square is more accurate (interval below 0)"
            if diff["high"] < 0
            else "not resolved: the 95% interval contains 0"
        )
        out.append(
            {
                "claim": "at the same patch budget, keeping each image's aspect ratio (NaFlex) is more accurate "
                f"than reading every image at one fixed square ({LABELS[other]})",
                "measured": f"NaFlex {common.pct(s['naflex']['mean'])}% vs {common.pct(s[other]['mean'])}%: "
                f"{common.interval_text(diff)}",
                "verdict": verdict,
            }
        )
    return out


def aspect_means(run):
    names = list(run["per_aspect"][0])
    return names, {name: [seed[name] for seed in run["per_aspect"]] for name in names}


def figure(results):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    names, _ = aspect_means(results["runs"]["naflex"])
    groups = ["all", *names]
    width = 0.8 / len(ARMS)
    for k, arm in enumerate(ARMS):
        run = results["runs"][arm]
        _, by_aspect = aspect_means(run)
        series = [run["accuracy"], *(by_aspect[name] for name in names)]
        x = np.arange(len(groups)) + (k - (len(ARMS) - 1) / 2) * width
        means = [100 * common.mean_std(v)[0] for v in series]
        stds = [100 * common.mean_std(v)[1] for v in series]
        ax.bar(x, means, width, yerr=stds, capsize=3, label=LABELS[arm])
    ax.set_xticks(np.arange(len(groups)), ["all test canvases", *(f"canvas {n}" for n in names)])
    ax.set_ylabel("test accuracy (%)")
    low = min(100 * min(min(v) for v in aspect_means(results["runs"][arm])[1].values()) for arm in ARMS)
    ax.set_ylim(max(0, low - 5), 100)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Digits on canvases of five aspect ratios, 16 patches of 7 px per image: mean ± std over seeds")
    return fig


def markdown(results):
    s, runs = results["summary"], results["runs"]
    names, _ = aspect_means(runs["naflex"])
    lines = [
        common.header(
            "Native resolution: images at their own aspect ratios (NaFlex) against one fixed square",
            results,
            "At the same token budget, a ViT that reads each image at its own aspect ratio (SigLIP 2's NaFlex) is "
            "more accurate than the same ViT reading every image at one fixed square size.",
        ),
        "## Setup",
        "",
        *(f"- {k}: {v}" for k, v in results["setup"].items() if isinstance(v, str)),
        "",
        "## Results",
        "",
        "| input | patches per test image | test accuracy (%) | " + " | ".join(names) + " | per seed | updates run |",
        "|---|---|---|" + "---|" * len(names) + "---|---|",
    ]
    for arm in ARMS:
        run = runs[arm]
        _, by_aspect = aspect_means(run)
        cells = [f"{100 * common.mean_std(by_aspect[n])[0]:.2f}" for n in names]
        lines.append(
            f"| {LABELS[arm]} | {np.mean(run['patches_per_image']):.2f} | {common.pct(s[arm]['mean'])} ± "
            f"{common.pct(s[arm]['std'])} | "
            + " | ".join(cells)
            + f" | {', '.join(common.pct(v) for v in run['accuracy'])}"
            f" | {', '.join(str(u) for u in run['updates'])}, stopped by {', '.join(run['stopped_by'])} |"
        )
    lines += [
        "",
        "± is the standard deviation over seeds; the per-aspect columns are means over seeds; intervals in the "
        "verdicts are paired 95% t intervals (same seed, same canvases).",
        "",
        "## Verdicts",
        "",
        *(f"- **{v['claim']}** — {v['verdict']}. Measured: {v['measured']}." for v in results["verdicts"]),
        "",
        "## What this small setting can and cannot show",
        "",
        "The canvases hold a 28 x 28 digit on black: squashing a 1:2 canvas of 28 x 56 to the square makes the digit "
        "28 x 14 pixels, while NaFlex resizes the canvas to 21 x 35 and the digit to 21 x 17.5, nearly its own shape. "
        "Padding each canvas to a square (aspect ratio kept at a fixed size) was not run. Natural photographs carry "
        "detail across the whole frame and "
        "aspect ratios beyond 2:1; the verdicts speak for a small ViT on these canvases, not for SigLIP 2's scale.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
