"""A folder written today loads and computes the same numbers under every transformers release users run.

Each release in `transformers_releases.RELEASES` (plus the installed one) gets its own folder in the tests' cache; a
child interpreter with that folder first on its path and hubvit hidden loads the folders written by the installed
hubvit with `trust_remote_code=True`, as a user pulling them from the Hub would, and writes every output
(`compatibility_child.outputs`). The same function runs here on the installed hubvit's own classes.

Tolerance: 1e-5 relative to each output's largest magnitude (float32 rounding). Every release runs the same
PyTorch kernels on the same weights, so the outputs are expected to be identical; the margin covers a release whose
attention wrapper reorders one operation.

The other direction: tests/fixtures/earlier-2026-12-03 holds folders written by the hubvit of that day
(tests/fixtures/make_earlier_folders.py, run once) with their inputs and outputs; today's hubvit loads them and gives
the same numbers, so a config field added since must default to the behaviour those folders were written with.

With HUBVIT_COMPATIBILITY_RECORD=path.json the rows (release, Python, torch, what passed) are written there, which is
what docs/compatibility.md's table is rendered from (tests/compatibility_table.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from safetensors.torch import load_file, save_file

from compatibility_child import SELECTION, WRONG_TYPES, config_facts, outputs
from hubvit import HubViTConfig, HubViTForImageClassification, HubViTModel
from hubvit.folder import write_folder
from transformers_releases import RELEASES, ensure_optimum, ensure_release
from utils import SAM_PARTS, randomize_, tiny_config

TOLERANCE = 1e-5
CONFIGS = {
    "plain": dict(num_labels=3),
    "relative-registers-layerscale-mean": dict(
        num_labels=3,
        position_embedding_type="relative_2d",
        num_register_tokens=2,
        layer_scale_init_value=0.1,
        pooling="mean",
    ),
    "modern-components": dict(
        num_labels=3,
        position_embedding_type="relative_2d_class",
        rope_type="dinov3",
        mlp_type="gated",
        hidden_act="silu",
        mlp_inner_norm=True,
        attention_inner_norm=True,
        norm_type="rms_norm",
        key_bias=False,
        qkv_fused=False,
        qk_norm=True,
        num_key_value_heads=[2, 4],
        patch_norm=True,
    ),
    "sam-windows-neck": dict(num_labels=3, **SAM_PARTS),
}
INSTALLED = "installed"
RECORD = []


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Folders written by the installed hubvit (the paper's block, and one with the modern families' components), an input at a non-native size, a 32x32 image (the processor's
    size, so no release's resize touches it) and what the installed hubvit computes for them."""
    root = tmp_path_factory.mktemp("compatibility")
    x = torch.randn(2, 3, 40, 24, generator=torch.Generator().manual_seed(0))
    save_file({"pixel_values": x}, root / "inputs.safetensors")
    image = root / "image.png"
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype("uint8")).save(image)
    from transformers import pipeline

    made = {}
    for name, overrides in CONFIGS.items():
        model = randomize_(HubViTForImageClassification(tiny_config(**overrides)), seed=3).eval()
        folder = write_folder(model, root / name)
        expected, absent = outputs(HubViTForImageClassification, HubViTModel, str(folder), x)
        answer = pipeline("image-classification", model=str(folder))(str(image))
        made[name] = dict(folder=folder, expected=expected, absent=absent, pipeline=answer)
    yield root, made
    if os.environ.get("HUBVIT_COMPATIBILITY_RECORD"):
        Path(os.environ["HUBVIT_COMPATIBILITY_RECORD"]).write_text(json.dumps(RECORD, indent=2) + "\n")


@pytest.fixture(scope="module")
def runs(folders):
    """{release: (what the child saw, {folder name: its outputs})}, each release run once for both folders."""
    root, made = folders
    cache = {}

    def run(release):
        if release not in cache:
            cache[release] = run_release(release, root, {name: entry["folder"] for name, entry in made.items()})
        return cache[release]

    return run


def run_release(release, root, named_folders):
    out = {name: str(root / f"{name}-{release}.safetensors") for name in named_folders}
    request = dict(
        folders={name: str(folder) for name, folder in named_folders.items()},
        inputs=str(root / "inputs.safetensors"),
        image=str(root / "image.png"),
        out=out,
        release_path=None if release == INSTALLED else str(ensure_release(release)),
    )
    path = root / f"request-{release}.json"
    path.write_text(json.dumps(request))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("PYTHONPATH", None)
    child = Path(__file__).with_name("compatibility_child.py")
    result = subprocess.run(
        [sys.executable, str(child), str(path)], cwd=root, env=env, capture_output=True, text=True, timeout=900
    )
    if result.returncode != 0:
        raise AssertionError(f"transformers {release} could not load or run the folders:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1]), {name: load_file(file) for name, file in out.items()}


def assert_same(actual, expected, what):
    scale = expected.abs().max().clamp_min(1e-12)
    difference = (actual - expected).abs().max()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert difference <= TOLERANCE * scale, f"{what}: max |difference| {difference:.3g} > {TOLERANCE} x {scale:.3g}"
    return float(difference / scale)


@pytest.mark.heavy
@pytest.mark.parametrize("release", [*RELEASES, INSTALLED])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_folder_written_today_gives_the_same_outputs_under_the_release(folders, runs, release, name):
    entry = folders[1][name]
    child, every = runs(release)
    seen, actual, expected = {**child, **child["folders"][name]}, every[name], entry["expected"]

    if release == INSTALLED:
        assert seen["transformers"] == transformers.__version__
    else:
        assert seen["transformers"] == release and seen["transformers_path"].startswith(str(ensure_release(release)))
    assert seen["config_class"].startswith("transformers_modules."), "must run the code copied into the folder"
    assert not any(seen["loading_info"].get(key) for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert sorted(actual) == sorted(expected), "the same outputs, hidden states and attentions exist"
    worst = max(assert_same(actual[key], expected[key], f"{release} {key}") for key in expected)
    assert seen["absent"] == entry["absent"] == {"sdpa": [False, True, False], "eager": [False, True, False]}, SELECTION
    assert [row["label"] for row in seen["pipeline"]] == [row["label"] for row in entry["pipeline"]]
    for theirs, ours in zip(seen["pipeline"], entry["pipeline"]):
        assert abs(theirs["score"] - ours["score"]) <= TOLERANCE
    assert seen["pipeline_needs_image_processor"] == (release == "4.46.3")
    expected_warnings = 1 if release == "4.46.3" else 0  # one message, once per folder's module
    assert len(set(seen["warnings"])) == expected_warnings, seen["warnings"]
    RECORD.append(
        dict(
            release=seen["transformers"],
            installed=release == INSTALLED,
            config=name,
            python=seen["python"],
            torch=seen["torch"],
            outputs=len(expected),
            worst_relative_difference=worst,
            pipeline_needs_image_processor=seen["pipeline_needs_image_processor"],
            warnings=sorted(set(seen["warnings"])),
        )
    )


@pytest.mark.heavy
@pytest.mark.parametrize("release", [*RELEASES, INSTALLED])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_config_saved_here_loads_with_every_field_equal_under_the_release(folders, runs, release, name):
    """The folder's config.json is written by the installed release (5.25, where a dataclass config may leave out
    default-valued keys): it holds every declared field, and each release's copy of the folder's config class reads
    the same values, follows a changed depth the same way and refuses wrong types with the same messages."""
    folder = folders[1][name]["folder"]
    written = json.loads((folder / "config.json").read_text())
    declared = [field.lstrip("_") for field in HubViTConfig.__annotations__]
    assert [field for field in declared if field not in written] == []
    expected = config_facts(HubViTConfig, folder)
    assert expected["fields"] == {field: written[field] for field in declared}
    assert all(message and field in message for field, message in expected["refused"].items()), expected["refused"]
    seen = runs(release)[0]["folders"][name]["config"]
    assert seen == expected
    assert sorted(seen["refused"]) == sorted(WRONG_TYPES)


# transformers 4.46 to 5.0's `create_and_test_config_common_properties` builds `Config(hidden_size=0)`, which
# hubvit refuses by design (a zero-width model; the error names the field and the value); 5.10 dropped that check
# when transformers' own configs began validating their fields.
ZERO_WIDTH = {"create_and_test_config_common_properties": "ValueError: hidden_size must be a positive int, got 0"}
ZERO_WIDTH_RELEASES = ("4.46.3", "4.57.6", "5.0.0")


@pytest.mark.heavy
@pytest.mark.parametrize("release", [*RELEASES, INSTALLED])
def test_the_releases_own_config_tester_passes_on_the_config_loaded_as_remote_code(runs, release):
    """transformers' `ConfigTester.run_common_tests()` from the release's own source distribution, run by that
    release on the config class copied into a folder, and each of its checks alone; the common arguments include
    `is_encoder_decoder`."""
    tester = runs(release)[0]["config_tester"]
    failing = {name: error for name, error in tester["checks"].items() if error is not None}
    assert failing == (ZERO_WIDTH if release in ZERO_WIDTH_RELEASES else {})
    assert (tester["run_common_tests"] is None) == (release not in ZERO_WIDTH_RELEASES), tester["run_common_tests"]
    assert "check_config_arguments_init" in tester["checks"] and len(tester["checks"]) >= 8
    assert "is_encoder_decoder" in tester["common_kwargs"] and "return_dict" in tester["common_kwargs"]


EARLIER = Path(__file__).parent / "fixtures" / "earlier-2026-12-03"


@pytest.mark.parametrize("name", sorted(path.name for path in EARLIER.iterdir() if path.is_dir()))
def test_a_folder_written_by_an_earlier_hubvit_loads_and_gives_its_recorded_outputs(name):
    folder = EARLIER / name
    written = json.loads((folder / "written_by.json").read_text())
    _, info = HubViTForImageClassification.from_pretrained(str(folder), output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    x = load_file(folder / "inputs.safetensors")["pixel_values"]
    actual, absent = outputs(HubViTForImageClassification, HubViTModel, str(folder), x)
    expected = load_file(folder / "expected.safetensors")
    assert sorted(actual) == sorted(expected)
    for key in expected:
        assert_same(actual[key], expected[key], f"{name} {key} (written by hubvit {written['hubvit']})")
    assert absent == written["absent"]


OPTIMUM_EXPORT = """
import sys
sys.modules["hubvit"] = None
sys.path.insert(0, sys.argv[1])
from optimum.commands.optimum_cli import main
sys.argv = ["optimum-cli", "export", "onnx", "--model", sys.argv[2], "--trust-remote-code",
            "--task", "image-classification", sys.argv[3]]
main()
"""


@pytest.mark.heavy
def test_optimum_cli_exports_a_folder_that_runs_in_onnxruntime_at_any_size(folders):
    """optimum pins transformers 4.57 and exports with TorchScript's tracer; the folder's code tells optimum's task
    manager to treat hubvit as its ViT. The graph is held to the installed hubvit at 1e-4 (the exporter's contract)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    root, made = folders
    folder, out = made["relative-registers-layerscale-mean"]["folder"], root / "optimum"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    result = subprocess.run(
        [sys.executable, "-c", OPTIMUM_EXPORT, str(ensure_optimum()), str(folder), str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    model = HubViTForImageClassification.from_pretrained(str(folder)).eval()
    for height, width in ((32, 32), (40, 24), (48, 56)):
        x = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(height * width))
        with torch.no_grad():
            expected = model(x).logits
        actual = torch.from_numpy(session.run(["logits"], {"pixel_values": x.numpy()})[0])
        assert actual.shape == expected.shape
        assert (actual - expected).abs().max() <= 1e-4 * expected.abs().max(), (height, width)
