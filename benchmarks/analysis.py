"""Cost of `hubvit analyze attention-distance` against plain inference on the same images (target: at most 2x).

ViT-B/16 at 224 (random weights: the cost does not depend on them), real photographs from scikit-image, batch 8.
Plain inference is the model's default path (sdpa, no weights returned); the analysis runs the eager attention
with `output_attentions=True` and the streaming reduction. Interleaved rounds on the same inputs; the ratio is the
median of the per-round ratios, which stays meaningful on a shared, noisy machine.

    python benchmarks/analysis.py
    python benchmarks/analysis.py --size s/16 --rounds 7 --threads 2
"""

import argparse
import statistics
import time

import numpy as np
import skimage.data
import torch
from PIL import Image

from hubvit import HubViTForImageClassification
from hubvit.analysis import attention, info

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "cat", "camera", "immunohistochemistry")


def photographs(count, size):
    images = []
    for name in (PHOTOS * count)[:count]:
        pixels = np.asarray(getattr(skimage.data, name)())
        image = Image.fromarray(pixels).convert("RGB").resize((size, size), Image.BICUBIC)
        images.append(torch.from_numpy(np.array(image)).permute(2, 0, 1))
    return torch.stack(images).float() / 127.5 - 1.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="b/16", help="preset, as for `hubvit info` (default b/16)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = info.preset_config(args.size, args.image_size)
    model = HubViTForImageClassification._from_config(config, attn_implementation="sdpa").eval()
    pixels = photographs(args.batch_size, args.image_size)

    def plain():
        with torch.inference_mode():
            model(pixels)

    def analysis():
        attention.attention_distance(model, [pixels])

    plain(), analysis()  # warm-up
    times = {"plain": [], "analysis": []}
    for index in range(args.rounds):
        for name, step in sorted({"plain": plain, "analysis": analysis}.items(), reverse=bool(index % 2)):
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    ratios = [a / p for a, p in zip(times["analysis"], times["plain"])]
    plain_s, analysis_s = statistics.median(times["plain"]), statistics.median(times["analysis"])
    from hubvit.cpu import cpu_isa

    print(
        f"{args.size} at {args.image_size}, batch {args.batch_size}, {args.threads} threads, {args.rounds} rounds, "
        f"CPU ISA {cpu_isa()}"
    )
    print(f"plain inference       {plain_s:.3f} s/batch ({args.batch_size / plain_s:.2f} img/s)")
    print(f"attention distance    {analysis_s:.3f} s/batch ({args.batch_size / analysis_s:.2f} img/s)")
    print(
        f"analysis / inference  {statistics.median(ratios):.2f}x (median of per-round ratios; "
        f"range {min(ratios):.2f}x-{max(ratios):.2f}x; target <= 2x)"
    )


if __name__ == "__main__":
    main()
