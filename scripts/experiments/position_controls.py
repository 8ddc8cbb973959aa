"""The two controls of the position-embedding experiment (position_embeddings.py), which make "spatial arrangement
matters" measurable: (a) one fixed shuffle of the patch grid, which cannot change what a model without position
embedding predicts (it sees a set of patches); (b) a task whose label *is* a position (which quadrant of a blank
canvas holds a digit), on which such a model cannot beat chance.
"""

import numpy as np
import torch


QUADRANTS = ["top-left", "top-right", "bottom-left", "bottom-right"]
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
    patches = (
        pixels.reshape(b, c, gh, patch_size, gw, patch_size)
        .permute(0, 2, 4, 1, 3, 5)
        .reshape(b, gh * gw, c, patch_size, patch_size)
    )
    patches = patches[:, permutation]
    return patches.reshape(b, gh, gw, c, patch_size, patch_size).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def quadrant_digits(quick=False):
    """scikit-learn's 1,797 8 x 8 digits, each enlarged to 12 px and pasted into one quadrant of a blank canvas;
    (train, validation, test), 64/16/20%, stratified, seed 0.

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
    parts = train.train_test_split(test_size=0.2, seed=0, stratify_by_column="label")
    train, validation = parts["train"], parts["test"]
    if quick:
        train, validation, test = train.select(range(200)), validation.select(range(60)), test.select(range(100))
    return train, validation, test


def quadrant_verdict(summary, positional, margin=0.1):
    """Control (b)'s verdict: `none` within `margin` of chance, every arm of `positional` (those that tell the
    model where a patch is) above chance + `margin`."""
    none_at_chance = abs(summary["none"]["quadrant_accuracy"]["mean"] - 0.25) < margin
    above = [k for k in positional if summary[k]["quadrant_accuracy"]["mean"] > 0.25 + margin]
    stuck = [k for k in positional if k not in above]
    if not none_at_chance:
        return "does not hold: `none` is not at chance"
    if not stuck:
        return "holds"
    return (
        f"half holds: `none` stays at chance; above chance: {', '.join(above) or 'none of the others'}; still at "
        f"chance within this schedule: {', '.join(stuck)} (their position tables or biases start near zero and "
        "must be learned; the fixed sin-cos table needs no learning)"
    )


def accuracy_figure(results, types):
    """Test, shuffled-patch and quadrant-task accuracy per position type: bars of the mean, dots per seed."""
    from scripts.experiments import common

    plt = common.pyplot()
    runs, summary = results["runs"], results["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    x = np.arange(len(types))
    for ax, key, title in zip(
        axes,
        ("accuracy", "shuffled_accuracy", "quadrant_accuracy"),
        ("digits (test)", "digits, patches shuffled (fixed permutation)", "quadrant task (label = position)"),
    ):
        means = [100 * summary[k][key]["mean"] for k in types]
        stds = [100 * summary[k][key]["std"] for k in types]
        ax.bar(x, means, yerr=stds, color="#9ecae1", capsize=4)
        for i, k in enumerate(types):
            ax.scatter([i] * len(runs[k][key]), [100 * v for v in runs[k][key]], color="k", s=10, zorder=3)
        if key == "quadrant_accuracy":
            ax.axhline(25, color="r", ls="--", lw=1, label="chance")
            ax.legend(loc="lower right")
        ax.set_xticks(x, types, rotation=30)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("accuracy (%)")
    for ax in axes:
        ax.set_ylim(0, 100)
    fig.suptitle("Position embedding types: mean ± std over seeds (dots: seeds)")
    fig.tight_layout()
    return fig


def distance_only_stripe(grid=(7, 7)):
    """The stripe score of a table that depends on distance only, on the experiment's grid: the reference zero."""
    from hubvit.analysis import position

    return position.stripe_score(position.cosine_similarity_grid(position.distance_only_table(grid), grid))


def bias_magnitude(model):
    """Largest |bias| over the relative_2d tables of every block (None without them)."""
    from hubvit.analysis.attention import body

    tables = [getattr(layer.attention, "relative_position_bias", None) for layer in body(model).encoder.layers]
    values = [table.detach().abs().max().item() for table in tables if table is not None]
    return max(values) if values else None


def stripe(model):
    """The stripe score of the model's position table, or of its rotation where it has no table (the rotary arm:
    fixed by DINOv3's frequencies, so the same at every seed)."""
    from hubvit.analysis import position

    table = position.position_table(model)
    table = position.rotary_table(model) if table is None else table
    grid = tuple(model.config.grid_size)
    return position.stripe_score(position.cosine_similarity_grid(table, grid)) if table is not None else None


def rotary_verdict(runs, arm, reference, margin):
    """The rotary arm against the paper's default, on the same margin and the same paired interval as the
    equality claim; with the rotation's stripe score (fixed by its frequencies) beside the learned table's."""
    from scripts.experiments import common

    diff = common.paired(runs, arm, reference)
    outcome = common.equivalence(diff, margin)
    if outcome == "equivalent":
        verdict = f"holds: the 95% interval lies within ±{100 * margin:.1f} points"
    elif outcome == "different":
        better = "better" if diff["low"] > 0 else "worse"
        verdict = (
            f"does not hold: the rotation does {better} than the learned table by more than {100 * margin:.1f} points"
        )
    else:
        verdict = (
            f"not resolved at ±{100 * margin:.1f} points: these seeds show equality only within "
            f"±{100 * common.resolvable_margin(diff):.2f}"
            + ("" if diff["high"] < 0 or diff["low"] > 0 else " (and show no difference either)")
            + ("; the rotation is worse (interval below 0)" if diff["high"] < 0 else "")
            + ("; the rotation is better (interval above 0)" if diff["low"] > 0 else "")
        )
    scores = [s for s in runs[arm]["stripe_score"] if s is not None]
    stripes = f"; stripe score of the rotation {scores[0]:.3f} (fixed by its frequencies)" if scores else ""
    return {
        "claim": "a rotary embedding (DINOv3's, no table) reaches the learned 1D table's accuracy (within 0.2%)",
        "measured": f"{arm} - {reference}: {common.interval_text(diff)}{stripes}",
        "verdict": verdict,
    }
