"""hubvit/training/streaming.py: each example read once per epoch by exactly one process, buffer shuffling, exact resume.

The images carry their id as their pixel value, so what a process read is visible in the batches themselves.
"""

import json
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from hubvit.training import shards, streaming

TO_TENSOR = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


def id_images(n):
    """n images whose pixels all equal their id (ids < 256), three classes."""
    features = datasets.Features(
        {"id": datasets.Value("int64"), "image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])}
    )
    images = [Image.fromarray(np.full((4, 4, 3), i, np.uint8)) for i in range(n)]
    return datasets.Dataset.from_dict(
        {"id": list(range(n)), "image": images, "label": [i % 3 for i in range(n)]}, features=features
    )


def ids_of(pixels):
    return pixels[:, 0, 0, 0].mul(255).round().int().tolist()


@pytest.fixture(scope="module")
def parquet_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    shards.write_shards(id_images(48), folder, num_shards=4, shuffle_seed=None)
    return folder


def read_epoch(loader, epoch=0, stop=None):
    loader.set_epoch(epoch)
    seen = []
    for step, (pixels, _) in enumerate(loader):
        seen.append(ids_of(pixels))
        if stop is not None and step + 1 == stop:
            return seen, loader.state_dict()
    return seen, None


def count_on_two_processes(folder, out):
    """Run under accelerate.debug_launcher (a gloo process group over a file store; Accelerate 1.16's PartialState
    does not see it there, so ranks come from torch.distributed): each process records its ids and batch count."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    loader = streaming.streaming_loader(
        str(folder), TO_TENSOR, batch_size=5, rank=rank, world_size=world, buffer_size=8, seed=3
    )
    seen, _ = read_epoch(loader)
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"world": world, "backend": dist.get_backend(), "ids": seen, "len": len(loader)})
    )


def test_two_processes_read_every_example_exactly_once(parquet_shards, tmp_path):
    """The launcher forks its processes, so it runs in a fresh interpreter (`__main__` below; tests/conftest.py)."""
    from test_reliability import run_python

    result = run_python(__file__, "ranks", parquet_shards, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in runs] == [2, 2] and runs[0]["backend"] == "gloo"
    read = [[i for batch in r["ids"] for i in batch] for r in runs]
    assert sorted(read[0] + read[1]) == list(range(48))
    assert not set(read[0]) & set(read[1])
    assert [len(r["ids"]) for r in runs] == [r["len"] for r in runs] == [5, 5]


def test_buffer_shuffles_within_the_epoch_and_differs_between_epochs(parquet_shards):
    loader = streaming.streaming_loader(str(parquet_shards), TO_TENSOR, batch_size=6, buffer_size=16, seed=0)
    first = [i for b in read_epoch(loader, 0)[0] for i in b]
    second = [i for b in read_epoch(loader, 1)[0] for i in b]
    assert sorted(first) == sorted(second) == list(range(48))
    assert first != list(range(48)) and first != second
    assert all(sorted(first[k : k + 16]) == list(range(k, k + 16)) for k in range(0, 48, 16)), "blocks of 16"


def test_buffer_zero_keeps_the_shard_order(parquet_shards):
    loader = streaming.streaming_loader(str(parquet_shards), TO_TENSOR, batch_size=7, buffer_size=0)
    assert [i for b in read_epoch(loader)[0] for i in b] == list(range(48))


@pytest.mark.parametrize("stop", [1, 3, 5])
def test_resumed_mid_epoch_sees_the_same_examples_as_uninterrupted(parquet_shards, stop):
    def loader():
        return streaming.streaming_loader(str(parquet_shards), TO_TENSOR, batch_size=5, buffer_size=16, seed=7)

    whole = [read_epoch(loader(), epoch)[0] for epoch in (0, 1)]
    first, state = read_epoch(loader(), 0, stop=stop)
    state = json.loads(json.dumps(state))
    resumed = loader()
    resumed.load_state_dict(state)
    rest, _ = read_epoch(resumed, 0)
    assert first + rest == whole[0]
    assert read_epoch(resumed, 1)[0] == whole[1], "the epoch after the resumed one starts afresh"


def test_augmentations_replay_after_resume(parquet_shards):
    noisy = v2.Compose([TO_TENSOR, v2.RandomErasing(p=0.5, value=0.5)])

    def loader():
        return streaming.streaming_loader(str(parquet_shards), noisy, batch_size=4, buffer_size=8, seed=1)

    whole = list(loader())
    uninterrupted = loader()
    iterator = iter(uninterrupted)
    head = [next(iterator) for _ in range(2)]
    resumed = loader()
    resumed.load_state_dict(uninterrupted.state_dict())
    tail = list(resumed)
    assert len(head) + len(tail) == len(whole)
    for (a, _), (b, _) in zip(head + tail, whole):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fewer_shards_than_processes_are_refused(parquet_shards):
    stream = streaming.open_stream(str(parquet_shards))
    with pytest.raises(streaming.StreamingError, match=r"4 shard\(s\) cannot be split over 5 processes.*at least 5"):
        streaming.shard_for_process(stream, 0, 5)


def test_a_shard_count_the_world_size_does_not_divide_trains_when_the_batch_counts_agree(tmp_path):
    """Whole shards per process, fixed for the run: 3 shards of 8, 8 and 16 give two processes 16 examples each."""
    folder = tmp_path / "shards"
    folder.mkdir()
    dataset = id_images(32)
    for index, rows in enumerate((range(0, 8), range(8, 24), range(24, 32))):
        dataset.select(rows).to_parquet(str(folder / f"train-{index:05d}-of-00003.parquet"))
    loaders = [streaming.streaming_loader(str(folder), TO_TENSOR, 4, rank, 2, buffer_size=0) for rank in (0, 1)]
    read = [[i for b in read_epoch(loader)[0] for i in b] for loader in loaders]
    assert [len(loader) for loader in loaders] == [4, 4]
    assert read == [list(range(0, 8)) + list(range(24, 32)), list(range(8, 24))]


def test_unequal_batch_counts_are_refused(tmp_path):
    shards.write_shards(id_images(21), tmp_path, num_shards=2, shuffle_seed=None)
    with pytest.raises(streaming.StreamingError, match=r"\[11, 10\] examples, i.e. \[3, 2\] batches"):
        streaming.streaming_loader(str(tmp_path), TO_TENSOR, batch_size=5, rank=0, world_size=2)


def test_an_epoch_that_reads_another_count_than_promised_stops_naming_both(parquet_shards):
    """The other processes would wait for this one's missing batch forever; an error ends the launch instead."""
    loader = streaming.streaming_loader(str(parquet_shards), TO_TENSOR, batch_size=5, num_examples=[50])
    with pytest.raises(streaming.StreamingError, match="process 0 read 48 examples in epoch 0; expected 50"):
        read_epoch(loader)


def test_webdataset_shards_stream_with_their_class_names(tmp_path):
    shards.write_shards(id_images(12), tmp_path, num_shards=2, format="webdataset", shuffle_seed=None)
    stream = streaming.open_stream(str(tmp_path), label_column="cls", image_column="png")
    assert stream.features["cls"].names == ["a", "b", "c"]
    loader = streaming.streaming_loader(
        str(tmp_path), TO_TENSOR, batch_size=4, image_column="png", label_column="cls", buffer_size=0
    )
    assert len(loader) == 3 and loader.num_examples == 12, "counted by reading the labels"
    batches = list(loader)
    assert [i for p, _ in batches for i in ids_of(p)] == list(range(12))
    assert [y for _, labels in batches for y in labels.tolist()] == [i % 3 for i in range(12)]


def two_worker_epochs(folder):
    """Batches of a whole epoch, of its first 4 batches and of the rest resumed from their state, read by two
    workers; run in a fresh process (`__main__` below): forked from a pytest-xdist worker, these workers cut it off
    from the controller in some full test runs (tests/test_reliability_training.py: bad_image_run)."""

    def loader():
        return streaming.streaming_loader(str(folder), TO_TENSOR, batch_size=5, buffer_size=8, seed=2, num_workers=2)

    whole, _ = read_epoch(loader())
    first, state = read_epoch(loader(), stop=4)
    resumed = loader()
    resumed.load_state_dict(state)
    return {"whole": whole, "promised": len(loader()), "first": first, "rest": read_epoch(resumed)[0]}


def test_two_workers_read_every_example_once_in_the_promised_batch_count_and_resume(parquet_shards):
    from test_reliability import run_python

    result = run_python(__file__, "epochs", parquet_shards)
    assert result.returncode == 0, result.stderr[-3000:]
    epochs = json.loads(result.stdout.strip().splitlines()[-1])
    whole = epochs["whole"]
    assert sorted(i for b in whole for i in b) == list(range(48)) and len(whole) == epochs["promised"] == 10
    assert epochs["first"] + epochs["rest"] == whole


@pytest.mark.heavy
def test_finetune_resumed_from_a_mid_epoch_checkpoint_ends_with_the_uninterrupted_weights(tmp_path):
    """finetune.py --streaming: checkpoint at update 2 of 6 (epoch of 6 batches), resume in a new run, same weights
    and EMA: the checkpoint carries the loader's position (JSON) and the EMA (safetensors), nothing pickled by us,
    so the resumed run reads the same remaining batches."""
    import shutil

    from safetensors.torch import load_file
    from test_finetune import TINY_MODEL, run_in_process

    data = tmp_path / "shards"
    shards.write_shards(id_images(24), data, num_shards=2, shuffle_seed=0)
    shards.write_shards(id_images(6), data, num_shards=1, split="validation", shuffle_seed=None)

    def run(out, *extra):
        return run_in_process(
            [
                "--streaming",
                "--dataset_name",
                str(data),
                *TINY_MODEL,
                "--per_device_train_batch_size",
                "4",
                "--max_train_steps",
                "6",
                "--shuffle_buffer",
                "8",
                "--random_erasing",
                "0.5",
                "--checkpointing_steps",
                "2",
                "--seed",
                "4",
                "--ema_decay",
                "0.5",
                "--output_dir",
                str(out),
                *extra,
            ]
        )

    assert run(tmp_path / "whole") == 0
    saved = {p.name for p in (tmp_path / "whole" / "checkpoints" / "checkpoint_2").iterdir()}
    assert {"data_loader_state_0.json", "model_ema.safetensors", "trainer_state.json"} <= saved
    assert not [name for name in saved if name.startswith("custom_checkpoint")], "nothing registered to be pickled"
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "checkpoint_2", tmp_path / "checkpoint_2")
    assert run(tmp_path / "resumed", "--resume_from_checkpoint", str(tmp_path / "checkpoint_2")) == 0
    for folder in ("model", "model_ema"):
        whole = load_file(tmp_path / "whole" / folder / "model.safetensors")
        resumed = load_file(tmp_path / "resumed" / folder / "model.safetensors")
        for key in whole:
            torch.testing.assert_close(resumed[key], whole[key], rtol=0, atol=0, msg=f"{folder} {key}")


def test_write_shards_cli_writes_an_imagefolder_as_train_and_validation_shards(tmp_path):
    import subprocess

    import pyarrow.parquet as pq
    from test_finetune import ENV, ROOT, write_imagefolder

    folder = write_imagefolder(tmp_path / "train", ["cat", "dog"], per_class=10)
    out = tmp_path / "shards"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "write_shards.py"),
            "--output_dir",
            str(out),
            "--num_shards",
            "4",
            "--train_dir",
            str(folder),
            "--validation_fraction",
            "0.2",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    train = sorted(out.glob("train-*.parquet"))
    assert [p.name for p in train] == [f"train-{i:05d}-of-00004.parquet" for i in range(4)]
    assert [pq.ParquetFile(p).metadata.num_rows for p in train] == [4, 4, 4, 4]
    assert pq.ParquetFile(next(out.glob("validation-*.parquet"))).metadata.num_rows == 4
    stream = streaming.open_stream(str(out))
    assert stream.features["label"].names == ["cat", "dog"]
    again = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "write_shards.py"),
            "--output_dir",
            str(out),
            "--num_shards",
            "4",
            "--train_dir",
            str(folder),
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 2 and "already holds train-* shards" in again.stderr


def test_embedded_digits_shard_into_equal_parts_keeping_every_id(tmp_path):
    digits = shards.embedded_digits()
    paths = shards.write_shards(digits, tmp_path, num_shards=8)
    import pyarrow.parquet as pq

    ids = [i for p in paths for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()]
    assert sorted(ids) == list(range(5000)) and ids != list(range(5000)), "all ids, shuffled"
    assert {pq.ParquetFile(p).metadata.num_rows for p in paths} == {625}


@pytest.mark.parametrize("num_shards", [0, 21, 2.5])
def test_a_shard_count_outside_one_to_the_example_count_is_refused(tmp_path, num_shards):
    with pytest.raises(shards.ShardError, match=rf"num_shards must be an int in \[1, 20\].*got {num_shards}"):
        shards.write_shards(id_images(20), tmp_path, num_shards=num_shards)


if __name__ == "__main__":
    if sys.argv[1] == "ranks":
        from accelerate import debug_launcher

        debug_launcher(lambda: count_on_two_processes(sys.argv[2], sys.argv[3]), num_processes=2)
    else:
        print(json.dumps(two_worker_epochs(sys.argv[2])))
