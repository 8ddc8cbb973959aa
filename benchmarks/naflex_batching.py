"""How NaFlex training batches are formed: padding, resolution and speed of three orders, side by side in one process.

    python benchmarks/naflex_batching.py --json benchmarks/naflex_batching_avx2.json

Two training sets of images at their own aspect ratios: the embedded NaFlex default (5,000 digits on canvases of
five aspect ratios, 16 patches of 7 px) and photographs (scikit-image's, cut at random aspect ratios from 1:3 to
3:1, 256 patches of 16 px). One epoch of each is batched three ways (`--augment inception` adds random crops of
aspect ratio 3/4 to 4/3 in all three):

- `random`: hubvit's loader, batches drawn at random and padded to their longest sequence;
- `patch_count`: hubvit's loader grouping images of one patch count (`PatchCountBatches`, the default);
- `timm schedule`: timm's own NaFlex loader (`create_naflex_loader`): per batch a sequence length drawn from its
  schedule (timm's default lengths 128, 256, 576, 784, 1024 scaled to the budget), the batch size set by a token
  budget (batch size x budget), each image resized to fit the batch's length and padded to it.

For each: batches, the share of the batch positions that are padding, image patches per image (the resolution
trained at), and the forward and backward passes of one model over the epoch's batches (collected first, so that
image decoding is not timed): images/s and image patches/s, the median of rounds in a shuffled order. No
augmentation in any (timm's NaFlex training with `no_aug` resizes as its evaluation does), so that only the
batching differs. The CPU's ISA is printed with every figure.
"""

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TIMM_LENGTHS = (128, 256, 576, 784, 1024)  # timm's default train_seq_lens, for a budget of 1024
BATCH = 64
SETS = {  # name: (patch size, budget, model fields)
    "digits on canvases": (7, 16, dict(hidden_size=96, num_hidden_layers=6, num_attention_heads=4)),
    "photographs 1:3-3:1": (16, 256, dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3)),
}


def photographs(count, seed=0):
    """`count` crops of scikit-image's photographs, each at a random aspect ratio (log-uniform, 1:3 to 3:1) and a
    random share (30-100%) of the photograph's area, ten classes by the photograph they came from."""
    import datasets
    import skimage.data
    from PIL import Image

    names = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina"]
    sources = [np.asarray(getattr(skimage.data, name)())[..., :3] for name in names]
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for _ in range(count):
        label = int(rng.integers(len(sources)))
        photo = sources[label]
        ratio = float(np.exp(rng.uniform(np.log(1 / 3), np.log(3))))  # width / height
        area = rng.uniform(0.3, 1.0) * photo.shape[0] * photo.shape[1]
        height = int(min(photo.shape[0], np.sqrt(area / ratio)))
        width = int(min(photo.shape[1], height * ratio))
        top, left = rng.integers(photo.shape[0] - height + 1), rng.integers(photo.shape[1] - width + 1)
        images.append(Image.fromarray(photo[top : top + height, left : left + width]))
        labels.append(label)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    return datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)


def training_set(name, quick):
    if name.startswith("digits"):
        from hubvit.training.data import embedded_digits
        from hubvit.training.naflex import digits_on_canvases

        digits = embedded_digits()
        return digits_on_canvases(digits.select(range(300)) if quick else digits)
    return photographs(60 if quick else 600)


def hubvit_batches(dataset, patch, budget, order, augment="none"):
    """One epoch (epoch 0) of hubvit's NaFlex training loader under `--naflex_batching order`."""
    from hubvit import training
    from hubvit.training.data import make_loaders

    args = training.resolve_defaults(
        training.Arguments.build(
            output_dir="unused",
            max_num_patches=budget,
            naflex_batching=order,
            augment=augment,
            per_device_train_batch_size=BATCH,
            dataloader_num_workers=0,
        )
    )
    train_set, loader, _ = make_loaders(args, dataset, None, None, preprocessing(), patch_size=patch)
    train_set.set_epoch(0)
    return [(batch.inputs(), labels) for batch, labels in loader]


def preprocessing():
    from hubvit.preprocessing import Preprocessing

    return Preprocessing(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), resample=2)


class Pairs(torch.utils.data.Dataset):
    """(PIL image, label) pairs, the map-style dataset timm's loader wraps."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        example = self.dataset[int(index)]
        return example["image"].convert("RGB"), example["label"]


def timm_batches(dataset, patch, budget, augment="none"):
    """One epoch of timm's NaFlex training loader, its batches in hubvit's input names (the grid of each image from
    its patches' coordinates)."""
    from timm.data import create_naflex_loader

    lengths = tuple(sorted({max(1, round(budget * n / TIMM_LENGTHS[-1])) for n in TIMM_LENGTHS}))
    loader = create_naflex_loader(
        Pairs(dataset),
        patch_size=patch,
        train_seq_lens=lengths,
        batch_size=BATCH,
        is_training=True,
        no_aug=augment == "none",
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        num_workers=0,
        use_prefetcher=False,
        pin_memory=False,
        device=torch.device("cpu"),
        seed=0,
    )
    out = []
    for batch, labels in loader:
        valid = batch["patch_valid"]
        shapes = (batch["patch_coord"].masked_fill(~valid[..., None], -1).amax(1) + 1).long()
        inputs = {"pixel_values": batch["patches"], "pixel_attention_mask": valid.long(), "spatial_shapes": shapes}
        out.append((inputs, labels))
    return out, lengths


def statistics_of(batches):
    positions = sum(inputs["pixel_attention_mask"].numel() for inputs, _ in batches)
    patches = sum(int(inputs["pixel_attention_mask"].sum()) for inputs, _ in batches)
    images = sum(len(labels) for _, labels in batches)
    return {
        "batches": len(batches),
        "images": images,
        "padding_share": 1 - patches / positions,
        "image_patches_per_image": patches / images,
    }


def epoch_seconds(model, batches):
    started = time.perf_counter()
    for inputs, labels in batches:
        loss = torch.nn.functional.cross_entropy(model(**inputs).logits, labels)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def measure(name, rounds, quick, augment="none"):
    from hubvit import HubViTConfig, HubViTForImageClassification

    patch, budget, fields = SETS[name]
    dataset = training_set(name, quick)
    orders = {order: hubvit_batches(dataset, patch, budget, order, augment) for order in ("random", "patch_count")}
    orders["timm schedule"], lengths = timm_batches(dataset, patch, budget, augment)
    side = int(np.sqrt(budget)) * patch
    config = HubViTConfig(
        image_size=side,
        patch_size=patch,
        intermediate_size=4 * fields["hidden_size"],
        num_labels=len(dataset.features["label"].names),
        **fields,
    )
    torch.manual_seed(0)
    model = HubViTForImageClassification(config).train()
    seconds = {order: [] for order in orders}
    shuffle = random.Random(0)
    for _ in range(rounds):
        for order in shuffle.sample(list(orders), len(orders)):
            seconds[order].append(epoch_seconds(model, orders[order]))
    rows = {}
    for order, batches in orders.items():
        row = statistics_of(batches)
        median = statistics.median(seconds[order])
        row["images_per_second"] = row["images"] / median
        row["image_patches_per_second"] = row["images"] * row["image_patches_per_image"] / median
        rows[order] = row
    return {"patch_size": patch, "budget": budget, "model": fields, "timm_lengths": lengths, "orders": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json", type=Path, default=None, help="also write the record here")
    parser.add_argument("--quick", action="store_true", help="small sets and one round (a smoke test)")
    parser.add_argument(
        "--augment",
        choices=("none", "inception"),
        default="none",
        help="inception: random crops of aspect ratio 3/4-4/3 (hubvit's `inception`, timm's RandomResizedCropToSequence)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    import timm

    from hubvit.cpu import cpu_isa

    isa = cpu_isa()
    print(f"CPU ISA {isa}, {args.threads} threads, torch {torch.__version__}, timm {timm.__version__}")
    records = {}
    for name in SETS:
        record = records[name] = measure(name, args.rounds, args.quick, args.augment)
        print(
            f"\n{name}: budget {record['budget']} patches of {record['patch_size']} px, batch {BATCH} "
            f"(timm: lengths {record['timm_lengths']}, {BATCH * max(record['timm_lengths'])} tokens per batch), "
            f"{args.rounds} rounds, augmentation {args.augment} ({isa}):"
        )
        base = record["orders"]["random"]["images_per_second"]
        for order, row in record["orders"].items():
            print(
                f"  {order:14} {row['batches']:4d} batches, {row['padding_share']:6.1%} padding, "
                f"{row['image_patches_per_image']:6.1f} image patches/image, {row['images_per_second']:7.1f} img/s "
                f"({row['images_per_second'] / base:4.2f}x random), {row['image_patches_per_second']:8.0f} patches/s"
            )
    if args.json:
        environment = {
            "cpu_isa": isa,
            "processor": platform.processor() or platform.machine(),
            "threads": args.threads,
            "torch": torch.__version__,
            "timm": timm.__version__,
        }
        record = {
            "environment": environment,
            "batch_size": BATCH,
            "rounds": args.rounds,
            "augment": args.augment,
            "sets": records,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
