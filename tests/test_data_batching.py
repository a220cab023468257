"""Batching limits, padding, shard distribution over ranks, the prefetch thread, buffer reuse.

Run as a script under ``mpirun`` (``python test_data_batching.py CORPUS OUT_DIR``) it writes each rank's
shard, for the real multi-process test at the end.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import pytest

from engine.datasets import (Batch, BatchOptions, BatchPrefetcher, DataKeyInfo, HDFDataset, HDFWriter,
                             NpzDataset, generate_batches, plan_batches)
from engine.runtime import log
from engine.runtime.errors import ConfigError


def make_corpus(folder, num_seqs=80, seed=0) -> str:
    rng = np.random.RandomState(seed)
    path = os.path.join(str(folder), "corpus.hdf")
    keys = {"data": DataKeyInfo(dim=3), "classes": DataKeyInfo(dim=4, sparse=True)}
    with HDFWriter(path, keys) as writer:
        for i in range(num_seqs):
            n = int(rng.randint(0, 40))
            writer.insert(f"seq-{i}", {"data": rng.standard_normal((n, 3)).astype(np.float32),
                                       "classes": rng.randint(0, 4, n // 2).astype(np.int32)})
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("batching"))


@pytest.fixture
def default_log():
    """Single-process logging at the default verbosity, whatever earlier tests configured."""
    log.init()
    yield
    log.close()


def epoch_batches(ds, **kwargs) -> list[Batch]:
    shard = {k: kwargs.pop(k) for k in ("shard_rank", "shard_size") if k in kwargs}
    return list(generate_batches(ds, BatchOptions(**kwargs), **shard))


@pytest.mark.tf_latest
@pytest.mark.parametrize("batch_size, max_seqs", [(40, -1), (100, 3), (1000, 7), (39, 1)])
def test_limits_never_exceeded_and_every_sequence_once(corpus, batch_size, max_seqs):
    ds = HDFDataset(corpus, seq_ordering="random")
    ds.init_seq_order(3)
    batches = epoch_batches(ds, batch_size=batch_size, max_seqs=max_seqs)
    for b in batches:
        for key, arr in b.data.items():
            assert arr.shape[0] * arr.shape[1] <= batch_size
            assert arr.shape[1] == (b.lengths[key].max() if b.num_seqs else 0)
        assert max_seqs == -1 or b.num_seqs <= max_seqs
    positions = np.concatenate([b.seq_idx for b in batches])
    np.testing.assert_array_equal(positions, np.arange(ds.num_seqs))  # in epoch order, none twice


@pytest.mark.tf_latest
def test_batch_contents_padding_and_bookkeeping(corpus):
    ds = HDFDataset(corpus, seq_ordering="sorted_reverse")
    ds.init_seq_order(1)
    for b in epoch_batches(ds, batch_size=120):
        assert b.data["classes"].dtype == np.int32 and b.data["data"].dtype == np.float32
        for j, pos in enumerate(b.seq_idx):
            assert b.seq_tags[j] == ds.get_seq_tag(pos)
            assert b.corpus_seq_idx[j] == ds.get_corpus_seq_idx(pos)
            for key in ("data", "classes"):
                n = b.lengths[key][j]
                np.testing.assert_array_equal(b.data[key][j, :n], ds.get_data(pos, key))
                assert not b.data[key][j, n:].any()  # zero padding
        assert b.num_frames == {k: int(v.sum()) for k, v in b.lengths.items()}
        assert all(v.dtype == np.int32 for v in b.lengths.values())


@pytest.mark.tf_latest
def test_max_seq_length_skips_and_logs_once(corpus, capsys, default_log):
    ds = HDFDataset(corpus)
    ds.init_seq_order(1)
    lengths = ds.epoch_seq_lengths()
    batches = epoch_batches(ds, batch_size=200, max_seq_length=20)
    kept = np.concatenate([b.seq_idx for b in batches])
    np.testing.assert_array_equal(kept, np.flatnonzero(lengths.max(axis=1) <= 20))
    skipped = int((lengths.max(axis=1) > 20).sum())
    out = capsys.readouterr().out
    assert out.count("skipped") == 1 and f"skipped {skipped} of 80 sequences" in out
    by_key = epoch_batches(ds, batch_size=200, max_seq_length={"classes": 10})
    kept = np.concatenate([b.seq_idx for b in by_key])
    np.testing.assert_array_equal(kept, np.flatnonzero(lengths[:, 1] <= 10))
    with pytest.raises(ConfigError, match="orth"):
        generate_batches(ds, BatchOptions(batch_size=200, max_seq_length={"orth": 3}))


@pytest.mark.tf_latest
def test_oversized_sequence_gets_its_own_batch(corpus, capsys, default_log):
    lengths = np.array([[3], [50], [4], [5]])
    batches, skipped, oversized = plan_batches(lengths, batch_size=10)
    assert [b.tolist() for b in batches] == [[0], [1], [2, 3]] and (skipped, oversized) == (0, 1)
    ds = HDFDataset(corpus)
    ds.init_seq_order(1)
    longest = int(ds.epoch_seq_lengths().max())
    batches = epoch_batches(ds, batch_size=longest - 1)
    assert all(b.num_seqs == 1 for b in batches if b.data["data"].shape[1] == longest)
    assert "longer than batch_size" in capsys.readouterr().err
    for bad in (0, -5, 2.5):
        with pytest.raises(ConfigError, match="batch_size"):
            BatchOptions(batch_size=bad)
    with pytest.raises(ConfigError, match="max_seqs"):
        BatchOptions(batch_size=10, max_seqs=0)


@pytest.mark.tf_latest
@pytest.mark.parametrize("num_ranks", [2, 3])
def test_shards_are_disjoint_and_complete(corpus, num_ranks):
    ds = HDFDataset(corpus, seq_ordering="laplace:4")
    ds.init_seq_order(2)
    everything = [b.seq_tags for b in epoch_batches(ds, batch_size=60)]
    shards = [[b.seq_tags for b in epoch_batches(ds, batch_size=60, shard_rank=r, shard_size=num_ranks)]
              for r in range(num_ranks)]
    for r, shard in enumerate(shards):
        assert shard == everything[r::num_ranks]  # rank r takes batches r, r+N, ...
    tags = [t for shard in shards for b in shard for t in b]
    assert len(tags) == len(set(tags)) == 80
    planned = [generate_batches(ds, BatchOptions(60), shard_rank=r, shard_size=num_ranks).all_shards
               for r in range(num_ranks)]
    assert planned == [len(everything)] * num_ranks  # every rank knows the whole plan's size


@pytest.mark.tf_latest
@pytest.mark.parametrize("num_ranks", [2, 3, 100])
def test_inference_shards_split_the_frames_evenly(corpus, num_ranks):
    """shard_by="frames": contiguous parts of the epoch order, equal frames to within one sequence,
    each batched under the same limits; more ranks than sequences leaves some ranks empty."""
    ds = HDFDataset(corpus, seq_ordering="random")
    ds.init_seq_order(5)
    order = [ds.get_seq_tag(i) for i in range(80)]
    longest = ds.epoch_seq_lengths().max(axis=1)
    planned = [generate_batches(ds, BatchOptions(60, max_seqs=5), shard_rank=r, shard_size=num_ranks,
                                shard_by="frames") for r in range(num_ranks)]
    shards = [[b.seq_tags for b in shard] for shard in planned]
    assert [t for shard in shards for b in shard for t in b] == order  # contiguous, in order, each once
    frames, start = [], 0
    for shard in shards:
        count = sum(map(len, shard))
        frames.append(int(longest[start:start + count].sum()))
        start += count
        for tags in shard:
            assert len(tags) <= 5
    assert max(frames) - min(frames) <= 2 * longest.max()
    assert all(p.all_shards == sum(map(len, shards)) for p in planned)
    if num_ranks <= 3:
        assert min(frames) > 0


@pytest.mark.tf_latest
def test_kept_batches_are_never_overwritten(corpus):
    """Buffers are recycled only when no batch uses them: hold every batch, then compare."""
    ds = HDFDataset(corpus, seq_ordering="random")
    ds.init_seq_order(1)
    held = epoch_batches(ds, batch_size=50)
    for b in held:
        for j, pos in enumerate(b.seq_idx):
            np.testing.assert_array_equal(b.data["data"][j, :b.lengths["data"][j]], ds.get_data(pos, "data"))
    views = [b.data["classes"][1:] for b in held]  # a view of a view keeps its buffer busy too
    del held
    for b in epoch_batches(ds, batch_size=50):
        pass
    ds.init_seq_order(1)
    reference = epoch_batches(ds, batch_size=50)
    for view, b in zip(views, reference):
        np.testing.assert_array_equal(view, b.data["classes"][1:])


@pytest.mark.tf_latest
def test_buffers_are_reused_when_released(corpus):
    ds = HDFDataset(corpus, seq_ordering="random")
    ds.init_seq_order(1)
    bases = {b.data["data"].base.ctypes.data for b in generate_batches(ds, BatchOptions(50))}
    assert len(bases) <= 3


# ----- prefetching -----
@pytest.mark.tf_latest
def test_prefetcher_yields_the_same_batches(corpus):
    ds = HDFDataset(corpus, seq_ordering="random")
    ds.init_seq_order(1)
    direct = [b.seq_tags for b in generate_batches(ds, BatchOptions(50))]
    with BatchPrefetcher(generate_batches(ds, BatchOptions(50)), depth=3) as prefetcher:
        assert [b.seq_tags for b in prefetcher] == direct
        assert next(prefetcher, None) is None


def failing_batches(fail_at: int):
    for i in range(100):
        if i == fail_at:
            raise OSError(f"disk gone at batch {i}")
        yield i


@pytest.mark.tf_latest
@pytest.mark.parametrize("fail_at", [0, 5])
def test_loader_error_is_raised_in_the_consumer(fail_at):
    got = []
    with pytest.raises(OSError, match=f"disk gone at batch {fail_at}"):
        with BatchPrefetcher(failing_batches(fail_at)) as prefetcher:
            for item in prefetcher:
                got.append(item)
    assert got == list(range(fail_at))


@pytest.mark.tf_latest
def test_early_stop_shuts_the_thread_down():
    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = threading.active_count()
    with BatchPrefetcher(endless(), depth=2) as prefetcher:
        assert [next(prefetcher) for _ in range(3)] == [0, 1, 2]
        time.sleep(0.05)  # let the producer fill the queue and block
    assert closed.wait(5) and threading.active_count() == before
    assert next(prefetcher, None) is None


@pytest.mark.tf_latest
def test_prefetch_overlaps_a_slow_consumer():
    """The next batches are read while the consumer trains: measured as the time both are busy at once,
    which a busy machine does not change much, not as the total time, which it stretches."""
    reading, training = [], []

    def slow_batches():
        for i in range(8):
            start = time.monotonic()
            time.sleep(0.03)
            reading.append((start, time.monotonic()))
            yield i

    with BatchPrefetcher(slow_batches()) as prefetcher:
        for _ in prefetcher:
            start = time.monotonic()
            time.sleep(0.03)  # a "training step" releasing the GIL
            training.append((start, time.monotonic()))
    both = sum(max(0.0, min(end, stop) - max(start, begin))
               for start, end in reading for begin, stop in training)
    # one after the other: never both; overlapped: while each step but the last ones, a batch is read
    assert both > 0.5 * sum(stop - begin for begin, stop in training), (reading, training)


@pytest.mark.tf_latest
def test_npz_batches(tmp_path):
    path = str(tmp_path / "c.npz")
    np.savez(path, data=np.ones((9, 2), np.float64), data_lengths=[4, 5],
             classes=np.arange(9, dtype=np.int64), classes_lengths=[4, 5])
    ds = NpzDataset(path)
    ds.init_seq_order(1)
    (b,) = epoch_batches(ds, batch_size=10)
    assert b.data["data"].dtype == np.float64 and b.data["classes"].dtype == np.int32
    np.testing.assert_array_equal(b.data["classes"], [[0, 1, 2, 3, 0], [4, 5, 6, 7, 8]])


# ----- real MPI job: two ranks take different batches that together cover the corpus -----
@pytest.mark.mpi
def test_shard_under_mpirun(tmp_path):
    from helpers import run_mpi

    corpus_path = make_corpus(tmp_path, num_seqs=50, seed=4)
    proc = run_mpi(2, [os.path.abspath(__file__), corpus_path, str(tmp_path)], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shards = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert shards[0] and shards[1] and shards[0] != shards[1]
    tags = [t for shard in shards for batch in shard for t in batch]
    assert len(tags) == len(set(tags)) == 50
    ds = HDFDataset(corpus_path, seq_ordering="random")
    ds.init_seq_order(1)
    everything = [b.seq_tags for b in generate_batches(ds, BatchOptions(60))]
    assert shards[0] == everything[0::2] and shards[1] == everything[1::2]


if __name__ == "__main__":
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    dataset = HDFDataset(sys.argv[1], seq_ordering="random")
    dataset.init_seq_order(1)
    with BatchPrefetcher(generate_batches(dataset, BatchOptions(60), shard_rank=comm.rank,
                                          shard_size=comm.size)) as batches:
        mine = [b.seq_tags for b in batches]
    with open(os.path.join(sys.argv[2], f"rank{comm.rank}.json"), "w") as f:
        json.dump(mine, f)
    comm.Barrier()
