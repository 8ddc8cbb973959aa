"""The figures behind docs/compatibility.md, and its table rendered from them.

    python tests/compatibility_report.py releases   # runs tests/test_compatibility.py, records docs/compatibility/releases.json
    python tests/compatibility_report.py exports    # ViT-S/16 and digits exports in onnxruntime and OpenVINO -> exports.json
    python tests/compatibility_report.py render     # rewrites the table in docs/compatibility.md from both files

The exports are random-weight models (the resize does not care what the weights are): ViT-S/16 at 224 and a
digits-sized model (28 px, patch 7, one channel), each exported with `export_onnx.export_graph` and checked by
`export_onnx.verify` at the export size, two patches larger and a non-square size, plus the sizes of issue 21
(21x21 and 42x21 for the digits model). `--resize interpolate` exports the way hubvit did before (an ONNX `Resize`),
for the comparison the page shows.
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "compatibility"
PAGE = REPO / "docs" / "compatibility.md"


def cpu_description():
    """The CPU's model name and its ISA as the benchmarks name it (`hubvit.cpu.cpu_isa`)."""
    from hubvit.cpu import cpu_isa

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor()
    )
    return f"{model}, {cpu_isa()}"


def releases():
    DATA.mkdir(parents=True, exist_ok=True)
    record = DATA / "releases.json"
    env = {**os.environ, "HUBVIT_COMPATIBILITY_RECORD": str(record)}
    started, cpu = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(REPO / "tests" / "test_compatibility.py"),
    ]
    subprocess.run(command, cwd=REPO, env=env, check=True)
    rows = json.loads(record.read_text())
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    record.write_text(
        json.dumps(
            dict(
                seconds=round(time.time() - started), cpu_seconds=round(cpu_seconds), cpu=cpu_description(), rows=rows
            ),
            indent=2,
        )
        + "\n"
    )


def exports(resize):
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    import onnxruntime
    from utils import randomize_

    from hubvit import HubViTConfig, HubViTForImageClassification
    from hubvit.conversion import export_onnx

    models = {
        "ViT-S/16": dict(
            image_size=224,
            patch_size=16,
            hidden_size=384,
            num_hidden_layers=12,
            num_attention_heads=6,
            intermediate_size=1536,
            num_labels=1000,
        ),
        "digits (28 px, patch 7)": dict(
            image_size=28,
            patch_size=7,
            num_channels=1,
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=128,
            num_labels=10,
        ),
    }
    extra = {"digits (28 px, patch 7)": [(21, 21), (42, 21)]}
    results, default_sizes = [], export_onnx.check_sizes
    for name, fields in models.items():
        model = randomize_(HubViTForImageClassification(HubViTConfig(**fields)), seed=0).eval()
        path = Path("/tmp") / f"hubvit-compatibility-{os.getpid()}.onnx"
        if resize == "interpolate":
            export_onnx.resize_by_matrices = lambda: __import__("contextlib").nullcontext()
        names = export_onnx.export_graph(model, path)
        sizes = default_sizes(model.config) + extra.get(name, [])
        export_onnx.check_sizes = lambda config, sizes=sizes: sizes
        rows = export_onnx.verify(model, path, names)
        path.unlink()
        for row in rows:
            results.append(
                dict(
                    model=name,
                    resize=resize,
                    runtime=row["runtime"],
                    height=row["height"],
                    width=row["width"],
                    relative=row["max_abs_difference"] / row["max_abs_output"],
                )
            )
    import openvino

    DATA.mkdir(parents=True, exist_ok=True)
    out = DATA / f"exports-{resize}.json"
    out.write_text(
        json.dumps(
            dict(
                torch=torch.__version__,
                onnxruntime=onnxruntime.__version__,
                openvino=openvino.__version__.split("-")[0],
                cpu=cpu_description(),
                rows=results,
            ),
            indent=2,
        )
        + "\n"
    )
    for row in results:
        print(f"{row['model']:24s} {row['runtime']:12s} {row['height']}x{row['width']}: {row['relative']:.1e}")


def render():
    """The tables live in docs/compatibility.md and README.md: scripts/render_docs.py renders every table."""
    subprocess.run([sys.executable, str(REPO / "scripts" / "render_docs.py")], check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["releases", "exports", "render"])
    parser.add_argument("--resize", choices=["matrices", "interpolate"], default="matrices")
    args = parser.parse_args()
    if args.what == "releases":
        releases()
    elif args.what == "exports":
        exports(args.resize)
    render()


if __name__ == "__main__":
    main()
