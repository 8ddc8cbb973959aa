"""Streaming training data: any `datasets` source read as an `IterableDataset`, one part of the shards per process.

Three properties, each tested:

- Every example is read once per epoch by exactly one process. `datasets.distributed.split_dataset_by_node` assigns
  whole shards only when the shard count is a multiple of the world size; otherwise it makes every process read every
  example and skip the others' (datasets #6623, #5961), so that case is refused here with the numbers. The loader is
  never passed through `accelerator.prepare`, whose default for iterable data (`dispatch_batches=True`) would make
  rank 0 read everything and broadcast it.
- Shuffling with a bounded buffer: blocks of `buffer_size` consecutive examples, each permuted by a generator seeded
  with (seed, epoch, block). `datasets`' own `shuffle(buffer_size=...)` cannot resume exactly: its state does not hold
  the buffer (datasets 5.2, `BufferShuffledExamplesIterable.load_state_dict` refills it and the buffered examples are
  lost), so a resumed run would skip up to `buffer_size` examples.
- Mid-epoch resume through the data loader's state: a torchdata `StatefulDataLoader` over `StreamingImages`, whose
  state is the source's own `state_dict()` at the start of the current block plus the position inside it. Resuming
  re-reads at most one block. Checkpoints store each process's state as JSON (checkpoints.py), never as a pickle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch

from hubvit.errors import HubViTError


class StreamingError(HubViTError):
    """A streaming source or layout that cannot give each process its own examples."""


def shard_files(folder: Path, split: str) -> tuple[str, list[Path]]:
    """(builder, files) of a folder of shards: `{split}-*.parquet` or `{split}-*.tar` (webdataset)."""
    for builder, suffix in (("parquet", "parquet"), ("webdataset", "tar")):
        files = sorted(folder.glob(f"{split}-*.{suffix}"))
        if not files and split == "train":
            files = [f for f in sorted(folder.glob(f"*.{suffix}")) if not f.name.startswith(("validation", "test"))]
        if files:
            return builder, files
    raise StreamingError(f"folder {str(folder)!r} has no {split}-*.parquet or {split}-*.tar shards")


def open_stream(
    source: str, split: str = "train", config_name: str | None = None, label_column: str = "label"
) -> datasets.IterableDataset:
    """An `IterableDataset` over `source`: a local folder of parquet or webdataset shards, or any name or path
    `datasets.load_dataset` takes. Webdataset labels get their class names from `classes.txt` beside the shards."""
    folder = Path(source)
    if not folder.is_dir():
        return datasets.load_dataset(source, config_name, split=split, streaming=True)
    builder, files = shard_files(folder, split)
    stream = datasets.load_dataset(builder, data_files={split: [str(f) for f in files]}, split=split, streaming=True)
    names = folder / "classes.txt"
    if builder == "webdataset" and names.is_file() and label_column in (stream.features or {}):
        stream = stream.cast_column(label_column, datasets.ClassLabel(names=names.read_text().split()))
    return stream


def shard_for_process(stream: datasets.IterableDataset, rank: int, world_size: int) -> datasets.IterableDataset:
    """This process's shards; refuses a shard count the world size does not divide (every process would read all)."""
    if world_size == 1:
        return stream
    if stream.num_shards % world_size:
        raise StreamingError(
            f"{stream.num_shards} shards cannot be split over {world_size} processes: datasets would make every "
            f"process read every example; expected a multiple of {world_size} shards (rewrite them with "
            f"scripts/write_shards.py --num_shards {world_size * max(1, stream.num_shards // world_size)})"
        )
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(stream, rank=rank, world_size=world_size)


def rows_per_process(source: str, split: str, world_size: int) -> list[int] | None:
    """Examples each process reads per epoch, from parquet footers (no data read); None when not knowable cheaply.

    `split_dataset_by_node` gives rank r the shards r, r + W, r + 2W, ... (datasets 5.2; the counting test checks it).
    """
    folder = Path(source)
    if not folder.is_dir():
        return None
    builder, files = shard_files(folder, split)
    if builder != "parquet":
        return None
    import pyarrow.parquet as pq

    rows = [pq.ParquetFile(f).metadata.num_rows for f in files]
    return [sum(rows[rank::world_size]) for rank in range(world_size)]


class StreamingImages(torch.utils.data.IterableDataset):
    """(pixels, label) pairs from a stream, block-shuffled, with a state the data loader saves and restores.

    Augmentation randomness is a function of (seed, epoch, rank, worker, block, position) only, so a resumed run
    draws the same augmentations.
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
    ):
        super().__init__()
        if buffer_size < 0:
            raise StreamingError(f"buffer_size must be >= 0 (0: no shuffling), got {buffer_size}")
        self.stream, self.transform = stream, transform
        self.image_column, self.label_column = image_column, label_column
        self.seed, self.buffer_size, self.rank = seed, buffer_size, rank
        self.epoch = 0
        self._state: dict[str, Any] = {}
        self._resume: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = dict(state) if state else None

    def _order(self, epoch: int, worker: int, block: int, size: int) -> np.ndarray:
        if self.buffer_size <= 1:
            return np.arange(size)
        generator = np.random.default_rng([self.seed, epoch, self.rank, worker, block])
        return generator.permutation(size)

    def _example(self, example: dict, seed: list[int]):
        image = example[self.image_column].convert("RGB")
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(
                int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0] % (2**63))
            )
            pixels = self.transform(image)
        return pixels, int(example[self.label_column])

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        resume, self._resume = self._resume, None
        if resume and resume["epoch"] != self.epoch:
            resume = None
        epoch = resume["epoch"] if resume else self.epoch
        block = resume["block"] if resume else 0
        skip = resume["position"] if resume else 0
        if resume and resume.get("block_start") is not None:
            self.stream.load_state_dict(resume["block_start"])
        self.stream.set_epoch(epoch)
        examples = iter(self.stream)
        size = max(self.buffer_size, 1)
        while True:
            if resume:
                start = resume.get("block_start")
            else:
                start = self.stream.state_dict() if block else None
            buffer = [example for _, example in zip(range(size), examples)]
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
    whatever the number of workers (worker-made batches would each end with a partial one)."""

    def __init__(
        self, images: StreamingImages, batch_size: int, batches_per_epoch: int, num_examples: int, num_workers: int = 0
    ):
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.images, self.batches_per_epoch, self.num_examples = images, batches_per_epoch, num_examples
        self.batch_size = batch_size
        self.loader = StatefulDataLoader(images, batch_size=None, num_workers=num_workers)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def set_epoch(self, epoch: int) -> None:
        self.images.set_epoch(epoch)

    def __iter__(self):
        batch = []
        for example in self.loader:
            batch.append(example)
            if len(batch) == self.batch_size:
                yield collate(batch)
                batch = []
        if batch:
            yield collate(batch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
) -> StreamingLoader:
    """This process's loader over `source`. Batches per epoch come from parquet footers or `num_examples` (examples
    per process); a layout that gives processes different batch counts is refused, as DDP would hang on it."""
    stream = shard_for_process(open_stream(source, split, config_name, label_column), rank, world_size)
    counts = num_examples or rows_per_process(source, split, world_size) or count_by_reading(stream, label_column)
    batches = [math.ceil(n / batch_size) for n in counts]
    if len(set(batches)) > 1:
        raise StreamingError(
            f"the shards give the {world_size} processes {counts} examples, i.e. {batches} batches "
            f"of {batch_size}; expected equal batch counts (rewrite the shards with sizes that split "
            "evenly, or change the batch size)"
        )
    images = StreamingImages(stream, transform, image_column, label_column, seed, buffer_size, rank)
    return StreamingLoader(images, batch_size, batches[rank], sum(counts), num_workers)


def streaming_splits(args: Any):
    """(train stream, eval `Dataset`, provenance, eval split name) for `--streaming --dataset_name SOURCE`: training
    examples are streamed; the validation split (`validation-*` shards) is loaded as a map-style dataset, which
    evaluation on every process needs."""
    source = args.dataset_name
    if not source:
        raise StreamingError("--streaming needs --dataset_name (a folder of shards or a datasets source)")
    train = open_stream(source, "train", args.dataset_config_name, args.label_column_name)
    folder = Path(source)
    try:
        if folder.is_dir():
            builder, files = shard_files(folder, "validation")
            evaluation = datasets.load_dataset(
                builder, data_files={"validation": [str(f) for f in files]}, split="validation"
            )
        else:
            evaluation = datasets.load_dataset(source, args.dataset_config_name, split="validation")
    except (StreamingError, ValueError) as error:
        raise StreamingError(f"--streaming needs a validation split in {source!r} ({error})") from None
    if args.max_eval_samples:
        evaluation = evaluation.shuffle(seed=args.seed).select(range(min(args.max_eval_samples, len(evaluation))))
    return train, evaluation, f"streamed shards {source}", "validation"
