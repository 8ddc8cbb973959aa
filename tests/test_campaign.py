"""scripts/experiments/campaign.py: units that resume exactly, records that add up, pages built from them.

Tiny --quick-sized units only: what is checked is the bookkeeping (resume, skip, pooling, "not yet decided"),
never accuracy.
"""

import json
import os
from pathlib import Path

import pytest
import torch

from scripts.experiments import campaign, common, position_embeddings
from tests.utils import tiny_config

TIMING = set(common.TIMING_KEYS)


def without_timing(value):
    """A record with its measured seconds and minutes (and where it ran) left out: everything else must match."""
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k not in TIMING and k != "environment"}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


class Interrupted(BaseException):
    """What the end of a session does to a unit: not an error the runner may catch and go on from."""


def interrupt_epoch(monkeypatch, at_call):
    """Make `loop.train_epoch` raise on its `at_call`-th call, as the end of a session would stop a unit."""
    from hubvit.training import loop

    real, calls = loop.train_epoch, []

    def train_epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise Interrupted
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "train_epoch", train_epoch)
    return calls


def count_epochs(monkeypatch):
    from hubvit.training import loop

    real, calls = loop.train_epoch, []

    def train_epoch(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "train_epoch", train_epoch)
    return calls


@pytest.fixture(autouse=True)
def loaders_in_the_test_process():
    """The experiments' runs read batches in a loader process; here in the test process (tests/conftest.py says
    why a test process must not fork). The batches are the same. Kept apart from the tests' own monkeypatch, which
    some undo part way."""
    real = common.training_args
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            common,
            "training_args",
            lambda output_dir, seed, **options: real(output_dir, seed, **{"dataloader_num_workers": 0, **options}),
        )
        yield


@pytest.fixture(scope="module")
def digits():
    common.setup_quietly(1)
    return common.digits_train_validation_test(quick=True)


def fit(digits, tmp_path, checkpoint, eval_every=1):
    train, validation, _ = digits
    args = common.training_args(tmp_path / "out", 0, augment="none")
    model, preprocessing = common.build_vit(args, train.features["label"].names, {"position_embedding_type": "learned"})
    plateau = common.Plateau(max_epochs=3, patience=1, min_delta=0.0, min_epochs=3)
    accelerator = common.accelerator_for(tmp_path / "out")
    return common.fit_to_plateau(
        accelerator, args, train, validation, model, preprocessing, plateau, None, checkpoint, eval_every
    )


@pytest.mark.heavy
@pytest.mark.parametrize("eval_every", [1, 2])
def test_a_fit_interrupted_after_an_epoch_resumes_to_the_same_weights_and_record(
    digits, tmp_path, monkeypatch, eval_every
):
    whole, whole_record = fit(digits, tmp_path, None, eval_every)
    checkpoint = tmp_path / "state" / "digits.pt"
    interrupt_epoch(monkeypatch, at_call=3)
    with pytest.raises(Interrupted):
        fit(digits, tmp_path, checkpoint, eval_every)
    assert common.load_checkpoint(checkpoint)["epoch"] == 2
    monkeypatch.undo()
    calls = count_epochs(monkeypatch)
    resumed, resumed_record = fit(digits, tmp_path, checkpoint, eval_every)
    assert len(calls) == 1  # only the third epoch was trained again
    assert without_timing(resumed_record) == without_timing(whole_record)
    assert len(whole_record["validation_history"]) == {1: 3, 2: 2}[eval_every]  # every 2nd epoch and the last
    assert whole_record["epochs"] == 3
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert common.load_checkpoint(checkpoint)["finished"]
    calls.clear()
    again, again_record = fit(digits, tmp_path, checkpoint, eval_every)  # a finished fit is not trained again
    assert calls == [] and again_record == resumed_record


@pytest.mark.heavy
def test_training_images_kept_in_memory_are_batched_without_a_loader_process(digits, tmp_path):
    """A loader process would only copy tensors already in memory; the run asked for one."""
    import multiprocessing

    train, _, _ = digits
    args = common.training_args(tmp_path / "out", 3, augment="none", dataloader_num_workers=1)
    model, preprocessing = common.build_vit(args, train.features["label"].names, {"position_embedding_type": "none"})
    run = common.prepare_run(args, common.accelerator_for(tmp_path / "out"), train, model, preprocessing)
    assert common.keep_in_memory(run, train, preprocessing, (28, 28))
    batches = iter(run.train_loader)
    next(batches)
    assert multiprocessing.active_children() == []


@pytest.mark.heavy
def test_training_images_kept_in_memory_give_the_loaders_batches(digits, tmp_path):
    train, _, _ = digits
    args = common.training_args(tmp_path / "out", 3, augment="none")
    model, preprocessing = common.build_vit(args, train.features["label"].names, {"position_embedding_type": "none"})
    accelerator = common.accelerator_for(tmp_path / "out")
    run = common.prepare_run(args, accelerator, train, model, preprocessing)
    for epoch in (0, 1):
        run.train_set.set_epoch(epoch)
        run.train_loader.set_epoch(epoch)
        if epoch == 0:
            decoded = list(run.train_loader)
        else:
            decoded_1 = list(run.train_loader)
    assert common.keep_in_memory(run, train, preprocessing, (28, 28))
    for epoch, expected in ((0, decoded), (1, decoded_1)):
        run.train_set.set_epoch(epoch)
        run.train_loader.set_epoch(epoch)
        batches = list(run.train_loader)
        assert len(batches) == len(expected)
        for (pixels, labels), (want_pixels, want_labels) in zip(batches, expected):
            assert torch.equal(pixels, want_pixels) and torch.equal(labels, want_labels)
    assert not torch.equal(decoded[0][1], decoded_1[0][1])  # the epochs are shuffled differently


def campaign_argv(tmp_path, *extra):
    return [
        "--quick",
        "--seeds",
        "2",
        "--threads",
        "1",
        "--runs_dir",
        str(tmp_path / "runs"),
        "--checkpoints_dir",
        str(tmp_path / "checkpoints"),
        "--output_dir",
        str(tmp_path / "docs"),
        *extra,
    ]


@pytest.mark.heavy
def test_a_unit_stopped_in_its_second_fit_resumes_to_the_same_record(tmp_path, monkeypatch):
    only = ["--only", "position_embeddings:sincos_2d:1"]
    assert campaign.main(["run", *campaign_argv(tmp_path / "whole", *only)]) == 0
    whole = json.loads((tmp_path / "whole/runs/position_embeddings/sincos_2d-seed1.json").read_text())
    interrupt_epoch(monkeypatch, at_call=2)  # the quadrant fit's first epoch, after the digits fit finished
    with pytest.raises(Interrupted):
        campaign.main(["run", *campaign_argv(tmp_path / "cut", *only)])
    assert not (tmp_path / "cut/runs/position_embeddings/sincos_2d-seed1.json").exists()
    assert (tmp_path / "cut/checkpoints/position_embeddings/sincos_2d-seed1/digits.pt").is_file()
    monkeypatch.undo()
    calls = count_epochs(monkeypatch)
    assert campaign.main(["run", *campaign_argv(tmp_path / "cut", *only)]) == 0
    assert len(calls) == 1  # the digits fit was finished: only the quadrant fit trains
    resumed = json.loads((tmp_path / "cut/runs/position_embeddings/sincos_2d-seed1.json").read_text())
    assert without_timing(resumed) == without_timing(whole) and resumed["values"]["accuracy"] > 0
    assert not (tmp_path / "cut/checkpoints/position_embeddings/sincos_2d-seed1").exists()


def test_report_builds_every_page_from_the_runs_committed_so_far(tmp_path):
    """The records in docs/experiments/runs/, whatever shape each experiment's runs take (per model, per unit, one
    model): every experiment with a run for each arm gets its page, with its seeds per arm stated."""
    runs = Path(__file__).resolve().parents[1] / "docs" / "experiments" / "runs"
    ready = [name for name in campaign.EXPERIMENTS if not campaign.missing_arms(runs, name)]
    assert ready, "no experiment has a committed run for every arm yet"
    assert campaign.main(["report", "--runs_dir", str(runs), "--output_dir", str(tmp_path)]) == 0
    for name in ready:
        page = (tmp_path / f"{name}.md").read_text()
        assert f"campaign runs** (`docs/experiments/runs/{name}/`" in page and " of 5 seeds" in page, name
    if "attention_distance" in ready:  # a run ended by the cap is not at a plateau: the page counts them
        records = campaign.load_records(runs, "attention_distance")
        capped = sum(r["values"]["stopped_by"] == "cap" for r in records)
        page = (tmp_path / "attention_distance.md").read_text()
        assert f"{capped} of {len(records)} runs stopped at the cap of 20 epochs" in page


def validation_accuracies(value):
    """Every per-run number stored under a `validation_accuracy` key, at any depth of a results dict (not the
    {mean, std} summaries)."""
    if isinstance(value, dict):
        found = []
        for key, inner in value.items():
            if key == "validation_accuracy" and not isinstance(inner, dict):
                found += inner if isinstance(inner, list) else [inner]
            else:
                found += validation_accuracies(inner)
        return found
    if isinstance(value, list):
        return [v for item in value for v in validation_accuracies(item)]
    return []


def test_every_results_file_keeps_each_runs_validation_accuracy(tmp_path):
    """Each unit's fit chose its checkpoint on validation; the results file the page is built from keeps that
    accuracy for every unit (at least one per record), so the pooled files say what each seed was stopped on."""
    runs = Path(__file__).resolve().parents[1] / "docs" / "experiments" / "runs"
    assert campaign.main(["report", "--runs_dir", str(runs), "--output_dir", str(tmp_path)]) == 0
    for name in campaign.EXPERIMENTS:
        if campaign.missing_arms(runs, name):
            continue
        results = json.loads((tmp_path / f"{name}.json").read_text())
        found = validation_accuracies(results)
        assert len(found) >= len(campaign.load_records(runs, name)), name
        assert all(0.0 <= v <= 1.0 for v in found), name


def patch_results(random_minus_native, random_seeds=(0, 1, 2)):
    """Patch-size results at one size (P=7, also the base): native accuracies of seeds 0-3, the random-P model's
    for `random_seeds`, each `random_minus_native[seed]` away from native's at the same seed."""
    native = {0: 0.90, 1: 0.92, 2: 0.94, 3: 0.50}
    random = [native[s] + random_minus_native[s] for s in random_seeds]
    runs = {"native": {"7": list(native.values())}, "random": {"7": random}, "pi": {}, "interpolate": {}}
    seeds = {"native": {"7": list(native)}, "random": {"7": list(random_seeds)}, "pi": {}, "interpolate": {}}
    return {"runs": runs, "run_seeds": seeds, "patch_sizes": [7], "base_patch": 7}


def test_the_random_patch_size_model_is_capped_at_the_native_cap_times_the_number_of_sizes(tmp_path, monkeypatch):
    """It trains on each of the 3 sizes for about a third of its updates: with the native cap it stopped at the cap
    in every seed, still improving (docs/experiments/patch_size.md), so its cap is 3 times the native one."""
    from scripts.experiments import patch_size

    caps = {}

    class Stop(Exception):
        pass

    def fit_to_plateau(accelerator, args, train, validation, model, preprocessing, plateau, *rest, **kwargs):
        caps[model.config.patch_size] = plateau.max_epochs
        raise Stop

    monkeypatch.setattr(common, "fit_to_plateau", fit_to_plateau)
    options = patch_size.parse_args(["--output_dir", str(tmp_path), "--max_epochs", "30"])
    context = patch_size.Context(options)
    for arm in ("native-7", "random"):
        with pytest.raises(Stop):
            patch_size.run_unit(options, arm, 0, context)
    assert caps == {7: 30, 14: 90}  # the random-P model stores its kernel at the largest size


def test_flexivit_verdict_pairs_the_random_model_with_native_by_seed():
    """Seed 3 ran natively only (at 50%): pairing by seed leaves it out, so a random-P model 0.1-0.3 points
    below native at every shared seed lies within a point; 5 points below is not within it."""
    from scripts.experiments import patch_size

    close = patch_size.verdicts(patch_results({0: -0.001, 1: -0.003, 2: -0.002}))[0]
    assert close["verdict"].startswith("holds") and "3 paired seeds" in close["measured"], close
    far = patch_size.verdicts(patch_results({0: -0.05, 1: -0.051, 2: -0.049}))[0]
    assert far["verdict"].startswith("does not hold") and "-5.00 points" in far["measured"], far
    spread = patch_size.verdicts(patch_results({0: 0.02, 1: -0.04, 2: 0.01}))[0]
    assert spread["verdict"].startswith("not resolved"), spread


def test_queue_is_seed_major_and_covers_every_arm_and_seed():
    units = campaign.queue(seeds=5, experiments=["position_embeddings"])
    arms = position_embeddings.ARMS
    assert len(units) == len(set(units)) == 5 * len(arms)
    assert [u[2] for u in units] == sorted(u[2] for u in units)
    assert [u[1] for u in units[: len(arms)]] == arms
    assert campaign.selected(units, ["position_embeddings:none"]) == [u for u in units if u[1] == "none"]


def test_a_lock_is_held_while_its_process_runs_and_taken_over_after(tmp_path):
    lock = tmp_path / "unit.lock"
    assert campaign.claim(lock)
    assert not campaign.claim(lock)  # held by this (running) process
    lock.write_text(json.dumps({"pid": os.getpid(), "start": "not this process's start"}))
    assert campaign.claim(lock)  # the pid was reused by another process: the lock is stale


def test_verdicts_say_not_yet_decided_while_an_arm_has_fewer_than_five_seeds():
    verdicts = [{"claim": "c", "measured": "m", "verdict": "holds"}]
    five = {"a": {"seeds": [0, 1, 2, 3, 4]}, "b": {"seeds": [0, 1, 2, 3, 4]}}
    assert common.undecided(verdicts, five) == verdicts
    short = common.undecided(verdicts, {**five, "b": {"seeds": [0, 1]}})
    assert short[0]["verdict"].startswith("not yet decided") and "b 2" in short[0]["verdict"]
    assert "holds" in short[0]["verdict"] and "a 5" not in short[0]["verdict"]


def test_an_arm_with_one_seed_states_no_interval_rather_than_an_infinite_one():
    verdicts = [{"claim": "c", "measured": "m", "verdict": "the interval -inf to inf contains 3"}]
    single = common.undecided(verdicts, {"a": {"seeds": [0]}, "b": {"seeds": [0, 1]}})
    assert (
        single[0]["verdict"]
        == "not yet decided (seeds of 5 so far: a 1, b 2); an arm with one seed has no interval yet"
    )


def test_the_estimate_of_what_is_left_times_each_unit_by_its_own_arms_latest_run():
    def record(arm, seed, minutes):
        return {"arm": arm, "seed": seed, "minutes": minutes, "environment": {"torch_threads": 1}}

    records = [record("slow", 1, 40.0), record("slow", 0, 60.0), record("fast", 0, 5.0), record("fast", 1, 7.0)]
    left = [("x", "slow", 2), ("x", "fast", 2), ("x", "untimed", 0)]
    # slow as its seed 1 (40), fast as its seed 1 (7), the arm with no run at the experiment's median (of 5, 7, 40,
    # 60: 23.5)
    assert campaign.minutes_left(records, left) == pytest.approx(40.0 + 7.0 + 23.5)


@pytest.mark.heavy
def test_campaign_runs_skips_finished_units_and_reports_from_the_records(tmp_path, capsys):
    argv = campaign_argv(tmp_path, "--only", "position_embeddings")
    assert campaign.main(["run", *argv, "--max_units", str(len(position_embeddings.ARMS))]) == 0
    runs = tmp_path / "runs" / "position_embeddings"
    assert sorted(p.name for p in runs.iterdir()) == sorted(f"{arm}-seed0.json" for arm in position_embeddings.ARMS)
    stamps = {p.name: p.stat().st_mtime_ns for p in runs.iterdir()}

    capsys.readouterr()
    assert campaign.main(["status", *argv]) == 0
    status = capsys.readouterr().out
    arms = len(position_embeddings.ARMS)
    assert f"position_embeddings: {arms} done / {arms} remaining" in status and "min per run" in status

    assert campaign.main(["report", *argv]) == 0
    results = json.loads((tmp_path / "docs" / "position_embeddings.json").read_text())
    assert all(r["seeds"] == [0] for r in results["runs"].values())
    assert all(v["verdict"].startswith("not yet decided") for v in results["verdicts"])
    assert results["minutes_per_run"]["runs"] == arms
    page = (tmp_path / "docs" / "position_embeddings.md").read_text()
    assert "1 of 5 seeds" in page
    readme = (tmp_path / "docs" / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| [Position")]
    assert rows and all("not yet decided" in row and "short schedule" not in row for row in rows)

    assert campaign.main(["run", *argv, "--only", "position_embeddings:none:0"]) == 0  # finished: skipped
    assert {p.name: p.stat().st_mtime_ns for p in runs.iterdir()} == stamps


def test_a_failing_unit_is_reported_and_the_runner_goes_on(tmp_path, monkeypatch, capsys):
    ran = []

    def run_one(options, unit, contexts):
        ran.append(unit)
        if unit[1] == "none":
            raise RuntimeError("broken unit")
        common.write_json_atomically(campaign.record_path(options.runs_dir, unit), {"minutes": 0.0})
        return {"minutes": 0.0}

    monkeypatch.setattr(campaign, "run_one", run_one)
    argv = campaign_argv(tmp_path, "--only", "position_embeddings:none:0", "position_embeddings:learned:0")
    assert campaign.main(["run", *argv]) == 1
    assert ran == [("position_embeddings", "none", 0), ("position_embeddings", "learned", 0)]
    assert "FAILED" in capsys.readouterr().err
    assert not list((tmp_path / "checkpoints" / "locks").iterdir())


def test_summary_marks_short_schedule_rows_only_for_results_not_built_from_the_campaign(tmp_path):
    from scripts.experiments import summary

    verdict = [{"claim": "c", "measured": "m", "verdict": "v"}]
    old = {"runs": {"native": {"4": [0.5]}}, "environment": {"wall_time_s": 1.0}}
    new = {"runs": {"native": {"4": [0.5]}}, "environment": {"units": 4}}
    for name, results in (("patch_size", old), ("resolution", new)):
        body = dict(results, name=name, quick=False, command=f"python {name}", verdicts=verdict)
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    assert summary.main(["--output_dir", str(tmp_path)]) == 0
    rows = {line.split("]")[0]: line for line in (tmp_path / "README.md").read_text().splitlines() if "| [" in line}
    assert "short schedule" in rows["| [One checkpoint at any patch size (FlexiViT; section 5)"]
    assert "short schedule" not in rows["| [Resolution change (section 5)"]


def test_summary_speaks_of_the_short_schedule_only_while_a_row_comes_from_it(tmp_path):
    from scripts.experiments import summary

    verdict = [{"claim": "c", "measured": "m", "verdict": "v"}]
    campaign_built = {"runs": {"model": {"seeds": [0]}}, "environment": {"units": 1}, "verdicts": verdict}
    (tmp_path / "resolution.json").write_text(json.dumps(dict(campaign_built, quick=False, command="c")))
    assert summary.main(["--output_dir", str(tmp_path)]) == 0
    assert "short schedule" not in (tmp_path / "README.md").read_text()
    older = {"runs": {"native": {"4": [0.5]}}, "environment": {"wall_time_s": 1.0}, "verdicts": verdict}
    (tmp_path / "patch_size.json").write_text(json.dumps(dict(older, quick=False, command="c")))
    assert summary.main(["--output_dir", str(tmp_path)]) == 0
    introduction = (tmp_path / "README.md").read_text().split("| experiment |")[0]
    assert "rows marked *short schedule*" in introduction and common.SCHEDULE_NOTE in introduction


def test_precision_probe_times_both_precisions_on_copies_of_one_model():
    from hubvit import HubViTForImageClassification
    from scripts.experiments import schedule_probe

    config = tiny_config(image_size=8, patch_size=4, hidden_size=8, intermediate_size=16, num_hidden_layers=1)
    model = HubViTForImageClassification(config).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    measured = schedule_probe.compare_precisions(model, 8, steps=1, rounds=2)
    assert len(measured["float32"]) == len(measured["bfloat16"]) == 2
    assert all(t > 0 for t in measured["float32"] + measured["bfloat16"]) and measured["isa"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the steps trained copies
