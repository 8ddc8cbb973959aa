"""Experiment 1 (design document section 3; ViT paper appendix D.4): does the kind of position embedding matter?

The same small ViT (4-px patches: a 7 x 7 grid on the 28 x 28 digits) is trained by the main command's loop with
each `position_embedding_type`, several seeds each. Two controls make "spatial arrangement matters" measurable:
(a) every model is evaluated on the test digits with their patches shuffled by one fixed permutation, which cannot
change what the `none` model predicts (it sees a set of patches); (b) a task whose label *is* a position (which
quadrant of a blank 32 x 32 canvas holds a scikit-learn digit), on which `none` cannot beat chance.

    accelerate launch scripts/experiments/position_embeddings.py          # default run, writes docs/experiments/
    python scripts/experiments/position_embeddings.py --quick --output_dir /tmp/pe --models_dir /tmp/pe/models
"""

import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hubvit.scripts.experiments import common  # noqa: E402

NAME = "position_embeddings"
TYPES = ["none", "learned", "learned_2d", "relative_2d", "sincos_2d"]
CLAIMED_EQUAL = ["learned", "learned_2d", "relative_2d"]  # the paper's 1D, 2D and relative embeddings
QUADRANTS = ["top-left", "top-right", "bottom-left", "bottom-right"]
PATCH = 4
CANVAS, DIGIT, SLACK = 32, 12, 4  # quadrants of 16 px = 4 patches; a 12-px digit at an offset of 0..4 px inside


def fixed_permutation(num_patches, seed=0):
    """One fixed shuffle of the patch grid (never the identity)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        permutation = torch.randperm(num_patches, generator=generator)
        if not torch.equal(permutation, torch.arange(num_patches)):
            return permutation


def permute_patches(pixels, patch_size, permutation):
    """Images (B, C, H, W) whose P x P patches are moved: output patch i is input patch `permutation[i]`."""
    b, c, h, w = pixels.shape
    gh, gw = h // patch_size, w // patch_size
    patches = pixels.reshape(b, c, gh, patch_size, gw, patch_size).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c, patch_size, patch_size)
    patches = patches[:, permutation]
    return patches.reshape(b, gh, gw, c, patch_size, patch_size).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def quadrant_digits(quick=False):
    """scikit-learn's 1,797 8 x 8 digits, each enlarged to 12 px and pasted into one quadrant of a blank canvas.

    The label is the quadrant. The quadrant, and the offset inside it, are drawn independently of the digit; the
    quadrants are whole patches and the offsets the same in each, so a model blind to patch positions sees the same
    set of patches whichever quadrant holds the digit, and cannot do better than chance (25%).
    """
    import datasets
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits().images
    rng = np.random.default_rng(0)
    quadrant = rng.integers(0, 4, len(digits))
    offsets = rng.integers(0, SLACK + 1, (len(digits), 2))
    images = []
    for image, q, (oy, ox) in zip(digits, quadrant, offsets):
        small = Image.fromarray((image * 255 / 16).astype(np.uint8), mode="L").resize((DIGIT, DIGIT), Image.BILINEAR)
        canvas = np.zeros((CANVAS, CANVAS), dtype=np.uint8)
        top, left = (q // 2) * CANVAS // 2 + oy, (q % 2) * CANVAS // 2 + ox
        canvas[top : top + DIGIT, left : left + DIGIT] = np.asarray(small)
        images.append(Image.fromarray(canvas, mode="L"))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=QUADRANTS)})
    data = datasets.Dataset.from_dict({"image": images, "label": quadrant.astype(np.int64)}, features=features)
    parts = data.train_test_split(test_size=0.2, seed=0, stratify_by_column="label")
    train, test = parts["train"], parts["test"]
    if quick:
        train, test = train.select(range(200)), test.select(range(100))
    return train, test


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models_dir", default=str(common.ROOT / "runs" / NAME),
                   help="where the trained digit models are saved (attention_distance.py reads them)")
    p.add_argument("--steps", type=int, default=400, help="optimizer updates per digits run (batch 64)")
    p.add_argument("--quadrant_steps", type=int, default=100, help="optimizer updates per quadrant-task run")
    return p.parse_args(argv)


def main(argv=None):
    options = parse_args(argv)
    started = time.time()
    seeds = common.setup(options)
    if options.merge:
        results = common.merged(options.merge)
        results["summary"], results["verdicts"] = summarise(results["runs"])
        common.write(options.output_dir, NAME, results, figure(results), markdown(results))
        return 0
    accelerator = common.accelerator_for(options.output_dir)
    steps = 3 if options.quick else options.steps
    quadrant_steps = 3 if options.quick else options.quadrant_steps
    digits_train, digits_test = common.digits_splits(options.quick)
    quad_train, quad_test = quadrant_digits(options.quick)
    permutation = fixed_permutation((28 // PATCH) ** 2)
    runs = {kind: {"seeds": [], "accuracy": [], "shuffled_accuracy": [], "changed_predictions": [],
                   "max_logit_change": [], "quadrant_accuracy": []} for kind in TYPES}
    test_pixels = test_labels = quad_pixels = quad_labels = None
    parameters = {}
    for seed, kind in itertools.product(seeds, TYPES):
        fields = {"position_embedding_type": kind}
        args = common.training_args(options.output_dir, seed, max_train_steps=steps, augment="none")
        model, preprocessing = common.build_vit(args, digits_train.features["label"].names, fields)
        parameters[kind] = sum(p.numel() for p in model.parameters())
        if test_pixels is None:
            test_pixels, test_labels = common.eval_tensors(digits_test, preprocessing, (28, 28))
            shuffled = permute_patches(test_pixels, PATCH, permutation)
        model, fitted = common.fit(accelerator, args, digits_train, digits_test, model, preprocessing)
        logits, shuffled_logits = common.predict(model, test_pixels), common.predict(model, shuffled)
        record = runs[kind]
        record["seeds"].append(seed)
        record["accuracy"].append(common.accuracy(logits, test_labels))
        record["shuffled_accuracy"].append(common.accuracy(shuffled_logits, test_labels))
        record["changed_predictions"].append(int((logits.argmax(-1) != shuffled_logits.argmax(-1)).sum()))
        record["max_logit_change"].append(float((logits - shuffled_logits).abs().max()))
        if accelerator.is_main_process:
            model.save_pretrained(Path(options.models_dir) / f"{kind}-seed{seed}")

        args = common.training_args(options.output_dir, seed, max_train_steps=quadrant_steps, image_size=CANVAS,
                                    augment="none")
        model, preprocessing = common.build_vit(args, QUADRANTS, fields)
        if quad_pixels is None:
            quad_pixels, quad_labels = common.eval_tensors(quad_test, preprocessing, (CANVAS, CANVAS))
        model, _ = common.fit(accelerator, args, quad_train, quad_test, model, preprocessing)
        record["quadrant_accuracy"].append(common.accuracy(common.predict(model, quad_pixels), quad_labels))
        print(f"{kind} seed {seed}: digits {record['accuracy'][-1]:.4f}, shuffled {record['shuffled_accuracy'][-1]:.4f}"
              f", quadrant {record['quadrant_accuracy'][-1]:.4f}", file=sys.stderr, flush=True)

    results = {
        "name": NAME,
        "quick": options.quick,
        "command": common.command(NAME),
        "setup": {
            "model": f"main-command preset `default` with `{common.VIT_OVERRIDES}`: 7 x 7 patches, 4 heads, mean "
                     f"pooling, no [CLS]; {parameters} parameters by type",
            "recipe": f"the main command's embedded recipe (AdamW lr 2e-3, cosine with 5% warmup, weight decay 0.05, "
                      f"label smoothing 0.1, batch 64) without augmentation; {steps} updates on the digits, "
                      f"{quadrant_steps} on the quadrant task",
            "digits": f"{len(digits_train)} train / {len(digits_test)} test of the 5,000 embedded MNIST digits "
                      "(fixed stratified split, seed 0)",
            "quadrant_task": f"{len(quad_train)} train / {len(quad_test)} test scikit-learn digits on a {CANVAS} x "
                             f"{CANVAS} canvas (fixed split, seed 0)",
            "test_images": len(digits_test),
            "permutation": permutation.tolist(),
        },
        "runs": runs,
    }
    results["summary"], results["verdicts"] = summarise(runs)
    results["environment"] = common.environment(started)
    if accelerator.is_main_process:
        common.write(options.output_dir, NAME, results, figure(results), markdown(results))
    return 0


def summarise(runs):
    summary = {kind: {key: dict(zip(("mean", "std"), common.mean_std(runs[kind][key])))
                      for key in ("accuracy", "shuffled_accuracy", "quadrant_accuracy")} for kind in TYPES}
    for kind in TYPES:
        gap, se = common.difference(runs[kind]["accuracy"], runs["learned"]["accuracy"])
        summary[kind]["vs_learned"] = {"difference": gap, "standard_error": se}

    pairs = [(a, b, *common.difference(runs[a]["accuracy"], runs[b]["accuracy"]))
             for a, b in itertools.combinations(CLAIMED_EQUAL, 2)]
    a, b, gap, se = max(pairs, key=lambda row: abs(row[2]))
    gap, se = abs(gap) * 100, se * 100
    if gap > 0.2 and gap > 2 * se:
        equal = f"does not hold at this scale: {a} vs {b} differ by {gap:.2f} points (2 SE {2 * se:.2f})"
    elif 2 * se >= 0.2 and gap <= 2 * se:
        equal = (f"not resolved at this scale: largest gap {gap:.2f} points ({a} vs {b}) is within the seed noise "
                 f"(2 SE {2 * se:.2f} points, wider than the claimed 0.2)")
    else:
        equal = f"holds: largest gap {gap:.2f} points ({a} vs {b}), 2 SE {2 * se:.2f}"

    best = max((k for k in TYPES if k != "none"), key=lambda k: summary[k]["accuracy"]["mean"])
    none_gap, none_se = (100 * x for x in common.difference(runs[best]["accuracy"], runs["none"]["accuracy"]))
    if none_gap - 2 * none_se > 3:
        worse = f"`none` is {none_gap:.2f} ± {2 * none_se:.2f} points below {best}: more than 3 points worse"
    elif none_gap + 2 * none_se < 3:
        worse = (f"`none` is {none_gap:.2f} ± {2 * none_se:.2f} points below {best}: within 3 points "
                 "(on 7 x 7 digits the gap is smaller than the paper's)")
    else:
        worse = f"`none` is {none_gap:.2f} ± {2 * none_se:.2f} points below {best}: not resolved against 3 points"

    changed = runs["none"]["changed_predictions"]
    drops = {k: summary[k]["accuracy"]["mean"] - summary[k]["shuffled_accuracy"]["mean"] for k in TYPES}
    shuffle = (f"`none`: {sum(changed)} predictions changed under the fixed patch shuffle (exactly invariant, max logit "
               f"change {max(runs['none']['max_logit_change']):.1e}); the others lose "
               + ", ".join(f"{k} {100 * drops[k]:.1f}" for k in TYPES if k != "none") + " points")
    quadrant = ", ".join(f"{k} {100 * summary[k]['quadrant_accuracy']['mean']:.1f}%" for k in TYPES)
    verdicts = [
        {"claim": "1D, 2D and relative position embeddings reach the same accuracy (within 0.2%)",
         "measured": ", ".join(f"{k} {100 * summary[k]['accuracy']['mean']:.2f} ± {100 * summary[k]['accuracy']['std']:.2f}%"
                               for k in TYPES), "verdict": equal},
        {"claim": "no position embedding costs about 3 points (paper D.4)", "measured": f"gap to {best}: "
         f"{none_gap:.2f} ± {2 * none_se:.2f} points (2 SE)", "verdict": worse},
        {"claim": "control (a): shuffling the patches cannot change a model without position embedding",
         "measured": shuffle, "verdict": "holds" if sum(changed) == 0 else "violated"},
        {"claim": "control (b): on a task whose label is a position, `none` stays at chance (25%) and the others do not",
         "measured": quadrant, "verdict": quadrant_verdict(summary)},
    ]
    return summary, verdicts


def quadrant_verdict(summary, margin=0.1):
    """`none` within `margin` of chance, every other type above chance + `margin`."""
    none_at_chance = abs(summary["none"]["quadrant_accuracy"]["mean"] - 0.25) < margin
    above = [k for k in TYPES if k != "none" and summary[k]["quadrant_accuracy"]["mean"] > 0.25 + margin]
    stuck = [k for k in TYPES if k != "none" and k not in above]
    if not none_at_chance:
        return "does not hold: `none` is not at chance"
    if not stuck:
        return "holds"
    return (f"half holds: `none` stays at chance; above chance: {', '.join(above) or 'none of the others'}; still at "
            f"chance within this schedule: {', '.join(stuck)} (their position tables or biases start near zero and "
            "must be learned; the fixed sin-cos table needs no learning)")


def figure(results):
    plt = common.pyplot()
    runs, summary = results["runs"], results["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    x = np.arange(len(TYPES))
    for ax, key, title in zip(axes, ("accuracy", "shuffled_accuracy", "quadrant_accuracy"),
                              ("digits (test)", "digits, patches shuffled (fixed permutation)",
                               "quadrant task (label = position)")):
        means = [100 * summary[k][key]["mean"] for k in TYPES]
        stds = [100 * summary[k][key]["std"] for k in TYPES]
        ax.bar(x, means, yerr=stds, color="#9ecae1", capsize=4)
        for i, k in enumerate(TYPES):
            ax.scatter([i] * len(runs[k][key]), [100 * v for v in runs[k][key]], color="k", s=10, zorder=3)
        if key == "quadrant_accuracy":
            ax.axhline(25, color="r", ls="--", lw=1, label="chance")
            ax.legend(loc="lower right")
        ax.set_xticks(x, TYPES, rotation=30)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("accuracy (%)")
    for ax in axes:
        ax.set_ylim(0, 100)
    fig.suptitle("Position embedding types: mean ± std over seeds (dots: seeds)")
    fig.tight_layout()
    return fig


def markdown(results):
    summary, runs = results["summary"], results["runs"]
    lines = [common.header("Position embeddings (design document section 3; paper appendix D.4)", results,
                           "1D, 2D and relative position embeddings perform about the same (within 0.2%); "
                           "no position embedding is clearly worse (about 3 points in the paper).")]
    lines += ["## Setup", ""] + [f"- {k}: {v}" for k, v in results["setup"].items() if k not in ("permutation", "test_images")]
    lines += [f"- seeds: {runs['none']['seeds']}; the same fixed test split for every run; no tuning on it", ""]
    lines += ["## Results", "", "| position_embedding_type | digits accuracy (%) | vs learned (points) | "
              "shuffled patches (%) | changed predictions | quadrant task (%) |", "|---|---|---|---|---|---|"]
    for k in TYPES:
        s = summary[k]
        lines.append(f"| {k} | {common.pct(s['accuracy']['mean'])} ± {common.pct(s['accuracy']['std'])} | "
                     f"{100 * s['vs_learned']['difference']:+.2f} ± {200 * s['vs_learned']['standard_error']:.2f} | "
                     f"{common.pct(s['shuffled_accuracy']['mean'])} ± {common.pct(s['shuffled_accuracy']['std'])} | "
                     f"{', '.join(map(str, runs[k]['changed_predictions']))} of {results['setup']['test_images']} | {common.pct(s['quadrant_accuracy']['mean'])} ± "
                     f"{common.pct(s['quadrant_accuracy']['std'])} |")
    lines += ["", "± is the standard deviation over seeds; the \"vs learned\" column gives the mean difference ± 2 "
              "standard errors.", "", "## Verdicts", ""]
    lines += [f"- **{v['claim']}** — {v['verdict']}. Measured: {v['measured']}." for v in results["verdicts"]]
    lines += ["", "## What this small setting can and cannot show", "",
              "A 7 x 7 grid of 28 x 28 digits, a 0.14M-parameter model, a few thousand training images and a short schedule: the seed-to-"
              "seed spread is of the order of the 0.2-point differences the claim is about, so only large effects are "
              "resolved. Digits are recognisable from their set of strokes alone, which is why `none` gets far on "
              "them; the two controls show that the position information itself is learned and used where the task "
              "needs it.", "", common.SCHEDULE_NOTE]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
