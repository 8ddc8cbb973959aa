"""Eager inference throughput of hubvit against timm on the modern families' own architectures, in one process.

    python benchmarks/families.py                       # EVA-02 B/14, B/16, DINOv3 B/16 (two poolings), SAM B/16
    python benchmarks/families.py --architectures sam_b16_512 --json benchmarks/families_sam_avx2.json
    python benchmarks/families.py --quick               # one block, one round (a smoke test)

timm builds each architecture (random weights, its own initialisation); `hubvit.convert_timm` converts it, checking
the converted model against timm's forward, so both compute the same function (the largest difference of the
outputs is printed again here). Routes: timm eager, hubvit eager (the default a user gets from `from_pretrained`),
hubvit with `optimize_for_cpu`. After a warm-up, each round times every route once in a shuffled order (seeded);
throughput is the median over rounds and a ratio the median of the per-round ratios, so a noisy machine slows every
route of a round alike. The CPU's widest ISA is printed with every figure.
"""

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ARCHITECTURES = {  # mean pooling (EVA-02 B/14, DINOv3 as timm pools it) and [CLS] pooling (EVA-02 B/16 CLIP tower,
    # DINOv3 as its authors classify), where `optimize_for_cpu` runs the last block for the [CLS] token alone
    "eva02_b14": ("eva02_base_patch14_224", {}),
    "eva02_b16_clip": ("eva02_base_patch16_clip_224", {"num_classes": 1000}),
    "dinov3_b16": ("vit_base_patch16_dinov3", {"num_classes": 1000}),
    "dinov3_b16_token": ("vit_base_patch16_dinov3", {"num_classes": 1000, "global_pool": "token"}),
    # SAM's windowed blocks (windows_hubvit.py) at 512 px: a 32 x 32 grid padded to 42 x 42 for windows of 14
    "sam_b16_512": ("samvit_base_patch16", {"num_classes": 1000, "img_size": 512}),
}


def build(name, model_args, folder):
    """timm's model and hubvit's conversion of it (through the converter and its parity check)."""
    import timm
    from timm.models import save_for_hf

    import hubvit
    from hubvit import HubViTForImageClassification

    source = timm.create_model(name, pretrained=False, **model_args).eval()
    save_for_hf(source, folder / "timm", model_args=model_args, safe_serialization=True)
    hubvit.convert_timm(folder / "timm", folder / "hubvit")
    return source, HubViTForImageClassification.from_pretrained(folder / "hubvit").eval()


def timed(model, images, iterations):
    started = time.perf_counter()
    with torch.inference_mode():
        for _ in range(iterations):
            output = model(images)
    del output
    return (time.perf_counter() - started) / iterations


def logits(model, images):
    with torch.inference_mode():
        output = model(images)
    return output if isinstance(output, torch.Tensor) else output.logits


def run(key, args):
    import copy

    from hubvit import optimize_for_cpu

    name, model_args = ARCHITECTURES[key]
    model_args = {**model_args, **({"depth": 1} if args.quick else {})}
    with tempfile.TemporaryDirectory() as scratch:
        timm_model, hubvit_model = build(name, model_args, Path(scratch))
    optimized = optimize_for_cpu(copy.deepcopy(hubvit_model))
    routes = {"timm": timm_model, "hubvit": hubvit_model, "hubvit optimize_for_cpu": optimized}
    size = hubvit_model.config.image_size_2d
    images = torch.randn(args.batch_size, 3, *size, generator=torch.Generator().manual_seed(0))
    reference = logits(timm_model, images)
    differences = {route: (logits(model, images) - reference).abs().max().item() for route, model in routes.items()}
    for model in routes.values():
        timed(model, images, 1)  # warm-up (and optimize_for_cpu's kernel probe)
    order = random.Random(0)
    seconds = {route: [] for route in routes}
    for _ in range(args.rounds):
        for route in order.sample(list(routes), len(routes)):
            time.sleep(0.2)
            seconds[route].append(timed(routes[route], images, args.iterations))
    throughput = {route: args.batch_size / statistics.median(times) for route, times in seconds.items()}
    per_round = {route: [t / s for t, s in zip(seconds["timm"], seconds[route])] for route in routes}
    ratios = {route: statistics.median(values) for route, values in per_round.items()}
    quartiles = {
        route: statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        for route, values in per_round.items()
    }
    against_default = [e / o for e, o in zip(seconds["hubvit"], seconds["hubvit optimize_for_cpu"])]
    return {
        "architecture": name,
        "model_args": model_args,
        "batch_size": args.batch_size,
        "image_size": list(size),
        "rounds": args.rounds,
        "images_per_second": {route: round(value, 2) for route, value in throughput.items()},
        "speed_vs_timm": {route: round(value, 3) for route, value in ratios.items()},
        "speed_vs_timm_quartiles": {route: [round(q, 3) for q in qs] for route, qs in quartiles.items()},
        "optimize_for_cpu_vs_default": round(statistics.median(against_default), 3),
        "max_abs_logit_difference_vs_timm": differences,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architectures", nargs="*", default=list(ARCHITECTURES), choices=list(ARCHITECTURES))
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.iterations, args.batch_size = 1, 1, 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    import timm
    import transformers

    from hubvit.cpu import cpu_isa

    environment = {
        "cpu_isa": cpu_isa(),
        "processor": platform.processor() or platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "transformers": transformers.__version__,
    }
    print(
        f"CPU ISA {environment['cpu_isa']}, {args.threads} threads, torch {torch.__version__}, timm {timm.__version__}"
    )
    records = []
    for key in args.architectures:
        record = run(key, args)
        records.append(record)
        print(
            f"\n{record['architecture']} at {record['image_size']}, batch {args.batch_size} ({environment['cpu_isa']}):"
        )
        for route, value in record["images_per_second"].items():
            ratio = record["speed_vs_timm"][route]
            difference = record["max_abs_logit_difference_vs_timm"][route]
            low, _, high = record["speed_vs_timm_quartiles"][route]
            print(
                f"  {route:26} {value:8.2f} img/s  {ratio:5.3f}x timm (rounds' quartiles {low:.3f}-{high:.3f})  "
                f"max |Δlogit| {difference:.1e}"
            )
        print(
            f"  optimize_for_cpu against the default: {record['optimize_for_cpu_vs_default']:.3f}x (median of rounds)"
        )
    if args.json:
        args.json.write_text(json.dumps({"environment": environment, "records": records}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
