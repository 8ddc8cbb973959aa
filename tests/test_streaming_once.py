"""Each example is read exactly once per epoch, by one process, in every epoch: checked per example id for 0-3
data-loader workers, several shuffle buffers, several epochs and a mid-epoch resume, on one and on two processes.

The shards hold 20, 20, 5 and 5 examples: two processes each read 25 of them in epoch 0, and a split that changed
between epochs would give them other counts (DDP then waits forever for the process that ran out). The loaders run
in a fresh interpreter (`__main__` below): data-loader workers forked from a pytest-xdist worker can cut it off from
its controller.
"""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

SIZES = (20, 20, 5, 5)
EPOCHS = 6  # datasets 5.2's shard order first splits these shards 10/40 in epoch 5
RESUME_EPOCH, RESUME_AFTER = 1, 2


def run_python(*args):
    """`python *args` in a fresh interpreter, offline."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, *map(str, args)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)


def write_id_shards(folder):
    """Four parquet shards of the sizes in SIZES; each image's pixels equal its id."""
    import pyarrow.parquet as pq
    from test_streaming import id_images

    dataset = id_images(sum(SIZES))
    start = 0
    for index, size in enumerate(SIZES):
        dataset.select(range(start, start + size)).to_parquet(str(folder / f"train-{index:05d}-of-00004.parquet"))
        start += size
    assert [pq.ParquetFile(f).metadata.num_rows for f in sorted(folder.glob("*.parquet"))] == list(SIZES)


def read_matrix(folder, rank, world, workers, buffers):
    """{(workers, buffer): {"len", "epochs": ids per epoch, "resumed": ids of the resumed epoch and the next}}."""
    from test_streaming import TO_TENSOR, ids_of

    from hubvit.training import streaming

    def loader(num_workers, buffer):
        return streaming.streaming_loader(
            str(folder), TO_TENSOR, 5, rank, world, buffer_size=buffer, seed=5, num_workers=num_workers
        )

    def epoch_ids(reader, epoch, stop=None):
        reader.set_epoch(epoch)
        ids, batches = [], 0
        for pixels, _ in reader:
            ids += ids_of(pixels)
            batches += 1
            if batches == stop:
                return ids, batches, reader.state_dict()
        return ids, batches, None

    found = {}
    for num_workers in workers:
        for buffer in buffers:
            whole = loader(num_workers, buffer)
            epochs = [epoch_ids(whole, epoch)[:2] for epoch in range(EPOCHS)]
            head, _, state = epoch_ids(loader(num_workers, buffer), RESUME_EPOCH, stop=RESUME_AFTER)
            resumed = loader(num_workers, buffer)
            resumed.load_state_dict(json.loads(json.dumps(state)))
            rest = epoch_ids(resumed, RESUME_EPOCH)[0]
            after = epoch_ids(resumed, RESUME_EPOCH + 1)[0]
            found[f"{num_workers},{buffer}"] = {
                "len": len(whole),
                "epochs": epochs,
                "resumed": [head + rest, after],
            }
    return found


def two_processes(folder, out, workers, buffers):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    Path(out, f"rank{rank}.json").write_text(json.dumps(read_matrix(folder, rank, world, workers, buffers)))


@pytest.fixture(scope="module")
def id_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ids")
    write_id_shards(folder)
    return folder


def run_matrix(folder, out, world, workers, buffers):
    result = run_python(__file__, folder, out, world, ",".join(map(str, workers)), ",".join(map(str, buffers)))
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


def assert_once_per_epoch(ranks, case):
    every = range(sum(SIZES))
    for epoch in range(EPOCHS):
        read = [r[case]["epochs"][epoch] for r in ranks]
        batches = [b for _, b in read]
        assert batches == [r[case]["len"] for r in ranks] and len(set(batches)) == 1, f"{case} epoch {epoch}"
        ids = Counter(i for ids, _ in read for i in ids)
        assert sorted(ids) == list(every) and set(ids.values()) == {1}, f"{case} epoch {epoch}: {ids}"
    for index, epoch in enumerate((RESUME_EPOCH, RESUME_EPOCH + 1)):
        resumed = [r[case]["resumed"][index] for r in ranks]
        assert resumed == [r[case]["epochs"][epoch][0] for r in ranks], f"{case}: resumed epoch {epoch}"


def test_one_process_reads_each_example_once_per_epoch_with_workers_and_after_a_resume(id_shards, tmp_path):
    (found,) = run_matrix(id_shards, tmp_path, 1, [0, 1, 2, 3], [0, 7, 16])
    assert len(found) == 12
    for case in found:
        assert_once_per_epoch([found], case)


def test_two_processes_read_each_example_once_in_equal_batch_counts_every_epoch(id_shards, tmp_path):
    ranks = run_matrix(id_shards, tmp_path, 2, [0, 1, 2, 3], [7])
    assert [r["0,7"]["len"] for r in ranks] == [5, 5], "25 examples each, in batches of 5"
    for case in ranks[0]:
        assert_once_per_epoch(ranks, case)


if __name__ == "__main__":
    folder, out, world = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    workers, buffers = ([int(v) for v in arg.split(",")] for arg in sys.argv[4:6])
    if world == 1:
        Path(out, "rank0.json").write_text(json.dumps(read_matrix(folder, 0, 1, workers, buffers)))
    else:
        from accelerate import debug_launcher

        debug_launcher(lambda: two_processes(folder, out, workers, buffers), num_processes=world)
