"""Images at their own aspect ratios (NaFlex) against one square per image, side by side in one process.

    python benchmarks/naflex.py --json benchmarks/naflex_avx2.json

transformers builds SigLIP 2 NaFlex B/16 (`Siglip2VisionModel`, a 16 x 16 table, random weights) and `hubvit
convert transformers` converts it. One batch of eight images of eight aspect ratios (1:3 to 3:1, long side 512 px)
runs four ways under the same budget of 256 patches:

- `naflex`: transformers' own `Siglip2ImageProcessor` (each image at its aspect ratio within 256 patches), the
  batch cut to its longest sequence (as hubvit's training batches are), through hubvit and through
  `Siglip2VisionModel` itself (the peer, on the same tensors);
- `square`: every image resized to 256 x 256 (16 x 16 patches, its aspect ratio lost), through hubvit;
- `pad-to-square`: every image at its NaFlex size, placed in the square that holds the batch's longest side (its
  aspect ratio kept, the rest black), through hubvit.

For each: the tokens the encoder processes per image and the share of them that carry the image, and images/s
(the median over rounds; each round runs every route once, in a shuffled order). The CPU's ISA is printed with every
figure.
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

import numpy as np
import torch

ASPECTS = ((512, 171), (512, 256), (512, 384), (512, 512), (384, 512), (288, 512), (256, 512), (171, 512))
BUDGET, PATCH = 256, 16


B16 = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
QUICK = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128)


def build(folder, sizes):
    """SigLIP 2 NaFlex (B/16, or `sizes`) from transformers and hubvit's conversion of it (checked by the
    converter)."""
    import transformers

    import hubvit
    from hubvit import HubViTModel

    config = transformers.Siglip2VisionConfig(**sizes, patch_size=PATCH)
    config.num_patches = BUDGET
    source = transformers.Siglip2VisionModel(config).eval()
    source.save_pretrained(folder / "siglip2")
    hubvit.convert_transformers(folder / "siglip2", folder / "hubvit")
    return source, HubViTModel.from_pretrained(folder / "hubvit").eval()


def batches(images):
    """The routes' inputs: NaFlex patch sequences, squares, and NaFlex-sized images padded to one square."""
    from transformers import BitImageProcessor, Siglip2ImageProcessor
    from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

    naflex = Siglip2ImageProcessor(patch_size=PATCH, max_num_patches=BUDGET)(images=images, return_tensors="pt")
    longest = int(naflex["pixel_attention_mask"].sum(-1).max())
    sequences = dict(
        pixel_values=naflex["pixel_values"][:, :longest],
        pixel_attention_mask=naflex["pixel_attention_mask"][:, :longest],
        spatial_shapes=naflex["spatial_shapes"],
    )
    normalise = dict(do_rescale=True, do_normalize=True, image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=2)
    squares = BitImageProcessor(size={"height": 256, "width": 256}, do_center_crop=False, **normalise)
    square = squares(images=images, return_tensors="pt")["pixel_values"]
    sizes = [get_image_size_for_max_num_patches(*image.shape[:2], PATCH, BUDGET) for image in images]
    side = max(max(size) for size in sizes)
    padded = torch.full((len(images), 3, side, side), -1.0)  # black after normalisation
    for row, (image, (height, width)) in enumerate(zip(images, sizes)):
        resized = BitImageProcessor(size={"height": height, "width": width}, do_center_crop=False, **normalise)
        padded[row, :, :height, :width] = resized(images=[image], return_tensors="pt")["pixel_values"][0]
    valid = sum(h * w for h, w in sizes) / PATCH**2
    count = len(images)
    return {
        "naflex": (sequences, count * longest, valid),
        "square": (dict(pixel_values=square), count * BUDGET, count * BUDGET),
        "pad-to-square": (dict(pixel_values=padded), count * (side // PATCH) ** 2, valid),
    }


def timed(model, inputs, iterations):
    started = time.perf_counter()
    with torch.inference_mode():
        for _ in range(iterations):
            model(**inputs)
    return (time.perf_counter() - started) / iterations


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json", type=Path, default=None, help="also write the record here")
    parser.add_argument("--quick", action="store_true", help="a one-block model and one round (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    import transformers

    from hubvit.cpu import cpu_isa

    isa = cpu_isa()
    print(f"CPU ISA {isa}, {args.threads} threads, torch {torch.__version__}, transformers {transformers.__version__}")
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ASPECTS]
    with tempfile.TemporaryDirectory() as scratch:
        source, model = build(Path(scratch), QUICK if args.quick else B16)
    inputs = batches(images)
    with torch.inference_mode():
        peer = (model(**inputs["naflex"][0]).pooler_output - source(**inputs["naflex"][0]).pooler_output).abs().max()
    routes = {
        "hubvit naflex": (model, "naflex"),
        "transformers naflex": (source, "naflex"),
        "hubvit square": (model, "square"),
        "hubvit pad-to-square": (model, "pad-to-square"),
    }
    for model_, key in routes.values():
        timed(model_, inputs[key][0], 1)  # warm-up
    seconds = {route: [] for route in routes}
    order = random.Random(0)
    for _ in range(args.rounds):
        for route in order.sample(list(routes), len(routes)):
            time.sleep(0.2)
            model_, key = routes[route]
            seconds[route].append(timed(model_, inputs[key][0], args.iterations))
    count = len(images)
    rows = {}
    for route, (_, key) in routes.items():
        _, tokens, valid = inputs[key]
        rows[route] = {
            "tokens_per_image": tokens / count,
            "image_share": valid / tokens,
            "images_per_second": count / statistics.median(seconds[route]),
        }
    naflex = rows["hubvit naflex"]["images_per_second"]
    name = "one-block test model" if args.quick else "B/16"
    print(f"\n{count} images of aspect ratios 1:3 to 3:1, budget {BUDGET} patches of {PATCH} px, {name} ({isa}):")
    for route, row in rows.items():
        print(
            f"  {route:22} {row['tokens_per_image']:6.1f} tokens/image, {row['image_share']:6.1%} of them image, "
            f"{row['images_per_second']:6.2f} img/s ({row['images_per_second'] / naflex:5.2f}x hubvit naflex)"
        )
    print(f"  hubvit against transformers on the NaFlex batch: max |Δpooler_output| {peer:.1e}")
    if args.json:
        record = {
            "environment": {
                "cpu_isa": isa,
                "processor": platform.processor() or platform.machine(),
                "threads": args.threads,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            "model": name,
            "aspects": ASPECTS,
            "rounds": args.rounds,
            "routes": rows,
            "max_abs_pooler_difference_vs_transformers": float(peer),
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
