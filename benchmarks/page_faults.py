"""Minor page faults per forward pass of hubvit and timm on the same architecture, with the models built in either
order: how much of an eager CPU forward is the allocator handing fresh pages to the kernel, and whether that follows
the library or the heap's history.

glibc returns large freed blocks (above its mmap and trim thresholds) to the kernel, so the next forward touches
fresh pages again. `--malloc-env` reruns the count in a child with `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_`
raised, where the blocks are reused.

    python benchmarks/page_faults.py                 # ViT-S/16, batch 8, 2 threads
    python benchmarks/page_faults.py --malloc-env
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

TIMM = {"s": "vit_small_patch16_224", "b": "vit_base_patch16_224", "ti": "vit_tiny_patch16_224"}


def measure(size, batch, threads, order, forwards=5):
    import timm

    from hubvit import HubViTConfig, HubViTModel
    from hubvit.cpu import cpu_isa
    from hubvit.presets import SIZES

    torch.set_num_threads(threads)
    builders = {
        "hubvit": lambda: HubViTModel(HubViTConfig(**SIZES[size].fields())).eval(),
        "timm": lambda: timm.create_model(TIMM[size], pretrained=False, num_classes=0).eval(),
    }
    models = {name: builders[name]() for name in order}
    pixels = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    calls = {
        "hubvit": lambda: models["hubvit"](pixel_values=pixels),
        "timm": lambda: models["timm"].forward_features(pixels),
    }
    rows = []
    with torch.inference_mode():
        for name in order:
            calls[name]()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            for _ in range(forwards):
                calls[name]()
            seconds = (time.perf_counter() - start) / forwards
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / forwards
            rows.append({"library": name, "built": order.index(name) + 1, "faults": faults, "ms": 1000 * seconds})
    return {"isa": cpu_isa(), "size": size, "batch": batch, "threads": threads, "order": order, "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="s", choices=sorted(TIMM))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--malloc-env", action="store_true", help="also count with glibc's thresholds raised")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.size, args.batch_size, args.threads, args.child.split(","))))
        return 0
    settings = [("default allocator", {})]
    if args.malloc_env:
        raised = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}
        settings.append(("MALLOC_MMAP_THRESHOLD_=2^30 MALLOC_TRIM_THRESHOLD_=2^32", raised))
    for label, env in settings:
        for order in ("timm,hubvit", "hubvit,timm"):
            command = [sys.executable, __file__, "--size", args.size, "--batch-size", str(args.batch_size)]
            command += ["--threads", str(args.threads), "--child", order]
            result = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=True)
            record = json.loads(result.stdout.strip().splitlines()[-1])
            cells = ", ".join(f"{r['library']} {r['faults']:,.0f} faults {r['ms']:.0f} ms" for r in record["rows"])
            print(f"{TIMM[args.size]} batch {args.batch_size}, {record['isa']}, {label}, built {order}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
