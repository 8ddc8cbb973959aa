"""A local folder of parquet shards, surveyed before anything trains: from the footers and the label column only,
one line names the shard (and row) that cannot be read, lacks a column, or holds labels that are not class ids of
the same classes as the other shards; after a failure while reading, the shard and row of a broken image.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from ..errors import HubViTError


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


@dataclass(frozen=True)
class ParquetShards:
    """The parquet shards of one split that hold examples, their row counts, and the classes their labels name."""

    files: tuple[Path, ...]
    rows: tuple[int, ...]
    names: tuple[str, ...]


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def read_footer(file: Path, split: str):
    """(rows, features) of a parquet shard from its footer; features from datasets' schema metadata when it has some."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        footer = pq.ParquetFile(file)
        return footer.metadata.num_rows, datasets.Features.from_arrow_schema(footer.schema_arrow)
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError) as error:
        raise StreamingError(
            f"{split} shard {file} is not a readable parquet file ({first_line(error)}); expected a shard written by "
            "datasets, pandas or pyarrow"
        ) from None


def label_names(split: str, shards: list[tuple[Path, Any]], label_column: str) -> tuple[str, ...] | None:
    """The class names every shard's label feature gives (None: integers, names still to come from the values).
    Shards that disagree are refused: the same id would mean another class in each (datasets' own
    `concatenate_datasets` refuses such features too, rather than mapping them by name)."""
    (first, feature), *others = shards
    for file, other in others:
        if other == feature:
            continue
        if isinstance(other, datasets.ClassLabel) and isinstance(feature, datasets.ClassLabel):
            raise StreamingError(
                f"{split} shards {first} and {file} name their classes differently: {feature.names} and "
                f"{other.names}; expected the same class names, in the same order, in every shard"
            )
        raise StreamingError(
            f"{split} shards {first} and {file} store column {label_column!r} as {feature} and {other}; expected "
            "the same label type in every shard"
        )
    if isinstance(feature, datasets.ClassLabel):
        return tuple(feature.names)
    if isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint")):
        return None
    raise StreamingError(
        f"{split} shard {first}: column {label_column!r} holds {feature}; expected integer class ids or a "
        "datasets ClassLabel (use --label_column_name for another column)"
    )


def check_label_values(split: str, file: Path, label_column: str, names: tuple[str, ...] | None) -> int:
    """The largest label of a shard, read from its label column alone; a missing, negative or unknown one is
    refused with its row."""
    import pyarrow.parquet as pq

    try:
        values = pq.read_table(file, columns=[label_column]).column(0)
    except (OSError, ValueError) as error:
        raise StreamingError(f"{split} shard {file}: column {label_column!r} cannot be read ({first_line(error)})")
    if values.null_count:
        row = values.to_pylist().index(None)
        raise StreamingError(f"{split} shard {file}, row {row}: no label (null); expected a class id")
    labels = values.to_numpy()
    bad = np.flatnonzero((labels < 0) | (labels >= len(names) if names is not None else False))
    if bad.size:
        row = int(bad[0])
        expected = f"0..{len(names) - 1} ({len(names)} classes)" if names is not None else "a class id >= 0"
        raise StreamingError(
            f"{split} shard {file}, row {row}: label {int(labels[row])} is not a class; expected {expected}"
        )
    return int(labels.max())


def integer_names(count: int, given: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The class names of integer labels 0..count-1, on both data paths: `given` (--label_names) or `LABEL_i`, as
    transformers names classes it has no names for."""
    return tuple(given) if given else tuple(f"LABEL_{i}" for i in range(count))


def survey_parquet(
    folder: Path,
    split: str,
    image_column: str,
    label_column: str,
    names: tuple[str, ...] | None = None,
    given: tuple[str, ...] | None = None,
) -> ParquetShards:
    """The shards of `split` that hold examples, checked from their footers and label column: every one readable,
    with both columns, labels that are class ids of the same classes (`names`: those of the training shards).
    Integer labels without names are named by `integer_names` (each label is its class id, as a `ClassLabel` cast
    keeps it); with `given` names, a label beyond them is refused with its shard and row."""
    _, files = shard_files(folder, split)
    surveyed = [(file, *read_footer(file, split)) for file in files]
    full = [(file, rows, features) for file, rows, features in surveyed if rows]
    if not full:
        raise StreamingError(
            f"every {split} shard in {folder} is empty (0 rows): {', '.join(f.name for f in files)}; expected at "
            "least one example"
        )
    for file, _, features in full:
        for flag, column in (("--image_column_name", image_column), ("--label_column_name", label_column)):
            if column not in features:
                raise StreamingError(
                    f"{flag} {column!r} is not a column of {split} shard {file}; its columns: {sorted(features)}"
                )
    found = label_names(split, [(file, features[label_column]) for file, _, features in full], label_column)
    if names is not None and found is not None and found != names:
        raise StreamingError(
            f"{split} shard {full[0][0]} names its classes {list(found)}, the train shards {list(names)}; "
            "expected the same class names, in the same order"
        )
    known = found or names or (tuple(given) if given else None)
    largest = max(check_label_values(split, file, label_column, known) for file, _, _ in full)
    return ParquetShards(
        tuple(f for f, _, _ in full),
        tuple(r for _, r, _ in full),
        known or integer_names(largest + 1),
    )


@functools.lru_cache(maxsize=8)
def _cached_survey(key: tuple, folder: Path, split: str, image_column: str, label_column: str, names, given):
    return survey_parquet(folder, split, image_column, label_column, names, given)


def parquet_shards(
    folder: Path,
    split: str,
    image_column: str,
    label_column: str,
    names: tuple[str, ...] | None = None,
    given: tuple[str, ...] | None = None,
) -> ParquetShards:
    """`survey_parquet`, done once per process for unchanged files (the splits and the loader both need it)."""
    _, files = shard_files(folder, split)
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _cached_survey(key, folder, split, image_column, label_column, names, given)


def locate(files: list[Path] | None, image_column: str, payload: bytes | None) -> str:
    """The shard and row holding these image bytes: a broken image is named where a user can find it. Read only
    after a failure, row group by row group."""
    if not files or payload is None:
        return "an example"
    import pyarrow.parquet as pq

    for file in files:
        start = 0
        for batch in pq.ParquetFile(file).iter_batches(columns=[image_column]):
            column = batch.column(0)
            values = column.field("bytes") if hasattr(column, "field") else column
            for row, value in enumerate(values.to_pylist()):
                if value == payload:
                    return f"shard {file}, row {start + row}"
            start += len(batch)
    return "an example"


def broken_shard(files: list[Path] | None) -> str:
    """The first of `files` that pyarrow cannot read whole (a shard corrupted after its footer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for file in files or ():
        start = 0
        try:
            for batch in pq.ParquetFile(file).iter_batches():
                start += len(batch)
        except (pa.ArrowException, OSError):
            return f"shard {file}, after row {start},"
    return "a shard"
