"""scripts/recipe_elements.py: one element changed per arm, paired differences with a 95% t interval."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "recipe_elements.py"


@pytest.fixture(scope="module")
def elements():
    spec = importlib.util.spec_from_file_location("recipe_elements", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs(*accuracies, first_seed=0):
    return [{"seed": first_seed + i, "eval_accuracy": a, "wall_time_s": 60.0} for i, a in enumerate(accuracies)]


def test_the_paired_difference_is_the_mean_over_shared_seeds_with_a_t_interval(elements):
    """Differences 0.01, 0.02, 0.03: mean 0.02, sd 0.01, half-width t(0.975, 2) * 0.01 / sqrt(3) = 0.024844."""
    base = runs(0.95, 0.96, 0.94, 0.90)  # seed 3 has no partner in the arm and is left out
    arm = runs(0.96, 0.98, 0.97)
    difference = elements.paired_difference(arm, base)
    assert difference["seeds"] == 3
    assert difference["mean"] == pytest.approx(0.02, abs=1e-12)
    assert difference["high"] - difference["mean"] == pytest.approx(4.302653 * 0.01 / 3**0.5, rel=1e-4)
    assert difference["mean"] - difference["low"] == pytest.approx(difference["high"] - difference["mean"])


def test_one_shared_seed_gives_no_interval(elements):
    assert elements.paired_difference(runs(0.97), runs(0.96)) is None


def test_each_arm_changes_one_flag_of_the_pinned_former_default(elements):
    base_flags = dict(zip(elements.BASE[::2], elements.BASE[1::2]))
    for name, (_, flags) in elements.ARMS.items():
        added = dict(zip(flags[::2], flags[1::2]))
        assert len(added) == (0 if name == "base" else 1), name
        changed = [flag for flag, value in added.items() if base_flags.get(flag) != value]
        assert len(changed) == len(added), f"{name}: {added} repeats the base recipe"


def test_an_unknown_arm_is_refused_naming_it(elements, tmp_path, capsys):
    with pytest.raises(SystemExit):
        elements.main(["--arms", "base,warp_drive", "--json", str(tmp_path / "out.json")])
    assert "unknown arm(s) warp_drive" in capsys.readouterr().err


def test_the_ema_arm_is_judged_by_its_average_not_by_the_trained_weights_it_shares_with_base(elements, tmp_path):
    base = runs(0.95, 0.96)
    ema = [dict(run, ema_eval_accuracy=run["eval_accuracy"] + 0.01) for run in base]
    report = {"arms": {"base": {"change": "", "runs": base}, "ema": {"change": "", "runs": ema}}}
    elements.write(report, tmp_path / "out.json")
    assert report["arms"]["ema"]["summary"]["accuracies"] == [0.96, 0.97]
    assert report["arms"]["ema"]["vs_base"]["mean"] == pytest.approx(0.01)
