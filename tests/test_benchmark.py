"""benchmarks/benchmark.py runs every route on a tiny model: the script behind README's Benchmark table keeps working.

This checks that every route runs and computes the same function (its logits within 1e-4 of hubvit's default: the
routes use other kernels and onnxruntime its own, so float32 rounding over two blocks; the script prints the
difference); speed is not asserted here: performance targets live in the benchmark's output, not in timed tests.
"""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROUTES = [
    "hubvit",
    "timm",
    "transformers",
    "hubvit + optimize_for_cpu",
    "hubvit compile",
    "timm compile",
    "transformers compile",
    "hubvit compile+freezing",
    "timm compile+freezing",
    "transformers compile+freezing",
    "hubvit onnxruntime",
    "timm onnxruntime",
]
OPENVINO_ROUTES = ["hubvit openvino f32", "timm openvino f32"]
REDUCED_PRECISION_ROUTES = [
    "hubvit + optimize_for_cpu int8 (reduced precision)",
    "hubvit onnxruntime int8 (reduced precision)",
]


@pytest.mark.heavy
def test_quick_benchmark_runs_every_route_on_the_same_function():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "benchmark.py"), "--quick", "--threads", "1"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    inference, training = out.split("ViT-2L/8 (tiny) training step")[0], out.split("ViT-2L/8 (tiny) training step")[1]
    has_openvino = importlib.util.find_spec("openvino") is not None
    for route in ROUTES + (OPENVINO_ROUTES if has_openvino else []) + REDUCED_PRECISION_ROUTES:
        row = re.search(rf"^\| {re.escape(route)} \| ([\d.]+) \| ([\d.]+)x \| \d+ \| (\S+) \|$", inference, re.M)
        assert row, f"no inference row for {route!r}"
        assert float(row[1]) > 0
        if row[3] != "(reference)" and route not in REDUCED_PRECISION_ROUTES:
            assert float(row[3]) <= 1e-4, f"{route}: logits differ by {row[3]}"
    for route in ROUTES[:7]:
        assert re.search(rf"^\| {re.escape(route)} \| [\d.]+ \|", training, re.M), f"no training row for {route!r}"
    assert re.search(r"GEMM peak on the encoder's shapes: \d+ GFLOP/s \(MKL \d+, oneDNN \d+\)", out)
    assert re.search(r"^\| ViT-2L/8 \(tiny\) inference \| 2 \| [\d.]+x \| [\d.]+x \| [\d.]+x \| [\d.]+x \(", out, re.M)
    assert re.search(r"^CPU ISA: (AVX2|AVX-512|AVX512-BF16|AMX|\S+)$", out, re.M)
