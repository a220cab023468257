"""The background feature worker (engine/datasets/prefetch.py): the same batches as the direct path,
bounded look-ahead, errors raised on the reader's thread as the DataError the direct path raises."""
import functools
import re
import sys
import threading
import time

import numpy as np
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import returnn_oggzip_fixtures as F  # noqa: E402

from engine.datasets import BatchOptions, BatchPrefetcher, generate_batches  # noqa: E402
from engine.datasets.factory import create_dataset  # noqa: E402
from engine.datasets.prefetch import SequencePrefetcher  # noqa: E402
from engine.runtime.errors import DataError  # noqa: E402

FIXTURES = str(ROOT / "tests" / "fixtures" / "returnn_oggzip")


def oggzip(case):
    return create_dataset({"class": "OggZipDataset", **F.resolve(F.CASES[case], FIXTURES)})


def epoch_batches(dataset, epoch, rank, size):
    dataset.init_seq_order(epoch)
    planned = generate_batches(dataset, BatchOptions(batch_size=400, max_seqs=1), shard_rank=rank,
                               shard_size=size)
    worker = dataset._prefetcher
    with BatchPrefetcher(planned) as batches:
        return worker, [(b.seq_tags, {k: v.copy() for k, v in b.data.items()}) for b in batches]


@pytest.mark.parametrize("case", ["mfcc_bpe", "dbmel_join"])
def test_worker_yields_the_direct_paths_batches(case, monkeypatch):
    with_worker, direct = oggzip(case), None
    monkeypatch.setenv("ENGINE_FEATURE_PREFETCH", "0")
    direct = oggzip(case)
    monkeypatch.delenv("ENGINE_FEATURE_PREFETCH")
    for epoch in (1, 2):
        for rank in (0, 1):
            worker, ours = epoch_batches(with_worker, epoch, rank, 2)
            assert worker is not None  # the batches did come through the worker
            monkeypatch.setenv("ENGINE_FEATURE_PREFETCH", "0")
            none, theirs = epoch_batches(direct, epoch, rank, 2)
            monkeypatch.delenv("ENGINE_FEATURE_PREFETCH")
            assert none is None
            assert [tags for tags, _ in ours] == [tags for tags, _ in theirs]
            for (_, a), (_, b) in zip(ours, theirs):
                assert a.keys() == b.keys()
                for key in a:
                    np.testing.assert_array_equal(a[key], b[key], err_msg=f"{case} {epoch} {rank} {key}")
    with_worker.close()
    assert with_worker._prefetcher is None


def test_worker_error_arrives_as_the_direct_paths_data_error(monkeypatch):
    def broken(case):
        dataset = oggzip(case)
        if dataset._ahead is not None:  # epoch 1's first features, computed from construction on: on a busy
            dataset._ahead.stop()  # machine they may be done before the patch below, and the error with them
        dataset._spare.clear()
        dataset.init_seq_order(1)
        dataset.epoch_seq_lengths()  # headers read: the plan holds, the audio itself is then unreadable
        bad = int(dataset.order[1])
        good_bytes = dataset.corpus.audio_bytes
        monkeypatch.setattr(dataset.corpus, "audio_bytes",
                            lambda idx: b"not an ogg file" if idx == bad else good_bytes(idx))
        return dataset, dataset.corpus.tags[bad]

    dataset, tag = broken("mfcc_bpe")
    planned = generate_batches(dataset, BatchOptions(batch_size=10000))
    assert dataset._prefetcher is not None
    with BatchPrefetcher(planned) as batches, pytest.raises(DataError) as ours:
        list(batches)
    monkeypatch.setenv("ENGINE_FEATURE_PREFETCH", "0")
    dataset, _ = broken("mfcc_bpe")
    with BatchPrefetcher(generate_batches(dataset, BatchOptions(batch_size=10000))) as batches, \
            pytest.raises(DataError) as theirs:
        list(batches)

    def address_free(error):  # libsndfile's text names the in-memory file object by its address
        return re.sub(r" at 0x[0-9a-f]+", "", str(error.value))

    assert address_free(ours) == address_free(theirs)
    assert f"'{tag}'" in str(ours.value) and "cannot be decoded" in str(ours.value)


def test_look_ahead_is_bounded_and_skips_are_handled():
    computed, lock = [], threading.Lock()

    def compute(idx):
        with lock:
            computed.append(idx)
        if idx == 7:
            raise DataError("file 'seven.ogg' is broken")
        return np.full(3, idx)

    plan = [5, 3, 3, 9, 1, 7, 2, 8, 4, 6]  # 3 twice: computed once
    worker = SequencePrefetcher(compute, plan, window=2)
    time.sleep(0.2)
    assert computed == [5, 3]  # nothing taken yet: two ahead, no more
    assert worker.take(5).tolist() == [5] * 3
    assert worker.take(5) is None  # taken already: the caller computes it
    assert worker.take(42) is None  # not planned
    assert worker.take(1).tolist() == [1] * 3  # 3 and 9 skipped: their room is freed
    with pytest.raises(DataError, match="seven.ogg"):
        worker.take(7)
    assert worker.take(4).tolist() == [4] * 3
    time.sleep(0.1)
    assert len(computed) == len(set(computed)) <= len(set(plan))
    worker.close()
    assert not worker._thread.is_alive()
    assert worker.take(6) is None  # closed: the caller computes it


def test_the_next_epochs_start_is_handed_on():
    computed = []

    def compute(idx):
        computed.append(idx)
        return np.full(2, idx)

    first = SequencePrefetcher(compute, [1, 2], then=[2, 5, 6])  # 2 is read now and next: computed once
    assert [first.take(1).tolist(), first.take(2).tolist()] == [[1, 1], [2, 2]]
    deadline = time.time() + 5
    while len(computed) < 4 and time.time() < deadline:
        time.sleep(0.01)
    spare = first.close()
    assert sorted(spare) == [2, 5, 6] and computed == [1, 2, 5, 6]
    second = SequencePrefetcher(compute, [6, 3, 2, 5], done=spare)
    assert [second.take(i).tolist() for i in (6, 3, 2, 5)] == [[6, 6], [3, 3], [2, 2], [5, 5]]
    assert computed == [1, 2, 5, 6, 3]  # only 3 was new
    assert second.close() == {}


def test_epoch_plans_and_first_features_are_prepared_ahead(monkeypatch):
    """The plan of an epoch needs every sequence's audio length: read in the background while the network
    is built (epoch 1, with the features of its first sequences) and while the previous epoch trains (the
    next one), never on the plan's path; the worker starts from the features computed ahead."""
    from engine.datasets import oggzip
    from engine.datasets.oggzip_corpus import OggZipCorpus

    monkeypatch.setattr(oggzip, "FIRST_FEATURES", 3)
    spec = {"class": "OggZipDataset", **F.resolve(F.CASES["mfcc_bpe"], FIXTURES), "partition_epoch": 2,
            "seq_ordering": "random"}
    dataset = create_dataset(spec)
    dataset._ahead._thread.join(120)  # librosa compiles first: slow on a busy machine
    first = dataset._epoch_order(1).tolist()
    assert set(dataset._num_samples) == set(first) and sorted(dataset._spare) == sorted(first[:3])
    reads = []
    monkeypatch.setattr(OggZipCorpus, "audio_bytes", lambda self, idx: reads.append(idx) or b"")
    dataset.init_seq_order(1)
    dataset.epoch_seq_lengths()
    assert reads == []  # the plan read no file
    monkeypatch.undo()
    ahead = dict(dataset._spare)
    dataset.will_read(np.arange(dataset.num_seqs))
    for idx, features in ahead.items():  # the worker hands on what was computed ahead
        assert dataset._features(idx) is features
    dataset._ahead._thread.join(120)  # librosa compiles first: slow on a busy machine
    assert set(dataset._num_samples) == set(first) | set(dataset._epoch_order(2).tolist()) != set(first)
    dataset.close()

    monkeypatch.setenv("ENGINE_FEATURE_PREFETCH", "0")  # the direct path reads them when planning
    direct = create_dataset({"class": "OggZipDataset", **F.resolve(F.CASES["mfcc_bpe"], FIXTURES)})
    assert direct._ahead is None and direct._num_samples == {} and direct._spare == {}


def test_a_background_pass_skips_failures_and_stops():
    from engine.datasets.prefetch import BackgroundPass

    seen, gate = [], threading.Event()

    def visit(idx):
        gate.wait(5)
        seen.append(idx)
        if idx == 1:
            raise DataError("the dataset's own pass raises this, with the sequence's name")

    finished = BackgroundPass([functools.partial(visit, i) for i in range(3)], name="test pass")
    gate.set()
    finished._thread.join(60)
    assert seen == [0, 1, 2]
    seen.clear()
    gate.clear()
    stopped = BackgroundPass([functools.partial(visit, i) for i in range(100)], name="test pass")
    threading.Timer(0.2, gate.set).start()
    stopped.stop()
    assert not stopped._thread.is_alive() and len(seen) <= 1
