"""scripts/experiments/: the exact invariances the experiments rest on, and the shape of what each writes.

Accuracy is never checked here (the --quick runs train for a few updates); the measured figures live in
docs/experiments/, each with its command.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from hubvit import HubViTConfig, HubViTForImageClassification
from scripts.experiments import (
    attention_distance,
    campaign,
    common,
    inductive_bias,
    position_controls,
    position_embeddings,
    resolution,
    summary,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "OMP_NUM_THREADS": "1",
}


def digit_vit(kind, **fields):
    torch.manual_seed(0)
    config = HubViTConfig(
        image_size=28,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        pooling="mean",
        class_token=False,
        fc_norm=True,
        num_labels=10,
        position_embedding_type=kind,
        **fields,
    )
    model = HubViTForImageClassification(config).eval()
    for name, param in model.named_parameters():  # trained-looking: non-zero position tables, biases and head
        if "position" in name or "classifier" in name:
            param.data.normal_(0, 0.5)
    return model


def test_permute_patches_moves_whole_patches_to_their_new_places():
    pixels = torch.randn(2, 3, 28, 28)
    permutation = position_controls.fixed_permutation(49)
    shuffled = position_controls.permute_patches(pixels, 4, permutation)
    assert not torch.equal(permutation, torch.arange(49))
    for i, source in enumerate(permutation.tolist()):
        (r, c), (sr, sc) = divmod(i, 7), divmod(source, 7)
        assert torch.equal(
            shuffled[..., 4 * r : 4 * r + 4, 4 * c : 4 * c + 4], pixels[..., 4 * sr : 4 * sr + 4, 4 * sc : 4 * sc + 4]
        )


def test_model_without_position_embedding_predicts_the_same_on_shuffled_patches():
    model = digit_vit("none")
    pixels = torch.randn(64, 3, 28, 28)
    shuffled = position_controls.permute_patches(pixels, 4, position_controls.fixed_permutation(49))
    with torch.no_grad():
        logits, shuffled_logits = model(pixel_values=pixels).logits, model(pixel_values=shuffled).logits
    assert logits.argmax(-1).unique().numel() > 1
    assert torch.equal(logits.argmax(-1), shuffled_logits.argmax(-1))
    # Only the summation order changes: float32 round-off relative to the logits' scale.
    assert (logits - shuffled_logits).abs().max() <= 1e-5 * logits.abs().max()


@pytest.mark.parametrize("kind", ["learned", "learned_2d", "relative_2d", "sincos_2d"])
def test_models_with_position_embedding_see_the_shuffle(kind):
    model = digit_vit(kind)
    pixels = torch.randn(8, 3, 28, 28)
    shuffled = position_controls.permute_patches(pixels, 4, position_controls.fixed_permutation(49))
    with torch.no_grad():
        change = (model(pixel_values=pixels).logits - model(pixel_values=shuffled).logits).abs().max()
    assert change > 1e-3


def test_quadrant_canvases_hold_one_digit_inside_the_labelled_quadrant():
    train, _, _ = position_controls.quadrant_digits(quick=True)
    half = position_controls.CANVAS // 2
    for example in train.select(range(40)):
        pixels = np.asarray(example["image"])
        ys, xs = np.nonzero(pixels)
        quadrant = 2 * (ys.min() >= half) + (xs.min() >= half)
        assert quadrant == example["label"]
        assert (ys.max() < half) == (ys.min() < half) and (xs.max() < half) == (xs.min() < half)


def test_paired_interval_is_the_t_interval_of_the_per_seed_differences():
    """Differences 1, 2, 3, 4, 5 (points): mean 3, standard deviation sqrt(2.5), t(4, 0.975) = 2.7764451."""
    a = [0.91, 0.92, 0.93, 0.94, 0.95]
    b = [x - d / 100 for x, d in zip(a, [1, 2, 3, 4, 5])]
    diff = common.paired_difference(a, b)
    half = 2.7764451 * np.sqrt(2.5) / np.sqrt(5) / 100
    assert diff["difference"] == pytest.approx(0.03, abs=1e-12)
    assert (diff["low"], diff["high"]) == pytest.approx((0.03 - half, 0.03 + half), abs=1e-7)


def test_paired_interval_matches_arms_by_seed_not_by_position():
    runs = {
        "a": {"seeds": [0, 1, 2], "accuracy": [0.5, 0.6, 0.7]},
        "b": {"seeds": [2, 0, 1], "accuracy": [0.69, 0.49, 0.59]},
    }
    diff = common.paired(runs, "a", "b")
    assert diff["difference"] == pytest.approx(0.01) and diff["half_width"] == pytest.approx(0.0, abs=1e-12)


def test_one_pair_gives_an_infinite_interval_and_no_verdict():
    diff = common.paired_difference([0.9], [0.8])
    assert diff["half_width"] == float("inf")
    assert common.equivalence(diff, 0.002) == "not resolved"


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (-0.001, 0.0015, "equivalent"),
        (0.0025, 0.01, "different"),
        (-0.004, 0.001, "not resolved"),
        (-0.01, -0.002, "different"),
    ],
)
def test_equivalence_compares_the_whole_interval_with_the_margin(low, high, expected):
    diff = {"difference": (low + high) / 2, "low": low, "high": high, "half_width": (high - low) / 2, "pairs": 5}
    assert common.equivalence(diff, 0.002) == expected


def test_command_records_the_argv_main_was_called_with_not_the_interpreters():
    """From Python, `main(argv)` stands for `python scripts/experiments/NAME.py ARGV`, whatever sys.argv holds."""
    assert common.command("resolution", ["--quick", "--output_dir", Path("/tmp/a b")]) == (
        "python scripts/experiments/resolution.py --quick --output_dir '/tmp/a b'"
    )


def test_plateau_stops_once_the_last_epochs_do_not_beat_the_best_before_them():
    plateau = common.Plateau(max_epochs=30, patience=3, min_delta=0.003, min_epochs=5)
    rising = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    assert not plateau.reached(rising)
    assert not plateau.reached(rising + [0.954, 0.9555])  # +0.0055 within the window: still improving
    assert plateau.reached(rising + [0.952, 0.951, 0.953])  # +0.003 at most: not more than min_delta
    assert not plateau.reached([0.5, 0.5, 0.5, 0.5])  # fewer than min_epochs


def test_validation_is_carved_from_the_training_digits_and_test_is_untouched():
    train, validation, test = common.digits_train_validation_test()
    full_train, full_test = common.digits_splits()
    assert (len(train), len(validation), len(test)) == (3400, 600, 1000)
    assert list(test["label"]) == list(full_test["label"])
    assert sorted([*train["label"], *validation["label"]]) == sorted(full_train["label"])
    assert all(np.bincount(list(validation["label"])) >= 55)  # stratified: about 60 of each digit


def test_mean_attention_distance_matches_a_direct_computation():
    grid, patch = (3, 4), 4
    centres = np.array([(r * patch, c * patch) for r in range(3) for c in range(4)], dtype=float)
    pairwise = cdist(centres, centres)
    n = 12
    uniform = torch.full((2, 1, n + 1, n + 1), 1.0 / (n + 1))  # one prefix token, dropped and renormalised
    attend_self = torch.eye(n)[None, None].expand(2, 1, n, n)
    attend_corner = torch.zeros(1, 1, n, n)
    attend_corner[..., 0] = 1.0
    got = attention_distance.mean_attention_distance([uniform, attend_self, attend_corner], grid, patch)
    assert got.shape == (3, 1)
    np.testing.assert_allclose(got[:, 0], [pairwise.mean(), 0.0, pairwise[:, 0].mean()], rtol=1e-12)
    assert attention_distance.uniform_distance(grid, patch) == pytest.approx(pairwise.mean(), rel=1e-12)


def test_stretched_cls_control_runs_at_the_new_size_and_is_the_identity_at_the_old():
    torch.manual_seed(0)
    config = HubViTConfig(
        image_size=28,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=10,
    )
    model = HubViTForImageClassification(config).eval()
    same = resolution.cls_stretched_with_grid(model, 28)
    torch.testing.assert_close(
        same.hubvit.embeddings.position_embedding, model.hubvit.embeddings.position_embedding, rtol=0, atol=1e-7
    )
    stretched = resolution.cls_stretched_with_grid(model, 56)
    assert stretched.hubvit.embeddings.position_embedding.shape == (1, 1 + 14 * 14, 32)
    assert model.hubvit.embeddings.position_embedding.shape == (1, 1 + 7 * 7, 32)
    with torch.no_grad():
        assert stretched(pixel_values=torch.randn(2, 3, 56, 56)).logits.shape == (2, 10)


def test_cls_in_grid_control_is_the_identity_at_the_old_size_and_moves_every_row_one_cell():
    torch.manual_seed(0)
    config = HubViTConfig(
        image_size=28,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=10,
        interpolation_mode="nearest",
    )
    model = HubViTForImageClassification(config).eval()
    table = model.hubvit.embeddings.position_embedding
    same = resolution.cls_in_grid_2d(model, 28)
    torch.testing.assert_close(same.hubvit.embeddings.position_embedding, table, rtol=0, atol=1e-7)
    moved = resolution.cls_in_grid_2d(model, 56).hubvit.embeddings.position_embedding
    assert moved.shape == (1, 1 + 14 * 14, 32)
    # nearest at twice the size: new cell (r, c) of the 16 x 14 layout holds old cell (r // 2, c // 2) of the 8 x 7
    # layout, whose row-major index is the old table's row ([CLS] = 0).
    for new_index in (0, 1, 14, 15, 100, 196):
        r, c = divmod(new_index, 14)
        torch.testing.assert_close(moved[0, new_index], table[0, (r // 2) * 7 + c // 2], rtol=0, atol=1e-7)


def run_in_one_process(calls, timeout=900):
    """Each experiment's `main(argv)` in turn, in one fresh interpreter, which pays torch's and transformers'
    imports once (about 7 s per script run on its own): `calls` is a list of (module name, argv)."""
    code = (
        "import importlib, sys\n"
        f"for name, argv in {calls!r}:\n"
        "    if importlib.import_module(f'scripts.experiments.{name}').main(argv):\n"
        "        sys.exit(f'{name} failed')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    """Every experiment's --quick run into one folder, then the summary."""
    out = tmp_path_factory.mktemp("experiments")
    common_argv = ["--quick", "--output_dir", str(out)]
    run_in_one_process(
        [
            ("position_embeddings", [*common_argv, "--models_dir", str(out / "models")]),
            ("inductive_bias", common_argv),
            ("resolution", common_argv),
            ("attention_distance", [*common_argv, "--models_dir", str(out / "distance_models")]),
            ("patch_size", common_argv),
            ("native_resolution", common_argv),
            ("summary", ["--output_dir", str(out)]),
        ]
    )
    return out


@pytest.mark.heavy
@pytest.mark.parametrize(
    "name",
    ["position_embeddings", "inductive_bias", "resolution", "attention_distance", "patch_size", "native_resolution"],
)
def test_quick_run_writes_json_figure_and_markdown_with_its_command(quick_results, name):
    results = json.loads((quick_results / f"{name}.json").read_text())
    assert results["name"] == name and results["quick"] is True
    assert results["command"].startswith(f"python scripts/experiments/{name}.py --quick --output_dir ")
    assert results["verdicts"] and all(set(v) == {"claim", "measured", "verdict"} for v in results["verdicts"])
    assert (quick_results / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (quick_results / f"{name}.md").read_text()
    assert results["command"] in text and "Quick run" in text and f"({name}.png)" in text


@pytest.mark.heavy
def test_quick_position_run_records_the_exact_invariance_and_saves_every_model(quick_results):
    runs = json.loads((quick_results / "position_embeddings.json").read_text())["runs"]
    assert runs["none"]["changed_predictions"] == [0]
    assert sorted(p.name for p in (quick_results / "models").iterdir()) == sorted(
        f"{arm}-seed0" for arm in position_embeddings.ARMS
    )


@pytest.mark.heavy
def test_quick_attention_distance_has_one_value_per_layer_and_head(quick_results):
    results = json.loads((quick_results / "attention_distance.json").read_text())
    runs = results["runs"]
    assert sorted(runs) == sorted(position_embeddings.TYPES)
    assert all(np.array(r["distance"]).shape == (1, 4, 4) for r in runs.values())
    assert results["setup"]["grid"] == [7, 7]  # --quick trains at 28 x 28; the default is 56 x 56, a 14 x 14 grid
    assert all(len(r["validation_accuracy"]) == len(r["accuracy"]) == 1 for r in runs.values())


@pytest.mark.heavy
def test_quick_position_run_records_validation_accuracy_and_updates_per_seed(quick_results):
    results = json.loads((quick_results / "position_embeddings.json").read_text())
    assert results["setup"]["splits"]["validation"] > 0
    for record in results["runs"].values():
        assert len(record["seeds"]) == len(record["accuracy"]) == len(record["validation_accuracy"]) == 1
        assert record["updates"][0] >= record["best_updates"][0] > 0
    assert results["runs"]["relative_2d"]["max_abs_bias"][0] > 0


@pytest.mark.heavy
def test_summary_has_one_row_per_verdict_and_marks_quick_runs(quick_results):
    text = (quick_results / "README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    expected = sum(len(json.loads((quick_results / f"{n}.json").read_text())["verdicts"]) for n in summary.EXPERIMENTS)
    assert len(rows) == expected and all("quick run only" in row for row in rows)


@pytest.mark.heavy
def test_quick_patch_size_run_has_every_arm_at_every_size(quick_results):
    results = json.loads((quick_results / "patch_size.json").read_text())
    sizes = [str(p) for p in results["patch_sizes"]]
    assert sorted(results["runs"]) == ["interpolate", "native", "pi", "random"]
    assert all(len(results["runs"][arm][p]) == 1 for arm in results["runs"] for p in sizes)
    base = str(results["base_patch"])  # resized to its own patch size, the base model is itself
    assert results["runs"]["pi"][base] == results["runs"]["interpolate"][base] == results["runs"]["native"][base]


def test_a_subset_run_waits_the_full_data_patience_counted_in_scores():
    """At 5% the ViT is scored once per 20 epochs (a full-data epoch's worth of updates): the cap scales to 20 times
    the epochs, while patience and minimum stay what they are at 100%, counted in those scores."""
    base = inductive_bias.PLATEAU
    plateau = inductive_bias.plateau_for(0.05)
    assert plateau.max_epochs == 20 * base.max_epochs
    scores = [0.08 * i for i in range(base.min_epochs - 1)] + [0.9] * (base.max_epochs - base.min_epochs + 1)
    stopped_after = next(n for n in range(1, len(scores) + 1) if plateau.reached(scores[:n]))
    assert stopped_after == base.min_epochs + base.patience


def test_inductive_bias_page_counts_the_vit_runs_the_cap_stopped():
    records = campaign.load_records(ROOT / "docs" / "experiments" / "runs", "inductive_bias")
    capped = next(r for r in records if r["arm"] == "0.05")
    capped["fits"]["vit"]["stopped_by"] = "cap"
    results = inductive_bias.report(records, "command", campaign.campaign_environment(records))
    assert "stopped by the cap rather than at a validation plateau, by fraction: 5% 1 of 5, 10% 0 of 5" in (
        inductive_bias.markdown(results)
    )
