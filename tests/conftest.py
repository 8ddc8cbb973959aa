"""Shared pytest fixtures for the hubvit tests."""

import sys
from pathlib import Path

# The checkout's own scripts (scripts.experiments, scripts.render_docs) are not part of the installed package: the
# tests import them from the repository root, whichever way pytest was started.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# `hub_server`: a local fake of the Hugging Face Hub HTTP API with the client pointed at it (tests/hub_server.py).
try:  # noqa: E402
    from hub_server import hub_server  # noqa: F401
except ImportError:  # tests/ imported as a package
    from tests.hub_server import hub_server  # noqa: F401

import os  # noqa: E402

import pytest  # noqa: E402


def decline_openvino_telemetry():
    """`import openvino` starts OpenVINO's converter, which sends usage statistics to Google Analytics unless the
    user has declined (a consent file in the home folder) or CI=true, from a process it forks off a background
    thread. Tests reach no network, and a fork of a pytest-xdist worker is no place for a web request: declined here
    for every test process (subprocesses that may import openvino get `utils.NO_OPENVINO_TELEMETRY`)."""
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return
    OptInChecker.check = lambda self, *args, **kwargs: ConsentCheckResult.DECLINED


decline_openvino_telemetry()


@pytest.fixture
def converter_bug(monkeypatch):
    """Every converted model gets one weight off by 1e-3 of its scale, as a subtle mapping bug would; the check
    against the source library at conversion must catch it."""
    import torch

    import hubvit.conversion.folder as writer

    build = writer.build_model

    def off_by_a_little(config, state_dict):
        model = build(config, state_dict)
        with torch.no_grad():
            model.hubvit.norm.bias.add_(1e-3 * model.hubvit.norm.bias.abs().max())
        return model

    monkeypatch.setattr(writer, "build_model", off_by_a_little)


# The test files that take longest (seconds summed over their tests, from `pytest --junitxml` on the 2-core CI
# machine, 2026-12-06), longest first. pytest-xdist hands whole files (`--dist loadfile`) to whichever worker is free,
# in collection order; starting with the longest keeps one long file from being the last thing a worker runs while
# the other sits idle. Files not named keep their usual order after these.
LONGEST_FILES = (
    "test_benchmark.py",
    "test_finetune.py",
    "test_compatibility.py",
    "test_experiments.py",
    "test_export.py",
    "test_streaming_once.py",
    "test_reliability_training.py",
    "test_backbone.py",
    "test_campaign.py",
    "test_reliability.py",
    "test_convert_jax.py",
    "test_hub_push.py",
    "test_streaming.py",
    "test_finetune_fsdp.py",
    "test_publish.py",
    "test_multinode.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session", autouse=True)
def library_baseline():
    """transformers' and datasets' verbosity and torch's thread count as the worker started, taken before any
    module-scoped fixture runs (the experiments' `setup_quietly` in one changes all three)."""
    import datasets
    import torch
    import transformers

    return transformers.logging.get_verbosity(), datasets.utils.logging.get_verbosity(), torch.get_num_threads()


@pytest.fixture(autouse=True)
def library_verbosity_restored(library_baseline):
    """Scripts run in-process (the experiments' `main(argv)`) quiet transformers and datasets for their command
    line and pin torch's threads; a later test in the same worker that reads transformers' log (its own
    ModelTesterMixin does) must see the verbosity the worker started with, and run on its threads."""
    import datasets
    import torch
    import transformers

    yield
    verbosity, datasets_verbosity, threads = library_baseline
    transformers.logging.set_verbosity(verbosity)
    datasets.utils.logging.set_verbosity(datasets_verbosity)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


# Forks of this test process, newest last: (test id, where it forked). A test process of pytest-xdist talks to its
# controller from a thread of its own; a copy of it made by `fork` (a DataLoader worker, a multiprocessing pool) cut
# that conversation off in about half of the full runs ("node down: Not properly terminated", at some later
# subprocess call of whichever test ran then), and with the worker gone the whole run stops. Code that forks runs in
# a fresh interpreter (`subprocess`, which execs at once and is fine) or with `dataloader_num_workers=0`.
FORKS = []


def _record_fork():
    import traceback

    FORKS.append("".join(traceback.format_stack(limit=12)[:-1]))


os.register_at_fork(before=_record_fork)


@pytest.fixture(autouse=True)
def no_fork_of_the_test_process(request):
    before = len(FORKS)
    yield
    if len(FORKS) > before:
        pytest.fail(
            f"{request.node.nodeid} forked the test process {len(FORKS) - before} time(s); run the forking code in a "
            f"subprocess or with dataloader_num_workers=0. The first fork:\n{FORKS[before]}",
            pytrace=False,
        )
