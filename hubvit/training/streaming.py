"""Streaming training data: any `datasets` source read as an `IterableDataset`, one part of the shards per process.

Three properties, each tested:

- Every example is read once per epoch by exactly one process, and every process reads the same number of batches
  in every epoch. Process r reads shards r, r + W, r + 2W, ... through `IterableDataset.shard(W, r, contiguous=False)`,
  taken before any epoch is set: datasets (5.2) re-orders the shards at every epoch > 0, and
  `split_dataset_by_node` splits after that re-ordering, so with shards of unequal sizes it would give a process other
  shards, and another example count, in each epoch (DDP then waits forever). The loader is never passed through
  `accelerator.prepare`, whose default for iterable data (`dispatch_batches=True`) would make rank 0 read everything
  and broadcast it.
- Shuffling with a bounded buffer: blocks of `buffer_size` consecutive examples, each permuted by a generator seeded
  with (seed, epoch, block). `datasets`' own `shuffle(buffer_size=...)` cannot resume exactly: its state does not hold
  the buffer (datasets 5.2, `BufferShuffledExamplesIterable.load_state_dict` refills it and the buffered examples are
  lost), so a resumed run would skip up to `buffer_size` examples.
- Mid-epoch resume through the data loader's state: a torchdata `StatefulDataLoader` over `StreamingImages`, whose
  state is the source's own `state_dict()` at the start of the current block plus the position inside it. Resuming
  re-reads at most one block. Checkpoints store each process's state as JSON (checkpoints.py), never as a pickle.

A local folder of parquet shards is checked before anything trains, from the footers and the label column only: one
line names the shard (and row) that cannot be read, lacks a column, or holds labels that are not class ids of the
same classes as the other shards. Images are decoded here, not by datasets, so a broken one is named by its shard
and row too.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch

from .checks import dataset_script, load_dataset, script_refused
from .shard_survey import (
    StreamingError,
    broken_shard,
    first_line,
    locate,
    parquet_shards,
    shard_files,
)


def open_stream(
    source: str,
    split: str = "train",
    config_name: str | None = None,
    label_column: str = "label",
    image_column: str = "image",
    label_names: tuple[str, ...] | None = None,
) -> datasets.IterableDataset:
    """An `IterableDataset` over `source`: a local folder of parquet or webdataset shards, or any name or path
    `datasets.load_dataset` takes. Its label column is a `ClassLabel` (webdataset labels get their names from
    `classes.txt` beside the shards) and its images stay undecoded (`StreamingImages` decodes them)."""
    folder = Path(source)
    if dataset_script(source) is not None:
        raise script_refused(source, dataset_script(source))
    if not folder.is_dir():
        stream = load_dataset(source, config_name, split=split, streaming=True)
    else:
        builder, files = shard_files(folder, split)
        names = None
        if builder == "parquet":
            surveyed = parquet_shards(folder, split, image_column, label_column, given=label_names)
            files, names = list(surveyed.files), surveyed.names
        stream = datasets.load_dataset(
            builder, data_files={split: [str(f) for f in files]}, split=split, streaming=True
        )
        listed = folder / "classes.txt"
        if builder == "webdataset" and listed.is_file() and label_column in (stream.features or {}):
            names = listed.read_text().split()
        if names is not None:
            stream = stream.cast_column(label_column, datasets.ClassLabel(names=list(names)))
    features = stream.features or {}
    for flag, column in (("--image_column_name", image_column), ("--label_column_name", label_column)):
        if column not in features:
            raise StreamingError(f"{flag} {column!r} is not a column of {source!r}; its columns: {sorted(features)}")
    if not isinstance(features[label_column], datasets.ClassLabel):
        raise StreamingError(
            f"column {label_column!r} of {source!r} is {features[label_column]}, not a class label; expected a "
            "datasets ClassLabel (or a local folder of parquet shards with integer labels)"
        )
    return stream.cast_column(image_column, datasets.Image(decode=False))


def shard_for_process(stream: datasets.IterableDataset, rank: int, world_size: int) -> datasets.IterableDataset:
    """This process's shards (r, r + W, r + 2W, ...), the same in every epoch; fewer shards than processes are
    refused (a process would read nothing). Whether the shards give equal batch counts is `streaming_loader`'s check."""
    if world_size == 1:
        return stream
    if stream.num_shards < world_size:
        raise StreamingError(
            f"{stream.num_shards} shard(s) cannot be split over {world_size} processes: each process reads whole "
            f"shards; expected at least {world_size} (rewrite them with scripts/write_shards.py --num_shards "
            f"{world_size})"
        )
    return stream.shard(world_size, rank, contiguous=False)


def rows_per_process(source: str, split: str, world_size: int, image_column: str, label_column: str):
    """Examples each process reads per epoch, from parquet footers (no data read); None when not knowable cheaply."""
    folder = Path(source)
    if not folder.is_dir() or shard_files(folder, split)[0] != "parquet":
        return None
    rows = parquet_shards(folder, split, image_column, label_column).rows
    return [sum(rows[rank::world_size]) for rank in range(world_size)]


class StreamingImages(torch.utils.data.IterableDataset):
    """(pixels, label) pairs from a stream, block-shuffled, with a state the data loader saves and restores.

    Augmentation randomness is a function of (seed, epoch, rank, worker, block, position) only, so a resumed run
    draws the same augmentations. `files`: this process's parquet shards, to name the one a bad example is in.
    """

    def __init__(
        self,
        stream: datasets.IterableDataset,
        transform: Callable,
        image_column: str = "image",
        label_column: str = "label",
        seed: int = 0,
        buffer_size: int = 1000,
        rank: int = 0,
        files: list[Path] | None = None,
    ):
        super().__init__()
        if buffer_size < 0:
            raise StreamingError(f"buffer_size must be >= 0 (0: no shuffling), got {buffer_size}")
        self.stream, self.transform = stream, transform
        self.image_column, self.label_column = image_column, label_column
        self.seed, self.buffer_size, self.rank = seed, buffer_size, rank
        self.files = files
        self.num_classes = len(stream.features[label_column].names)
        self.epoch = 0
        self._state: dict[str, Any] = {}
        self._resume: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Also the stream's epoch, set here before workers start: datasets keeps it in shared memory and updates it
        with a read-then-add, so workers setting it at once raced (one worker read another epoch's shard order)."""
        self.epoch = epoch
        self.stream.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = dict(state) if state else None

    def _order(self, epoch: int, worker: int, block: int, size: int) -> np.ndarray:
        if self.buffer_size <= 1:
            return np.arange(size)
        generator = np.random.default_rng([self.seed, epoch, self.rank, worker, block])
        return generator.permutation(size)

    def _decode(self, raw: Any):
        from PIL import Image, UnidentifiedImageError

        from .checks import TrainingInputError, checked_image, decompression_bomb_errors

        raw = raw or {}
        payload = raw.get("bytes")
        try:
            image = Image.open(io.BytesIO(payload) if payload is not None else raw["path"])
            return checked_image(image).convert("RGB")
        except (
            UnidentifiedImageError,
            OSError,
            ValueError,
            SyntaxError,
            KeyError,
            TypeError,
            TrainingInputError,
            *decompression_bomb_errors(),
        ) as error:
            where = locate(self.files, self.image_column, payload)
            if where == "an example" and raw.get("path"):
                where = f"image {raw['path']}"
            raise StreamingError(f"{where}: the image cannot be read ({first_line(error)})") from None

    def _example(self, example: dict, seed: list[int]):
        label = example[self.label_column]
        if label is None or not 0 <= int(label) < self.num_classes:
            where = locate(self.files, self.image_column, (example[self.image_column] or {}).get("bytes"))
            raise StreamingError(f"{where}: label {label!r} is not a class; expected 0..{self.num_classes - 1}")
        image = self._decode(example[self.image_column])
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(
                int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0] % (2**63))
            )
            pixels = self.transform(image)
        return pixels, int(label)

    def _fill(self, examples, size: int) -> list:
        import pyarrow as pa

        try:
            return [example for _, example in zip(range(size), examples)]
        except (pa.ArrowException, OSError) as error:
            raise StreamingError(f"{broken_shard(self.files)} cannot be read ({first_line(error)})") from None

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        resume, self._resume = self._resume, None
        if resume and resume["epoch"] != self.epoch:
            resume = None
        epoch = self.epoch
        block = resume["block"] if resume else 0
        skip = resume["position"] if resume else 0
        if resume and resume.get("block_start") is not None:
            self.stream.load_state_dict(resume["block_start"])
        examples = iter(self.stream)
        size = max(self.buffer_size, 1)
        while True:
            if resume:
                start = resume.get("block_start")
            else:
                start = self.stream.state_dict() if block else None
            buffer = self._fill(examples, size)
            if not buffer:
                break
            for position, index in enumerate(self._order(epoch, worker, block, len(buffer))):
                if position < skip:
                    continue
                self._state = {"epoch": epoch, "block": block, "block_start": start, "position": position + 1}
                yield self._example(buffer[index], [self.seed, epoch, self.rank, worker, block, position])
            skip, resume = 0, None
            block += 1
        self._state = {}


def collate(batch):
    pixels, labels = zip(*batch)
    return torch.stack(pixels), torch.tensor(labels, dtype=torch.long)


class StreamingLoader:
    """A `StatefulDataLoader` with a known number of batches per epoch (equal on every process, else refused) and
    this process's position as its state (plain lists and numbers, so a checkpoint stores it as JSON).

    Workers yield single examples and batches are formed here, so the batch count is ceil(examples / batch size)
    whatever the number of workers (worker-made batches would each end with a partial one). An epoch read from its
    start that gives another example count than promised stops with both numbers: the other processes would wait
    for this one's next batch forever."""

    def __init__(
        self,
        images: StreamingImages,
        batch_size: int,
        batches_per_epoch: int,
        num_examples: int,
        num_workers: int = 0,
        examples_per_epoch: int | None = None,
        collate_fn: Callable = collate,
    ):
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.images, self.batches_per_epoch, self.num_examples = images, batches_per_epoch, num_examples
        self.collate = collate_fn
        self.batch_size, self.examples_per_epoch = batch_size, examples_per_epoch
        self.loader = StatefulDataLoader(images, batch_size=None, num_workers=num_workers)
        self._resumed = False

    def __len__(self) -> int:
        return self.batches_per_epoch

    def set_epoch(self, epoch: int) -> None:
        self.images.set_epoch(epoch)

    def __iter__(self):
        resumed, self._resumed = self._resumed, False
        batch, read = [], 0
        for example in self.loader:
            batch.append(example)
            read += 1
            if len(batch) == self.batch_size:
                yield self.collate(batch)
                batch = []
        if batch:
            yield self.collate(batch)
        if not resumed and self.examples_per_epoch is not None and read != self.examples_per_epoch:
            raise StreamingError(
                f"process {self.images.rank} read {read} examples in epoch {self.images.epoch}; expected "
                f"{self.examples_per_epoch} (did the shards change during the run?)"
            )

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resumed = True
        self.loader.load_state_dict(state)


def count_by_reading(stream: datasets.IterableDataset, label_column: str) -> list[int]:
    """Examples of every process, counted by reading this process's label column once (sources without parquet
    footers: webdataset, the Hub); gathered so every process sees all counts."""
    mine = sum(1 for _ in stream.select_columns([label_column]))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        every = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, mine)
        return every
    return [mine]


def streaming_loader(
    source: str,
    transform: Callable,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    split: str = "train",
    config_name: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    seed: int = 0,
    buffer_size: int = 1000,
    num_workers: int = 0,
    num_examples: list[int] | None = None,
    collate_fn: Callable = collate,
) -> StreamingLoader:
    """This process's loader over `source`. Batches per epoch come from parquet footers or `num_examples` (examples
    per process); a layout that gives processes different batch counts is refused, as DDP would hang on it.
    `collate_fn` makes a batch of examples (NaFlex runs: patch sequences padded to the longest)."""
    stream = shard_for_process(open_stream(source, split, config_name, label_column, image_column), rank, world_size)
    counts = (
        num_examples
        or rows_per_process(source, split, world_size, image_column, label_column)
        or count_by_reading(stream, label_column)
    )
    batches = [math.ceil(n / batch_size) for n in counts]
    if len(set(batches)) > 1:
        raise StreamingError(
            f"the shards give the {world_size} processes {counts} examples, i.e. {batches} batches "
            f"of {batch_size}; expected equal batch counts (rewrite the shards with sizes that split "
            "evenly, or change the batch size)"
        )
    folder = Path(source)
    files = None
    if folder.is_dir() and shard_files(folder, split)[0] == "parquet":
        files = list(parquet_shards(folder, split, image_column, label_column).files)[rank::world_size]
    images = StreamingImages(stream, transform, image_column, label_column, seed, buffer_size, rank, files)
    return StreamingLoader(images, batch_size, batches[rank], sum(counts), num_workers, counts[rank], collate_fn)


def label_names_of(args: Any) -> tuple[str, ...] | None:
    """--label_names as a tuple (None when not given)."""
    text = getattr(args, "label_names", None)
    return tuple(name.strip() for name in text.split(",")) if text else None


def streaming_splits(args: Any):
    """(train stream, eval `Dataset`, provenance, eval split name) for `--streaming --dataset_name SOURCE`: training
    examples are streamed; the validation split (`validation-*` shards) is loaded as a map-style dataset, which
    evaluation on every process needs, with the training split's classes."""
    source = args.dataset_name
    if not source:
        raise StreamingError("--streaming needs --dataset_name (a folder of shards or a datasets source)")
    image_column, label_column = args.image_column_name, args.label_column_name
    given = label_names_of(args)
    train = open_stream(source, "train", args.dataset_config_name, label_column, image_column, given)
    names = tuple(train.features[label_column].names)
    folder = Path(source)
    try:
        if folder.is_dir():
            builder, files = shard_files(folder, "validation")
        else:
            evaluation = load_dataset(source, args.dataset_config_name, split="validation")
    except ValueError as error:
        raise StreamingError(f"--streaming needs a validation split in {source!r} ({error})") from None
    if folder.is_dir():
        if builder == "parquet":
            files = list(parquet_shards(folder, "validation", image_column, label_column, names).files)
        evaluation = datasets.load_dataset(
            builder, data_files={"validation": [str(f) for f in files]}, split="validation"
        )
    label = evaluation.features.get(label_column)
    if isinstance(label, datasets.ClassLabel) and tuple(label.names) != names:
        raise StreamingError(
            f"the validation split of {source!r} names its classes {label.names}, the train split {list(names)}; "
            "expected the same class names, in the same order"
        )
    if label is not None and not isinstance(label, datasets.ClassLabel):
        evaluation = evaluation.cast_column(label_column, datasets.ClassLabel(names=list(names)))
    if image_column in evaluation.features and not isinstance(evaluation.features[image_column], datasets.Image):
        evaluation = evaluation.cast_column(image_column, datasets.Image())
    if args.max_eval_samples:
        evaluation = evaluation.shuffle(seed=args.seed).select(range(min(args.max_eval_samples, len(evaluation))))
    return train, evaluation, f"streamed shards {source}", "validation"
