"""benchmarks/benchmark.py runs every route on a tiny model: the script behind README's Benchmark table keeps working.

This checks that every route runs and computes the same function (its logits within 1e-4 of hubvit's default: the
routes use other kernels and onnxruntime its own, so float32 rounding over two blocks; the script prints the
difference); speed is not asserted here: performance targets live in the benchmark's output, not in timed tests.
"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from utils import NO_OPENVINO_TELEMETRY

ROOT = Path(__file__).resolve().parent.parent
UNCOMPILED_ROUTE_KINDS = (
    "eager",
    "cpu",
    "onnx",
    "onnx-fused",
    "openvino",
    "openvino-dynamic",
    "openvino-default",
    "int8",
    "onnx-int8",
)
UNCOMPILED_ROUTES = [
    "hubvit",
    "timm",
    "transformers",
    "hubvit + optimize_for_cpu",
    "hubvit onnxruntime",
    "hubvit onnxruntime fused",
    "timm onnxruntime",
]
COMPILED_ROUTES = ["hubvit compile", "hubvit compile+freezing"]
OPENVINO_ROUTES = ["hubvit openvino f32", "timm openvino f32", "hubvit openvino f32 dynamic shape"]
REDUCED_PRECISION_ROUTES = [
    "hubvit + optimize_for_cpu int8 (reduced precision)",
    "hubvit onnxruntime int8 (reduced precision)",
]


def run_benchmark(script, *options, timeout=1200):
    """`python benchmarks/SCRIPT *options` from the repository root, offline; fails the test with its stderr."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *options],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **NO_OPENVINO_TELEMETRY},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def quick_benchmark(*options):
    result = run_benchmark("benchmark.py", "--quick", "--threads", "1", *options)
    parts = result.stdout.split("ViT-2L/8 (tiny) training step")  # the case's table, then the summary's row
    return result.stdout, parts[0], parts[1]


def inference_row(route, inference):
    """(img/s, ratio to timm eager or None, logit difference or "(reference)") of `route`'s row."""
    row = re.search(rf"^\| {re.escape(route)} \| ([\d.]+) \| ([\d.]+x|n/a) \| \d+ \| (\S+) \|$", inference, re.M)
    assert row, f"no inference row for {route!r}"
    return float(row[1]), row[2], row[3]


@pytest.mark.heavy
def test_quick_benchmark_runs_every_uncompiled_route_on_the_same_function():
    out, inference, training = quick_benchmark("--routes", ",".join(UNCOMPILED_ROUTE_KINDS))
    has_openvino = importlib.util.find_spec("openvino") is not None
    for route in UNCOMPILED_ROUTES + (OPENVINO_ROUTES if has_openvino else []) + REDUCED_PRECISION_ROUTES:
        speed, ratio, difference = inference_row(route, inference)
        assert speed > 0 and ratio.endswith("x")
        if difference != "(reference)" and route not in REDUCED_PRECISION_ROUTES:
            assert float(difference) <= 1e-4, f"{route}: logits differ by {difference}"
    for route in UNCOMPILED_ROUTES[:4]:
        assert re.search(rf"^\| {re.escape(route)} \| [\d.]+ \|", training, re.M), f"no training row for {route!r}"
    assert re.search(r"GEMM peak on the encoder's shapes: \d+ GFLOP/s \(MKL \d+, oneDNN \d+\)", out)
    assert re.search(r"^\| ViT-2L/8 \(tiny\) inference \| 2 \| [\d.]+x \| [\d.]+x \| [\d.]+x \| [\d.]+x \(", out, re.M)
    assert re.search(r"^CPU ISA: (AVX2|AVX-512|AVX512-BF16|AMX|\S+)$", out, re.M)


@pytest.mark.heavy
def test_quick_benchmark_compiled_routes_compute_the_same_function():
    """torch.compile routes are built the same way for every library, so hubvit's alone are run (each compilation
    costs seconds): with and without freezing in inference, compiled in a training step."""
    _, inference, training = quick_benchmark("--libraries", "hubvit", "--routes", "eager,compile,freezing")
    for route in COMPILED_ROUTES:
        speed, _, difference = inference_row(route, inference)
        assert speed > 0 and float(difference) <= 1e-4, f"{route}: logits differ by {difference}"
    assert re.search(r"^\| hubvit compile \| [\d.]+ \|", training, re.M), "no compiled training row"


def test_activation_checkpointing_benchmark_measures_both_settings_in_their_own_processes(tmp_path):
    record = tmp_path / "record.json"
    options = ["--model", "ti16", "--batch_size", "2", "--steps", "1", "--repeats", "1", "--threads", "1"]
    result = run_benchmark("activation_checkpointing.py", *options, "--json", str(record), timeout=600)
    for setting in ("off", "on"):
        assert re.search(rf"^\| {setting} \| [\d.]+ GiB \| [\d.]+ s \| [\d.]+ s \|$", result.stdout, re.M), setting
    runs = json.loads(record.read_text())["runs"]
    assert {setting: len(results) for setting, results in runs.items()} == {"off": 1, "on": 1}
    figures = [run[key] for results in runs.values() for run in results for key in ("peak_mib", "step_s", "step_cpu_s")]
    assert all(value > 0 for value in figures)


def test_the_families_benchmark_times_timm_and_hubvit_on_one_function(tmp_path):
    """benchmarks/families.py --quick: EVA-02 (B/14, B/16 CLIP) and DINOv3 (mean- and [CLS]-pooled) converted through
    the converter, every route computing
    timm's logits (float32: hubvit eager exactly or to 1e-4 absolute; optimize_for_cpu's kernels round
    differently), the CPU ISA named with the figures."""
    record = tmp_path / "families.json"
    out = run_benchmark("families.py", "--quick", "--threads", "1", "--json", str(record)).stdout
    assert "CPU ISA" in out
    report = json.loads(record.read_text())
    assert [r["architecture"] for r in report["records"]] == [
        "eva02_base_patch14_224",
        "eva02_base_patch16_clip_224",
        "vit_base_patch16_dinov3",
        "vit_base_patch16_dinov3",
        "samvit_base_patch16",
    ]
    assert report["records"][3]["model_args"]["global_pool"] == "token"
    for r in report["records"]:
        assert set(r["images_per_second"]) == {"timm", "hubvit", "hubvit optimize_for_cpu"}
        assert max(r["max_abs_logit_difference_vs_timm"].values()) <= 1e-4, r


def test_the_naflex_benchmark_counts_tokens_and_times_every_route_on_one_batch(tmp_path):
    """benchmarks/naflex.py --quick: eight aspect ratios under a 256-patch budget. NaFlex keeps every image within
    the budget and pads only to the batch's longest; the square route spends the whole budget on every image; the
    padded square spends more on black. hubvit and transformers compute the same pooled vectors (1e-5)."""
    record = tmp_path / "naflex.json"
    out = run_benchmark("naflex.py", "--quick", "--threads", "1", "--json", str(record)).stdout
    assert "CPU ISA" in out
    routes = json.loads(record.read_text())["routes"]
    naflex, square, padded = routes["hubvit naflex"], routes["hubvit square"], routes["hubvit pad-to-square"]
    assert naflex["tokens_per_image"] <= 256 and square["tokens_per_image"] == 256 and square["image_share"] == 1
    assert padded["tokens_per_image"] > naflex["tokens_per_image"] and padded["image_share"] < naflex["image_share"]
    assert routes["transformers naflex"]["tokens_per_image"] == naflex["tokens_per_image"]
    assert all(row["images_per_second"] > 0 for row in routes.values())
    assert json.loads(record.read_text())["max_abs_pooler_difference_vs_transformers"] <= 1e-5
