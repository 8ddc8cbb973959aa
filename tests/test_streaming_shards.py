"""Streamed parquet shards as users write them: datasets with a `ClassLabel`, pandas or pyarrow with plain integer
labels, and the ways they go wrong. Each bad folder stops before or during the first epoch with one line that names
the shard (and the row, where one row is at fault).
"""

import io
import struct
import zlib

import datasets
import numpy as np
import pandas
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from hubvit.training import streaming

TO_TENSOR = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


def png(value, size=4):
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def huge_png():
    """A valid 4x4 PNG whose header declares 30000 x 30000 pixels (CRC fixed), as a decompression bomb would."""
    data = bytearray(png(0))
    header = b"IHDR" + struct.pack(">II", 30000, 30000) + bytes(data[24:29])
    data[12:29] = header
    data[29:33] = struct.pack(">I", zlib.crc32(header))
    return bytes(data)


def write_pyarrow(path, ids, labels=None, images=None, image_column="image", label_column="label"):
    """A shard as pyarrow writes it: images as {bytes, path} structs, labels as plain int64 (no ClassLabel)."""
    images = images or [png(i) for i in ids]
    columns = {image_column: pa.array([{"bytes": b, "path": None} for b in images])}
    if label_column:
        columns[label_column] = pa.array([i % 3 for i in ids] if labels is None else labels)
    pq.write_table(pa.table(columns), path)


def write_classlabel(path, ids, names=("a", "b", "c"), labels=None):
    """A shard as `datasets` writes it: the `ClassLabel` names in the schema metadata."""
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(names))})
    images = [Image.fromarray(np.full((4, 4, 3), i, np.uint8)) for i in ids]
    labels = [i % 3 for i in ids] if labels is None else labels
    datasets.Dataset.from_dict({"image": images, "label": labels}, features=features).to_parquet(str(path))


def shard(folder, index, split="train"):
    return folder / f"{split}-{index:05d}-of-00004.parquet"


def read_ids(folder, **options):
    loader = streaming.streaming_loader(str(folder), TO_TENSOR, batch_size=4, buffer_size=0, **options)
    ids, labels = [], []
    for pixels, batch_labels in loader:
        ids += pixels[:, 0, 0, 0].mul(255).round().int().tolist()
        labels += batch_labels.tolist()
    return ids, labels, loader


def error_of(folder, **options):
    with pytest.raises(streaming.StreamingError) as caught:
        read_ids(folder, **options)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_shards_that_name_their_classes_differently_are_refused_with_both_lists(tmp_path):
    """Mapping by name would be a guess (a renamed class, a typo); datasets' `concatenate_datasets` refuses such
    features too."""
    write_classlabel(shard(tmp_path, 0), range(0, 6))
    write_classlabel(shard(tmp_path, 1), range(6, 12), names=("c", "b", "a"))
    message = error_of(tmp_path)
    assert f"train shards {shard(tmp_path, 0)} and {shard(tmp_path, 1)} name their classes differently" in message
    assert "['a', 'b', 'c'] and ['c', 'b', 'a']" in message


def test_a_validation_shard_naming_the_classes_differently_from_train_is_refused(tmp_path):
    from types import SimpleNamespace

    write_classlabel(shard(tmp_path, 0), range(0, 6))
    write_classlabel(shard(tmp_path, 0, "validation"), range(6, 9), names=("c", "b", "a"))
    args = SimpleNamespace(
        dataset_name=str(tmp_path),
        dataset_config_name=None,
        image_column_name="image",
        label_column_name="label",
        max_eval_samples=None,
        seed=0,
    )
    with pytest.raises(streaming.StreamingError) as caught:
        streaming.streaming_splits(args)
    message = str(caught.value)
    assert message.startswith(f"validation shard {shard(tmp_path, 0, 'validation')} names its classes ['c', 'b', 'a']")
    assert "the train shards ['a', 'b', 'c']" in message


@pytest.mark.parametrize("writer", ["pyarrow", "pandas"])
def test_integer_labels_written_by_pandas_or_pyarrow_stream_as_classes_named_label_i(tmp_path, writer):
    for index in range(2):
        ids = list(range(index * 6, index * 6 + 6))
        if writer == "pyarrow":
            write_pyarrow(shard(tmp_path, index), ids)
        else:
            frame = pandas.DataFrame({"image": [{"bytes": png(i), "path": None} for i in ids], "label": ids})
            frame["label"] = frame["label"] % 3
            frame.to_parquet(shard(tmp_path, index))
    assert pq.read_schema(shard(tmp_path, 0)).field("label").type == pa.int64()
    assert streaming.open_stream(str(tmp_path)).features["label"].names == ["LABEL_0", "LABEL_1", "LABEL_2"]
    ids, labels, _ = read_ids(tmp_path)
    assert ids == list(range(12)) and labels == [i % 3 for i in range(12)]


def test_one_empty_shard_out_of_four_is_skipped_and_the_rest_trains(tmp_path):
    """pyarrow writes an empty table as a file datasets cannot stream ("BatchSize must be greater than 0")."""
    for index, ids in enumerate([range(0, 4), range(4, 8), range(8, 12)]):
        write_classlabel(shard(tmp_path, (0, 1, 3)[index]), ids)
    pq.write_table(pq.read_table(shard(tmp_path, 0)).slice(0, 0), shard(tmp_path, 2))
    ids, _, loader = read_ids(tmp_path)
    assert ids == list(range(12)) and len(loader) == 3


def truncated(folder):
    write_pyarrow(shard(folder, 0), range(6))
    write_pyarrow(shard(folder, 1), range(6, 12))
    data = shard(folder, 1).read_bytes()
    shard(folder, 1).write_bytes(data[: len(data) // 2])
    return shard(folder, 1)


def corrupted(folder):
    write_pyarrow(shard(folder, 0), range(6))
    write_pyarrow(shard(folder, 1), range(6, 12))
    data = bytearray(shard(folder, 1).read_bytes())
    data[40:200] = bytes(b ^ 0x5A for b in data[40:200])
    shard(folder, 1).write_bytes(bytes(data))
    return shard(folder, 1)


def bad_image(folder, payload):
    write_pyarrow(shard(folder, 0), range(6))
    write_pyarrow(shard(folder, 1), range(6, 12), images=[png(i) for i in range(6, 9)] + [payload] + [png(10), png(11)])
    return shard(folder, 1)


def with_labels(folder, labels):
    """A second shard with datasets' `ClassLabel` metadata but labels written by pyarrow (datasets refuses them)."""
    write_classlabel(shard(folder, 0), range(6))
    table = pq.read_table(shard(folder, 0))
    table = table.set_column(1, "label", pa.array(labels, pa.int64()))
    pq.write_table(table.replace_schema_metadata(pq.read_schema(shard(folder, 0)).metadata), shard(folder, 1))
    return shard(folder, 1)


def all_empty(folder):
    write_classlabel(shard(folder, 0), range(0))
    write_classlabel(shard(folder, 1), range(0))
    return folder


def mixed_dtypes(folder):
    write_pyarrow(shard(folder, 0), range(6))
    write_pyarrow(shard(folder, 1), range(6, 12), labels=[str(i % 3) for i in range(6, 12)])
    return shard(folder, 1)


def write_columns(image_column, label_column):
    def write(folder):
        write_pyarrow(shard(folder, 0), range(6), image_column=image_column, label_column=label_column)
        return shard(folder, 0)

    return write


# (case, how the folder is written (returns the shard or folder the line must name), options, what the line says)
BAD_FOLDERS = [
    (
        "img/target schema",
        write_columns("img", "target"),
        {},
        r"--image_column_name 'image' is not a column of train shard .*; its columns: \['img', 'target'\]",
    ),
    (
        "no label column",
        write_columns("image", None),
        {},
        r"--label_column_name 'label' is not a column of train shard",
    ),
    (
        "--label_column_name not a column",
        write_columns("image", "label"),
        {"label_column": "labels"},
        r"--label_column_name 'labels' is not a column of train shard .*; its columns: \['image', 'label'\]",
    ),
    ("truncated bytes", truncated, {}, r"train shard .* is not a readable parquet file \(ArrowInvalid"),
    ("corrupted bytes", corrupted, {}, r"shard .*, after row 0, cannot be read \(OSError: Corrupt snappy"),
    ("every shard empty", all_empty, {}, r"every train shard in .* is empty \(0 rows\)"),
    (
        "label outside",
        lambda f: with_labels(f, [0, 1, 2, 5, 0, 1]),
        {},
        r", row 3: label 5 is not a class; expected 0..2",
    ),
    ("label -1", lambda f: with_labels(f, [0, -1, 2, 0, 1, 2]), {}, r", row 1: label -1 is not a class; expected 0..2"),
    (
        "image 30000 x 30000",
        lambda f: bad_image(f, huge_png()),
        {},
        r", row 3: the image cannot be read \(DecompressionBombError: Image size \(900000000 pixels\)",
    ),
    (
        "image bytes not an image",
        lambda f: bad_image(f, b"\x89PNG\r\n\x1a\n not really"),
        {},
        r", row 3: the image cannot be read \(UnidentifiedImageError",
    ),
    (
        "mixed label dtypes",
        mixed_dtypes,
        {},
        r"train shards .*00000.* and .*00001.* store column 'label' as Value\('int64'\) and Value\('string'\)",
    ),
]


@pytest.mark.parametrize(
    ("writer", "options", "expected"), [c[1:] for c in BAD_FOLDERS], ids=[c[0] for c in BAD_FOLDERS]
)
def test_a_bad_shard_folder_stops_with_one_line_naming_the_shard(tmp_path, writer, options, expected):
    named = writer(tmp_path)
    message = error_of(tmp_path, **{"image_column": "image", **options})
    assert str(named) in message
    assert __import__("re").search(expected, message), message


@pytest.mark.heavy
def test_two_processes_train_six_epochs_on_integer_label_shards_of_unequal_sizes(tmp_path):
    """`accelerate launch` of two gloo processes over pyarrow shards of 20, 20, 5 and 5 examples: each process reads
    25 in every epoch (datasets 5.2's own split gave them 10 and 40 in epoch 5, and DDP waited forever)."""
    import json
    import os
    import subprocess
    import sys

    data = tmp_path / "shards"
    data.mkdir()
    start = 0
    for index, size in enumerate((20, 20, 5, 5)):
        write_pyarrow(shard(data, index), range(start, start + size))
        start += size
    write_pyarrow(shard(data, 0, "validation"), range(6))
    script = tmp_path / "train.py"
    options = {
        "streaming": True,
        "dataset_name": str(data),
        "output_dir": str(tmp_path / "out"),
        "image_size": 16,
        "config_overrides": "patch_size=4,hidden_size=32,num_hidden_layers=2,intermediate_size=64",
        "per_device_train_batch_size": 5,
        "num_train_epochs": 6,
        "shuffle_buffer": 8,
    }
    script.write_text(f"from hubvit.training import train\ntrain(**{options!r})\n")
    command = [
        *(sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1"),
        *("--num_processes", "2", "--main_process_port", "0", str(script)),
    ]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=480, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert (results["num_processes"], results["global_step"], results["train_samples"]) == (2, 30, 50)
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}


def pyarrow_folder(folder, train_labels, validation_labels):
    """A folder of shards as pyarrow writes them ({bytes, path} images, plain int64 labels): two train, one
    validation."""
    folder.mkdir()
    half = len(train_labels) // 2
    for index, labels in enumerate((train_labels[:half], train_labels[half:])):
        write_pyarrow(shard(folder, index), range(len(labels)), labels=labels)
    write_pyarrow(shard(folder, 0, "validation"), range(len(validation_labels)), labels=validation_labels)
    return folder


def train_once(folder, out, streamed, **options):
    import json

    from hubvit.training import train

    train(
        dataset_name=str(folder),
        streaming=streamed,
        output_dir=str(out),
        image_size=16,
        config_overrides="patch_size=4,hidden_size=32,num_hidden_layers=1,intermediate_size=64",
        per_device_train_batch_size=4,
        max_train_steps=1,
        **options,
    )
    return json.loads((out / "model" / "config.json").read_text())["id2label"]


@pytest.mark.heavy
@pytest.mark.parametrize("names", [None, "cat,dog,owl"])
def test_pyarrow_shards_train_the_same_model_streamed_or_loaded(tmp_path, names):
    """Issue 50: the same folder trained when streamed and was refused when loaded (image struct, int64 labels).
    Both paths now decode the bytes and name the classes by one rule: --label_names, else LABEL_i."""
    folder = pyarrow_folder(tmp_path / "shards", [0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 2, 2])
    options = {"label_names": names} if names else {}
    streamed = train_once(folder, tmp_path / "streamed", True, **options)
    loaded = train_once(folder, tmp_path / "loaded", False, **options)
    expected = names.split(",") if names else ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert streamed == loaded == {str(i): name for i, name in enumerate(expected)}


@pytest.mark.parametrize("streamed", [True, False])
def test_a_label_beyond_the_given_names_is_refused_naming_its_row(tmp_path, streamed):
    """Streamed, the row within its shard (`train-00001`, row 3); loaded, within the train split (row 7)."""
    from hubvit.errors import HubViTError

    folder = pyarrow_folder(tmp_path / "shards", [0, 1, 0, 1, 0, 1, 0, 5], [0, 1])
    where = r"train-00001-of-00004\.parquet, row 3" if streamed else r"split 'train', row 7"
    with pytest.raises(HubViTError, match=where + r": label 5 is not a class; expected 0\.\.1 \(2 classes"):
        train_once(folder, tmp_path / "out", streamed, label_names="a,b")
