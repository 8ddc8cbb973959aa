"""Experiment 1 (ViT from First Principles, section 3; ViT paper appendix D.4): does the kind of position embedding matter?

The same small ViT (4-px patches: a 7 x 7 grid on the 28 x 28 digits) is trained by the main command's loop with
each `position_embedding_type`, several seeds each. Two controls make "spatial arrangement matters" measurable:
(a) every model is evaluated on the test digits with their patches shuffled by one fixed permutation, which cannot
change what the `none` model predicts (it sees a set of patches); (b) a task whose label *is* a position (which
quadrant of a blank 32 x 32 canvas holds a scikit-learn digit), on which `none` cannot beat chance.

    accelerate launch scripts/experiments/position_embeddings.py          # default run, writes docs/experiments/
    python scripts/experiments/position_embeddings.py --seeds 1 --first_seed 3 --output_dir /tmp/pe3   # one seed
    python scripts/experiments/position_embeddings.py --merge /tmp/pe*/position_embeddings.json      # pooled
    python scripts/experiments/position_embeddings.py --quick --output_dir /tmp/pe --models_dir /tmp/pe/models
"""

import dataclasses
import itertools
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hubvit.modeling.positions_hubvit import POSITION_KINDS  # noqa: E402
from scripts.experiments import common  # noqa: E402
from scripts.experiments.position_controls import (  # noqa: E402
    accuracy_figure,
    bias_magnitude,
    distance_only_stripe,
    rotary_verdict,
    stripe,
    quadrant_verdict,
    CANVAS,
    QUADRANTS,
    fixed_permutation,
    permute_patches,
    quadrant_digits,
)

NAME = "position_embeddings"
TYPES = ["none", "learned", "learned_2d", "relative_2d", "sincos_2d"]
CLAIMED_EQUAL = ["learned", "learned_2d", "relative_2d"]  # the paper's 1D, 2D and relative embeddings
PATCH = 4


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument(
        "--models_dir",
        default=str(common.ROOT / "runs" / NAME),
        help="where the trained digit models are saved (attention_distance.py reads them)",
    )
    p.add_argument(
        "--max_epochs",
        type=int,
        default=DIGITS_PLATEAU.max_epochs,
        help="cap on the digits epochs (3,400 images, batch 64: 54 updates each); the cosine schedule spans it",
    )
    p.add_argument(
        "--quadrant_max_epochs", type=int, default=QUADRANT_PLATEAU.max_epochs, help="cap on the quadrant-task epochs"
    )
    p.add_argument(
        "--bias_lr_scale",
        type=float,
        default=BIAS_LR_SCALE,
        help="learning-rate multiplier of the relative_2d bias tables",
    )
    return p.parse_args(argv)


# Learned 1D at seed 0 stopped short of the 95% the comparison needs with a 30-epoch cap and no augmentation (92.6%
# test), with a 60-epoch cap and no augmentation (94.0%) and with the main command's affine augmentation at 30
# (94.7%; docs/experiments/campaign.md): so the digits runs take the main command's augmentation for these digits and
# 60 epochs, as the main command does, with patience and minimum scaled with the cap.
DIGITS_PLATEAU = common.Plateau(max_epochs=60, patience=10, min_delta=0.003, min_epochs=20)
DIGITS_AUGMENT = "affine"
QUADRANT_PLATEAU = common.Plateau(max_epochs=20, patience=4, min_delta=0.01, min_epochs=6)
# The relative_2d bias starts at zero (BEiT's initialisation). AdamW moves each entry by about its learning rate per
# update at most, so at 2e-3 on a cosine schedule the bias can travel no further than about half of (updates x 2e-3):
# 1.6 over 30 epochs of 54 updates, small against attention logits of order one and more. A learning rate 20 times
# the base lets it reach tens, while the start (zero: no position preference) stays the same as BEiT's; an
# initialisation with a distance prior would instead hand relative_2d a locality the other arms must learn.
BIAS_LR_SCALE = 20.0
RELATIVE_BIAS = "relative_position_bias"
EQUALITY_MARGIN = 0.002  # the claim: within 0.2 points
PAPER_NONE_GAP = 0.03  # paper D.4: no position embedding about 3 points below the 1D table
# Fixed in advance (not chosen by any result): the three pairs of the paper's arms for "the same accuracy", and
# `none` against the paper's default 1D table for "about 3 points".
EQUALITY_PAIRS = list(itertools.combinations(CLAIMED_EQUAL, 2))
NONE_REFERENCE = REFERENCE = "learned"  # the arm every other is compared with: the paper's default
STRIPE_TYPES = ["learned", "learned_2d", "sincos_2d"]


# The rotary arm (issue 47): DINOv3's rotation and no table, compared with the paper's default like every other arm.
ROTARY_ARM = "rope"
ROTARY_FIELDS = {"position_embedding_type": "none", "rope_type": "dinov3"}
ARMS = [*TYPES, ROTARY_ARM]


def arm_fields(arm):
    """The config fields an arm sets: its `position_embedding_type`, or the rotary arm's rotation without a table."""
    return dict(ROTARY_FIELDS) if arm == ROTARY_ARM else {"position_embedding_type": arm}


def positional(arm):
    """Whether the arm tells the model where a patch is (every arm but `none`)."""
    return arm == ROTARY_ARM or POSITION_KINDS[arm].positional


KEYS = [
    "seeds",
    "accuracy",
    "validation_accuracy",
    "updates",
    "best_updates",
    "epochs",
    "stopped_by",
    "train_seconds",
    "shuffled_accuracy",
    "changed_predictions",
    "max_logit_change",
    "stripe_score",
    "max_abs_bias",
    "quadrant_accuracy",
    "quadrant_validation_accuracy",
    "quadrant_updates",
    "quadrant_max_abs_bias",
]


def plateaus(options):
    if options.quick:
        return common.QUICK_PLATEAU, common.QUICK_PLATEAU
    return (
        dataclasses.replace(DIGITS_PLATEAU, max_epochs=options.max_epochs),
        dataclasses.replace(QUADRANT_PLATEAU, max_epochs=options.quadrant_max_epochs),
    )


class Context(common.Context):
    """Splits, test tensors and the fixed permutation, built once per process for every unit."""

    def build(self):
        options = self.options
        self.digits = common.digits_train_validation_test(options.quick)
        self.quadrants = quadrant_digits(options.quick)
        self.permutation = fixed_permutation((28 // PATCH) ** 2)
        self.test_pixels = self.quad_pixels = None


def run_unit(options, arm, seed, context=None, checkpoints=None):
    """One arm at one seed: the digits fit (with the shuffle control and stripe score) and the quadrant fit; returns
    the unit's record. `checkpoints`: a folder for the per-epoch state of both fits (see `common.fit_to_plateau`)."""
    context = context or Context(options)
    digits_plateau, quadrant_plateau = plateaus(options)
    digits_train, digits_validation, digits_test = context.digits
    quad_train, quad_validation, quad_test = context.quadrants
    fields = arm_fields(arm)
    lr_scale = {RELATIVE_BIAS: options.bias_lr_scale}
    augment = "none" if options.quick else DIGITS_AUGMENT
    args = common.training_args(options.output_dir, seed, augment=augment)
    model, preprocessing = common.build_vit(args, digits_train.features["label"].names, fields)
    parameters = sum(p.numel() for p in model.parameters())
    if context.test_pixels is None:
        context.test_pixels, context.test_labels = common.eval_tensors(digits_test, preprocessing, (28, 28))
        context.shuffled = permute_patches(context.test_pixels, PATCH, context.permutation)
    model, fitted = common.fit_to_plateau(
        context.accelerator,
        args,
        digits_train,
        digits_validation,
        model,
        preprocessing,
        digits_plateau,
        lr_scale,
        common.checkpoint_file(checkpoints, "digits"),
    )
    logits, shuffled_logits = common.predict(model, context.test_pixels), common.predict(model, context.shuffled)
    values = {"accuracy": common.accuracy(logits, context.test_labels)}
    values.update({k: fitted[k] for k in ("validation_accuracy", "updates", "best_updates", "epochs", "stopped_by")})
    values.update(
        train_seconds=fitted["train_seconds"],
        shuffled_accuracy=common.accuracy(shuffled_logits, context.test_labels),
        changed_predictions=int((logits.argmax(-1) != shuffled_logits.argmax(-1)).sum()),
        max_logit_change=float((logits - shuffled_logits).abs().max()),
        stripe_score=stripe(model),
        max_abs_bias=bias_magnitude(model),
    )
    if context.accelerator.is_main_process:
        model.save_pretrained(Path(options.models_dir) / f"{arm}-seed{seed}")
    digits_fit = fitted

    args = common.training_args(options.output_dir, seed, image_size=CANVAS, augment="none")
    model, preprocessing = common.build_vit(args, QUADRANTS, fields)
    if context.quad_pixels is None:
        context.quad_pixels, context.quad_labels = common.eval_tensors(quad_test, preprocessing, (CANVAS, CANVAS))
    model, fitted = common.fit_to_plateau(
        context.accelerator,
        args,
        quad_train,
        quad_validation,
        model,
        preprocessing,
        quadrant_plateau,
        lr_scale,
        common.checkpoint_file(checkpoints, "quadrants"),
    )
    values.update(
        quadrant_accuracy=common.accuracy(common.predict(model, context.quad_pixels), context.quad_labels),
        quadrant_validation_accuracy=fitted["validation_accuracy"],
        quadrant_updates=fitted["updates"],
        quadrant_max_abs_bias=bias_magnitude(model),
    )
    print(
        f"{arm} seed {seed}: digits {values['accuracy']:.4f} (validation {values['validation_accuracy']:.4f}, "
        f"{values['updates']} updates, {values['train_seconds']:.0f} s), shuffled {values['shuffled_accuracy']:.4f}, "
        f"quadrant {values['quadrant_accuracy']:.4f}",
        file=sys.stderr,
        flush=True,
    )
    setup = {
        "digits_augment": augment,
        "digits_plateau": dataclasses.asdict(digits_plateau),
        "quadrant_plateau": dataclasses.asdict(quadrant_plateau),
        "bias_lr_scale": options.bias_lr_scale,
        "splits": {
            "train": len(digits_train),
            "validation": len(digits_validation),
            "test": len(digits_test),
            "quadrant_train": len(quad_train),
            "quadrant_validation": len(quad_validation),
            "quadrant_test": len(quad_test),
        },
        "permutation": context.permutation.tolist(),
    }
    fits = {"digits": common.fit_summary(digits_fit), "quadrants": common.fit_summary(fitted)}
    return common.unit_record(NAME, arm, seed, options.quick, setup, values, fits, {"parameters": parameters})


def main(argv=None):
    options = parse_args(argv)
    started = time.time()
    seeds = common.setup(options)
    if options.merge:
        results = common.merged(options.merge)
        results["summary"], results["verdicts"] = summarise(results["runs"])
        common.write(options.output_dir, NAME, results, figure(results), markdown(results))
        return 0
    context = Context(options)
    records = [run_unit(options, arm, seed, context) for seed, arm in itertools.product(seeds, ARMS)]
    results = report(records, common.command(NAME, argv), common.environment(started))
    if context.accelerator.is_main_process:
        common.write(options.output_dir, NAME, results, figure(results), markdown(results))
    return 0


def report(records, command, environment):
    """The results dict (setup, runs, summary, verdicts) from finished unit records, one per (arm, seed)."""
    setup, runs = common.gather(records, ARMS, KEYS)
    digits_plateau, quadrant_plateau = (common.Plateau(**setup[k]) for k in ("digits_plateau", "quadrant_plateau"))
    splits = setup["splits"]
    parameters = {r["arm"]: r["parameters"] for r in records}
    results = {
        "name": NAME,
        "quick": records[0]["quick"],
        "command": command,
        "setup": {
            "model": f"main-command preset `default` with `{common.VIT_OVERRIDES}`: 7 x 7 patches, 4 heads, mean "
            f"pooling, no [CLS]; {parameters} parameters by type",
            "rope": f"`{common.fields_text(ROTARY_FIELDS)}`: DINOv3's rotation of every block's queries and keys "
            "(patch centres in [-1, 1], periods from base 100, halves paired), no table, no augmentation of its "
            "coordinates",
            "recipe": "the main command's embedded recipe (AdamW lr 2e-3, cosine with 5% warmup, weight decay 0.05, "
            f"label smoothing 0.1, batch 64), in epochs; digits augmentation: {setup.get('digits_augment', 'none')} "
            "(the main command's for these digits: small rotations and shifts), none for the quadrant task",
            "plateau": f"digits: {digits_plateau.text()}; quadrant task: the same with patience "
            f"{quadrant_plateau.patience}, {100 * quadrant_plateau.min_delta:.1f} points, at least "
            f"{quadrant_plateau.min_epochs} and at most {quadrant_plateau.max_epochs} epochs",
            "relative_2d": f"bias tables start at zero (BEiT) and get {setup['bias_lr_scale']:g} x the learning rate: "
            "AdamW moves an entry by about its learning rate per update, so at the base rate a zero "
            "bias could not travel further than about 1.6 in this schedule",
            "digits": f"{splits['train']} train / {splits['validation']} validation / {splits['test']} test of "
            "the 5,000 embedded MNIST digits (fixed stratified splits, seed 0)",
            "quadrant_task": f"{splits['quadrant_train']} train / {splits['quadrant_validation']} validation / "
            f"{splits['quadrant_test']} test scikit-learn digits on a {CANVAS} x {CANVAS} canvas (fixed splits, seed 0)",
            "comparisons": "fixed before any run: "
            + ", ".join(f"{a} vs {b}" for a, b in EQUALITY_PAIRS)
            + f" for equality within {100 * EQUALITY_MARGIN:.1f} points; {NONE_REFERENCE} vs none "
            "for the cost of no position embedding",
            **setup,
            "test_images": splits["test"],
        },
        "runs": runs,
        "minutes_per_run": common.minutes_per_run(records),
    }
    results["summary"], verdicts = summarise(runs)
    common.decide(results, verdicts, runs)
    results["environment"] = environment
    return results


def summarise(runs):
    summary = {
        kind: {
            key: dict(zip(("mean", "std"), common.mean_std(runs[kind][key])))
            for key in ("accuracy", "validation_accuracy", "shuffled_accuracy", "quadrant_accuracy", "updates")
        }
        for kind in ARMS
    }
    for kind in ARMS:
        summary[kind]["vs_learned"] = common.paired(runs, kind, REFERENCE)

    pairs = {f"{a} vs {b}": common.paired(runs, a, b) for a, b in EQUALITY_PAIRS}
    outcomes = {name: common.equivalence(diff, EQUALITY_MARGIN) for name, diff in pairs.items()}
    smallest = max(common.resolvable_margin(diff) for diff in pairs.values())
    if all(o == "equivalent" for o in outcomes.values()):
        equal = f"holds: every pair's 95% interval lies within ±{100 * EQUALITY_MARGIN:.1f} points"
    elif any(o == "different" for o in outcomes.values()):
        equal = (
            "does not hold at this scale: "
            + ", ".join(n for n, o in outcomes.items() if o == "different")
            + f" differ by more than {100 * EQUALITY_MARGIN:.1f} points (95% interval outside the margin)"
        )
    else:
        equal = (
            f"not resolved: ±{100 * EQUALITY_MARGIN:.1f} points is finer than these seeds can resolve; the "
            f"intervals would show equality only within ±{100 * smallest:.2f} points"
            + (
                ""
                if any(o == "different" for o in outcomes.values())
                else " (and no pair is shown to differ by more than 0.2)"
            )
        )
    measured_equal = "; ".join(f"{name}: {common.interval_text(diff)}" for name, diff in pairs.items())

    gap = common.paired(runs, NONE_REFERENCE, "none")
    lo, hi = 100 * gap["low"], 100 * gap["high"]
    if gap["low"] > PAPER_NONE_GAP:
        worse = (
            f"`none` is worse than {NONE_REFERENCE}, by more than the paper's 3 points (interval {lo:.2f} to "
            f"{hi:.2f}); on digits a set of strokes carries less of the class than on ImageNet, so the gap's "
            "size is not the paper's"
        )
    elif gap["high"] < PAPER_NONE_GAP and gap["low"] > 0:
        worse = f"`none` is worse than {NONE_REFERENCE}, by less than 3 points (interval {lo:.2f} to {hi:.2f})"
    elif gap["high"] <= 0:
        worse = f"does not hold: `none` is not worse than {NONE_REFERENCE} (interval {lo:.2f} to {hi:.2f})"
    else:
        worse = f"consistent with about 3 points: the interval {lo:.2f} to {hi:.2f} contains 3"

    changed = runs["none"]["changed_predictions"]
    drops = {k: summary[k]["accuracy"]["mean"] - summary[k]["shuffled_accuracy"]["mean"] for k in ARMS}
    shuffle = (
        f"`none`: {sum(changed)} predictions changed under the fixed patch shuffle (exactly invariant, max logit "
        f"change {max(runs['none']['max_logit_change']):.1e}); the others lose "
        + ", ".join(f"{k} {100 * drops[k]:.1f}" for k in ARMS if positional(k))
        + " points"
    )
    quadrant = ", ".join(f"{k} {100 * summary[k]['quadrant_accuracy']['mean']:.1f}%" for k in ARMS)
    bias = runs["relative_2d"]["max_abs_bias"], runs["relative_2d"]["quadrant_max_abs_bias"]
    quadrant += (
        (
            f"; relative_2d max |bias| {min(bias[0]):.2f}-{max(bias[0]):.2f} (digits), "
            f"{min(bias[1]):.2f}-{max(bias[1]):.2f} (quadrants)"
        )
        if bias[0] and bias[0][0] is not None
        else ""
    )

    scores = [s for s in runs["learned"]["stripe_score"] if s is not None]
    stripes = common.paired_difference(scores, [0.0] * len(scores))
    if not scores:
        stripe_verdict, stripe_measured = "not measured: the grid has no equal-distance pairs", "n/a"
    else:
        stripe_measured = (
            f"stripe score of the trained learned 1D tables {stripes['difference']:.3f} "
            + (
                f"(95% CI {stripes['low']:.3f} to {stripes['high']:.3f}, {len(scores)} seeds); "
                if len(scores) > 1
                else "(one seed: no interval yet); "
            )
            + ", ".join(
                f"{k} {np.mean(runs[k]['stripe_score']):.3f}"
                for k in STRIPE_TYPES[1:]
                if None not in runs[k]["stripe_score"] and runs[k]["stripe_score"]
            )
            + f"; a table that depends on distance only: {distance_only_stripe():.1e} (the reference zero)"
        )
        stripe_verdict = (
            "holds: rows and columns stand out (interval above 0)"
            if stripes["low"] > 0
            else "does not hold: the interval reaches 0 or below"
            if stripes["high"] <= 0
            else "not resolved: the interval contains 0"
        )
    verdicts = [
        {
            "claim": "1D, 2D and relative position embeddings reach the same accuracy (within 0.2%)",
            "measured": measured_equal,
            "verdict": equal,
        },
        {
            "claim": f"no position embedding costs about 3 points (paper D.4; measured against {NONE_REFERENCE}, the "
            "paper's 1D table)",
            "measured": f"{NONE_REFERENCE} - none: {common.interval_text(gap)}",
            "verdict": worse,
        },
        {
            "claim": "learned 1D position tables show the grid's rows and columns as stripes (paper Figure 7)",
            "measured": stripe_measured,
            "verdict": stripe_verdict,
        },
        {
            "claim": "control (a): shuffling the patches cannot change a model without position embedding",
            "measured": shuffle,
            "verdict": "holds" if sum(changed) == 0 else "violated",
        },
        {
            "claim": "control (b): on a task whose label is a position, `none` stays at chance (25%) and the others do not",
            "measured": quadrant,
            "verdict": quadrant_verdict(summary, [k for k in ARMS if positional(k)]),
        },
        rotary_verdict(runs, ROTARY_ARM, REFERENCE, EQUALITY_MARGIN),
    ]
    return summary, verdicts


def figure(results):
    return accuracy_figure(results, ARMS)


def markdown(results):
    summary, runs = results["summary"], results["runs"]
    lines = [
        common.header(
            "Position embeddings (ViT from First Principles, section 3; paper appendix D.4)",
            results,
            "1D, 2D and relative position embeddings perform about the same (within 0.2%); "
            "no position embedding is clearly worse (about 3 points in the paper); learned 1D tables "
            "show rows and columns as stripes.",
        )
    ]
    lines += ["## Setup", ""] + [f"- {k}: {v}" for k, v in results["setup"].items() if isinstance(v, str)]
    lines += [
        f"- seeds: {runs['none']['seeds']}; every arm on the same seeds and splits, so differences are paired "
        "by seed; the test split is evaluated once per run, after the checkpoint is chosen on validation",
        "",
    ]
    lines += [
        "## Results",
        "",
        "| position_embedding_type | test accuracy (%) | validation (%) | updates (best) | "
        "stopped by | vs learned, paired (points, 95% CI) | shuffled patches (%) | changed predictions | "
        "quadrant task (%) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k in ARMS:
        s, r = summary[k], runs[k]
        vs = s["vs_learned"]
        lines.append(
            f"| {k} | {common.pct(s['accuracy']['mean'])} ± {common.pct(s['accuracy']['std'])} | "
            f"{common.pct(s['validation_accuracy']['mean'])} ± {common.pct(s['validation_accuracy']['std'])} | "
            f"{', '.join(f'{u} ({b})' for u, b in zip(r['updates'], r['best_updates']))} | "
            f"{', '.join(r['stopped_by'])} | "
            + ("—" if k == REFERENCE else common.interval_cell(vs))
            + f" | {common.pct(s['shuffled_accuracy']['mean'])} ± {common.pct(s['shuffled_accuracy']['std'])} | "
            f"{', '.join(map(str, r['changed_predictions']))} of {results['setup']['test_images']} | "
            f"{common.pct(s['quadrant_accuracy']['mean'])} ± {common.pct(s['quadrant_accuracy']['std'])} |"
        )
    seconds = [t for k in ARMS for t in runs[k]["train_seconds"]]
    lines += [
        "",
        '± is the standard deviation over seeds. "vs learned" is the mean of the per-seed differences '
        "with its 95% t interval. Updates: run (at the best-validation checkpoint). "
        f"Training time per digits run: {min(seconds) / 60:.1f}-{max(seconds) / 60:.1f} min.",
        "",
        "## Verdicts",
        "",
    ]
    lines += [f"- **{v['claim']}** — {v['verdict']}. Measured: {v['measured']}." for v in results["verdicts"]]
    spreads = [100 * summary[k]["accuracy"]["std"] for k in ARMS if positional(k)]
    lines += [
        "",
        "## What this small setting can and cannot show",
        "",
        "A 7 x 7 grid of 28 x 28 digits, a 0.14M-parameter model and 3,400 training images, each arm trained "
        "to its validation plateau. The seed-to-seed spread of the position arms is "
        f"{min(spreads):.2f}-{max(spreads):.2f} points (standard deviation); the paired intervals above say "
        "which differences these seeds resolve and which they do not. Digits are recognisable from their set "
        "of strokes alone, which is why `none` gets far on them; the two controls show that the position "
        "information itself is learned and used where the task needs it. On a 7 x 7 grid the stripe score "
        "rests on the one distance (5 patches) where axis-aligned and diagonal offsets are exactly equally "
        "far apart; nothing here speaks for ImageNet scale.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
