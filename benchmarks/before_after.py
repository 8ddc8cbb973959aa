"""The model files of an earlier revision against today's and timm, in one process, on the same weights.

A refactor of `modeling/` should not cost speed: this loads the modeling files as they were at `--before` (read with
`git show`, imported as a package of their own) beside the installed hubvit's, copies one set of random weights into
both, checks they compute the same logits, and times them interleaved with timm's ViT (each round in a shuffled
order, a pause before each call), printing the median of the per-round speed ratios and the CPU's ISA.

    python benchmarks/before_after.py --before 19e40bd                 # ViT-S/16 and ViT-B/16, batch 8
    python benchmarks/before_after.py --before 19e40bd --sizes s --rounds 30
"""

import argparse
import importlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from hubvit import HubViTConfig, HubViTForImageClassification
from hubvit.cpu import cpu_isa
from hubvit.presets import SIZES

ROOT = Path(__file__).resolve().parents[1]
TIMM = {"s": "vit_small_patch16_224", "b": "vit_base_patch16_224", "ti": "vit_tiny_patch16_224"}


def earlier_modeling(revision, folder):
    """The `modeling/` package of `revision`, written under `folder` as `earlier_modeling` and imported."""
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{revision}:modeling"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    package = Path(folder) / "earlier_modeling"
    package.mkdir()
    for name in listing.stdout.split():
        if name.endswith(".py"):
            source = subprocess.run(
                ["git", "show", f"{revision}:modeling/{name}"], cwd=ROOT, capture_output=True, text=True, check=True
            )
            (package / name).write_text(source.stdout)
    sys.path.insert(0, str(folder))
    return importlib.import_module("earlier_modeling")


def compare(size, earlier, rounds, batch):
    import timm

    fields = dict(SIZES[size].fields(), image_size=224, patch_size=16, num_labels=1000)
    after = HubViTForImageClassification(HubViTConfig(**fields)).eval()
    before = earlier.HubViTForImageClassification(earlier.HubViTConfig(**fields)).eval()
    before.load_state_dict(after.state_dict())
    peer = timm.create_model(TIMM[size], pretrained=False).eval()
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    routes = {"before": before, "after": after, "timm": peer}
    times = {name: [] for name in routes}
    order = random.Random(0)
    with torch.no_grad():
        same = (before(x).logits - after(x).logits).abs().max().item()
        for _ in range(rounds):
            names = list(routes)
            order.shuffle(names)
            for name in names:
                time.sleep(0.2)
                started = time.perf_counter()
                routes[name](x)
                times[name].append(time.perf_counter() - started)

    def speed(a, b):
        return statistics.median(tb / ta for ta, tb in zip(times[a], times[b]))

    return (
        f"{TIMM[size]}, batch {batch}, {rounds} rounds, ISA {cpu_isa()}, max |logit difference| {same:.1e}: "
        f"after / before {speed('after', 'before'):.3f}x, before / timm {speed('before', 'timm'):.3f}x, "
        f"after / timm {speed('after', 'timm'):.3f}x (speed, > 1 is faster)"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision whose modeling/ is compared")
    parser.add_argument("--sizes", default="s,b", help=f"comma-separated, of {sorted(TIMM)}")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        earlier = earlier_modeling(args.before, folder)
        for size in args.sizes.split(","):
            print(compare(size, earlier, args.rounds, args.batch_size), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
