"""Targets with their own lengths (``classes`` shorter or longer than ``data``) end to end on the data side:
HDF files, the generated label task, batching as RETURNN counts it, padding per key, sharding over ranks,
chunking, hdf_dump / dump_dataset, and the checkpoint's batch-plan fingerprint."""
from __future__ import annotations

import numpy as np
import pytest

from engine.config.loader import Config
from engine.datasets import (BatchOptions, DataKeyInfo, HDFDataset, HDFWriter, LabelFramesDataset,
                             create_dataset, generate_batches)
from engine.runtime.errors import ConfigError, DataError
from engine.tools import dump_dataset, hdf_dump
from engine.training.checkpoints.resume import plan_fingerprint
from helpers import run_rnn

pytestmark = pytest.mark.tf_latest


def write_corpus(path, lengths, seed=0, extra_key=False) -> str:
    """One sequence per ``(data_len, classes_len)`` row; values encode (sequence, frame) so that a batch's
    contents can be checked against the lengths alone. ``extra_key``: a third key ``align`` of 3 frames
    per data frame."""
    keys = {"data": DataKeyInfo(dim=2), "classes": DataKeyInfo(dim=1000, sparse=True)}
    if extra_key:
        keys["align"] = DataKeyInfo(dim=5, sparse=True)
    with HDFWriter(str(path), keys) as writer:
        for i, (n_data, n_classes) in enumerate(lengths):
            seq = {"data": np.stack([np.full(n_data, i), np.arange(n_data)], 1).astype(np.float32),
                   "classes": (i * 10 + np.arange(n_classes)) % 1000}
            if extra_key:
                seq["align"] = np.arange(3 * n_data) % 5
            writer.insert(f"seq-{i}", seq)
    return str(path)


def random_lengths(num=60, seed=1) -> list[tuple[int, int]]:
    rng = np.random.RandomState(seed)
    # targets mostly shorter, sometimes longer than the input (so that either key can drive a batch split)
    return [(int(rng.randint(1, 40)), int(rng.randint(0, 60))) for _ in range(num)]


def returnn_plan(lengths: list[dict], batch_size: int, max_seqs: int,
                 max_seq_length: dict) -> list[list[int]]:
    """RETURNN's ``Dataset._generate_batches`` (recurrent net, no chunking), written from its rules: a
    sequence is skipped when any key is longer than that key's max_seq_length; a new batch starts when
    for any key ``max_len * num_seqs`` would exceed batch_size, or the sequence count max_seqs."""
    batches, current, maxima = [], [], {}
    for idx, length in enumerate(lengths):
        if any(length[k] > limit for k, limit in max_seq_length.items() if k in length):
            continue
        new_max = {k: max(maxima.get(k, 0), n) for k, n in length.items()}
        if current and (any(m * (len(current) + 1) > batch_size for m in new_max.values())
                        or len(current) + 1 > max_seqs):
            batches.append(current)
            current, new_max = [], dict(length)
        current.append(idx)
        maxima = new_max
    if current:
        batches.append(current)
    return batches


@pytest.fixture(scope="module")
def lengths():
    return random_lengths()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, lengths):
    return write_corpus(tmp_path_factory.mktemp("own_lengths") / "corpus.hdf", lengths)


@pytest.mark.parametrize("cache_size", [0, "20K", "10M"])
def test_hdf_keeps_each_keys_lengths(corpus, lengths, cache_size):
    ds = HDFDataset(corpus, cache_size=cache_size, seq_ordering="random")
    ds.init_seq_order(1)
    # whatever the order, sequence i (by tag) keeps its own pair of lengths
    by_tag = {ds.get_seq_tag(k): tuple(row) for k, row in enumerate(ds.epoch_seq_lengths().tolist())}
    assert by_tag == {f"seq-{i}": row for i, row in enumerate(lengths)}
    ds.close()
    ds = HDFDataset(corpus, cache_size=cache_size)
    ds.init_seq_order(1)
    assert ds.epoch_seq_lengths().tolist() == [list(row) for row in lengths]
    for i, (n_data, n_classes) in enumerate(lengths):
        assert ds.get_data(i, "data").shape == (n_data, 2)
        np.testing.assert_array_equal(ds.get_data(i, "classes"), (i * 10 + np.arange(n_classes)) % 1000)
    ds.close()


@pytest.mark.parametrize("batch_size, max_seqs, max_seq_length", [
    (100, -1, 0), (60, 4, 0), (500, 20, 0), (100, -1, 35), (100, -1, {"classes": 30}), (100, -1, -30),
    (100, -1, {"data": 20, "classes": 50}), (45, 3, {"data": 30})])
def test_plan_and_padding_as_returnn_counts(corpus, lengths, batch_size, max_seqs, max_seq_length):
    ds = HDFDataset(corpus)
    ds.init_seq_order(1)
    batches = list(generate_batches(ds, BatchOptions(batch_size, max_seqs, max_seq_length)))
    limit = ({"classes": -max_seq_length} if isinstance(max_seq_length, int) and max_seq_length < 0
             else max_seq_length if isinstance(max_seq_length, dict)
             else {"data": max_seq_length, "classes": max_seq_length} if max_seq_length else {})
    expected = returnn_plan([{"data": a, "classes": b} for a, b in lengths], batch_size,
                            max_seqs if max_seqs > 0 else 10**9, limit)
    assert [b.seq_idx.tolist() for b in batches] == expected
    for batch in batches:
        for key in ("data", "classes"):
            own = np.array([lengths[i][key == "classes"] for i in batch.seq_idx])
            np.testing.assert_array_equal(batch.lengths[key], own)
            assert batch.data[key].shape[1] == own.max()  # each key padded to its own longest sequence
            assert batch.num_frames[key] == own.sum()
        for j, i in enumerate(batch.seq_idx.tolist()):
            n_data, n_classes = lengths[i]
            np.testing.assert_array_equal(batch.data["classes"][j, :n_classes],
                                          (i * 10 + np.arange(n_classes)) % 1000)
            assert not batch.data["classes"][j, n_classes:].any()
            assert (batch.data["data"][j, :n_data, 0] == i).all() and not batch.data["data"][j, n_data:].any()
    ds.close()


def test_every_key_of_the_dataset_counts_also_when_not_batched(tmp_path, lengths):
    """RETURNN plans whole sequences on all of the dataset's keys, read by the network or not."""
    path = write_corpus(tmp_path / "three.hdf", lengths[:30], extra_key=True)
    ds = HDFDataset(path)
    ds.init_seq_order(1)
    batches = list(generate_batches(ds, BatchOptions(150, -1, 100), keys=["data", "classes"]))
    assert set(batches[0].data) == {"data", "classes"}
    expected = returnn_plan([{"data": a, "classes": b, "align": 3 * a} for a, b in lengths[:30]], 150, 10**9,
                            {"data": 100, "classes": 100, "align": 100})
    assert [b.seq_idx.tolist() for b in batches] == expected
    assert sum(map(len, expected)) < 30  # 'align' (3x data) made some sequences too long
    ds.close()


def test_max_seq_length_errors_name_the_key(corpus):
    ds = HDFDataset(corpus)
    ds.init_seq_order(1)
    with pytest.raises(ConfigError, match="'phones'"):
        generate_batches(ds, BatchOptions(100, -1, {"phones": 3}))
    with pytest.raises(ConfigError, match="max_seq_length"):
        generate_batches(ds, BatchOptions(100, -1, {"classes": -1}))
    ds.close()


def test_dev_in_training_skips_as_train_does(tmp_path):
    """RETURNN scores dev after each epoch with the training's max_seq_length; task eval uses all."""
    config = tmp_path / "skip.py"
    config.write_text(
        "task = 'train'\n"
        "train = {'class': 'Task12AXDataset', 'num_seqs': 40, 'fixed_random_seed': 1}\n"
        "dev = {'class': 'Task12AXDataset', 'num_seqs': 30, 'fixed_random_seed': 2}\n"
        "network = {'output': {'class': 'softmax', 'loss': 'ce', 'from': 'data'}}\n"
        "batch_size = 400\nmax_seq_length = 12\nnum_epochs = 1\nlearning_rate = 0.01\n"
        f"model = {str(tmp_path / 'm')!r}\n")
    dev = create_dataset({"class": "Task12AXDataset", "num_seqs": 30, "fixed_random_seed": 2})
    dev.init_seq_order(1)
    too_long = int((dev.epoch_seq_lengths()[:, 0] > 12).sum())
    assert 0 < too_long < 30
    r = run_rnn([str(config)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"skipped {too_long} of 30 sequences longer than max_seq_length 12" in r.stdout + r.stderr
    r = run_rnn([str(config), "++task", "eval", "++eval", "None"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "of 30 sequences longer" not in r.stdout + r.stderr


@pytest.mark.parametrize("shard_size", [2, 3])
def test_shards_of_one_plan_cover_the_epoch(corpus, lengths, shard_size):
    ds = HDFDataset(corpus, seq_ordering="random", fixed_random_seed=3)
    ds.init_seq_order(2)
    whole = [b.seq_idx.tolist() for b in generate_batches(ds, BatchOptions(100))]
    shards = [[b.seq_idx.tolist() for b in generate_batches(ds, BatchOptions(100), shard_rank=r,
                                                            shard_size=shard_size)]
              for r in range(shard_size)]
    for r in range(shard_size):
        assert shards[r] == whole[r::shard_size]
    ds.close()


def test_frame_balanced_parts_count_the_longest_key(corpus, lengths):
    ds = HDFDataset(corpus)
    ds.init_seq_order(1)
    parts = [list(generate_batches(ds, BatchOptions(5000), shard_rank=r, shard_size=2, shard_by="frames"))
             for r in range(2)]
    seqs = [np.concatenate([b.seq_idx for b in part]).tolist() for part in parts]
    assert seqs[0] + seqs[1] == list(range(len(lengths)))  # contiguous, every sequence once
    longest = np.array([max(a, b) for a, b in lengths])
    cut = len(seqs[0])
    middle = np.cumsum(longest) - longest / 2  # a sequence goes to the half its middle frame falls in
    assert (middle[:cut] < longest.sum() / 2).all() and (middle[cut:] >= longest.sum() / 2).all()
    for part in parts:
        for batch in part:
            for key, col in (("data", 0), ("classes", 1)):
                assert batch.data[key].shape[1] == max(lengths[i][col] for i in batch.seq_idx)
    ds.close()


def test_random_seed_offset_keeps_each_sequences_keys_together(corpus, lengths):
    """The other distribution: each rank orders the whole corpus with its own seed offset."""
    orders = []
    for offset in (0, 1):
        ds = HDFDataset(corpus, seq_ordering="random", random_seed_offset=offset)
        ds.init_seq_order(1)
        seen = []
        for batch in generate_batches(ds, BatchOptions(100)):
            for j, tag in enumerate(batch.seq_tags):
                i = int(tag.split("-")[1])
                assert (batch.lengths["data"][j], batch.lengths["classes"][j]) == lengths[i]
                seen.append(i)
        orders.append(seen)
        ds.close()
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1]) == list(range(len(lengths)))


def test_chunking_needs_frame_aligned_keys_or_a_step_of_their_own(tmp_path):
    path = write_corpus(tmp_path / "half.hdf", [(40, 20), (24, 12), (10, 5)])
    ds = HDFDataset(path, chunking="10:10")
    ds.init_seq_order(1)
    with pytest.raises(DataError, match="key 'classes' has 20 frames but 'data' has 40"):
        generate_batches(ds, BatchOptions(1000))
    ds.close()
    # a step per key at the streams' rate ratio: RETURNN cuts both (chunk j: data from 10j, classes from 5j)
    ds = HDFDataset(path, chunking=({"data": 10, "classes": 5}, {"data": 10, "classes": 5}))
    ds.init_seq_order(1)
    chunks = [(int(b.seq_idx[j]), int(b.data["data"][j, 0, 1]), int(b.lengths["data"][j]),
               int(b.lengths["classes"][j]))
              for b in generate_batches(ds, BatchOptions(1000)) for j in range(b.num_seqs)]
    assert chunks == [(0, 0, 10, 5), (0, 10, 10, 5), (0, 20, 10, 5), (0, 30, 10, 5),
                      (1, 0, 10, 5), (1, 10, 10, 5), (1, 20, 4, 2), (2, 0, 10, 5)]
    ds.close()
    # labels that do not follow the frames at a fixed rate cannot be cut: the error names the key
    labels = LabelFramesDataset(num_seqs=5, fixed_random_seed=1, chunking="10:5")
    labels.init_seq_order(1)
    with pytest.raises(DataError, match="'classes'"):
        generate_batches(labels, BatchOptions(1000))


def test_label_frames_task_renders_its_labels():
    ds = create_dataset({"class": "LabelFramesDataset", "num_seqs": 30, "num_labels": 4, "input_dim": 6,
                         "noise": 0.05, "fixed_random_seed": 7})
    ds.init_seq_order(1)
    lengths = ds.epoch_seq_lengths()
    assert (lengths[:, 1] < lengths[:, 0]).all() and lengths[:, 1].min() >= 1
    assert ds.is_sparse("classes") and ds.get_data_dim("classes") == 4 and ds.labels["classes"][0] == "L0"
    for i in range(ds.num_seqs):
        frames, labels = ds.get_data(i, "data"), ds.get_data(i, "classes")
        # independent decoding: nearest pattern or silence per frame, then runs collapsed, silence dropped
        candidates = np.concatenate([np.zeros((1, 6)), ds.patterns])
        nearest = np.argmin(((frames[:, None, :] - candidates[None]) ** 2).sum(-1), axis=1) - 1
        runs = [int(v) for k, v in enumerate(nearest) if k == 0 or v != nearest[k - 1]]
        assert [v for v in runs if v >= 0] == labels.tolist()
    again = create_dataset("LabelFramesDataset:num_seqs=30,num_labels=4,input_dim=6,noise=0.05,"
                           "fixed_random_seed=7")
    again.init_seq_order(2)  # a fixed seed: the same corpus in every epoch
    np.testing.assert_array_equal(again.get_data(3, "classes"), ds.get_data(3, "classes"))
    other = LabelFramesDataset(num_seqs=30, num_labels=4, input_dim=6)
    other.init_seq_order(1)
    first = other.get_data(0, "data").copy()
    other.init_seq_order(2)  # no fixed seed: new sequences every epoch, as RETURNN's generated data
    assert other.get_data(0, "data").shape != first.shape or not np.allclose(other.get_data(0, "data"), first)
    with pytest.raises(DataError, match="min_labels"):
        LabelFramesDataset(min_labels=5, max_labels=2)


def test_hdf_dump_round_trip_and_dump_dataset(tmp_path, capsys):
    out = str(tmp_path / "labels.hdf")
    spec = "LabelFramesDataset:num_seqs=12,fixed_random_seed=2"
    assert hdf_dump.main([spec, out]) == 0
    source = create_dataset(spec)
    source.init_seq_order(1)
    copy = HDFDataset(out)
    copy.init_seq_order(1)
    np.testing.assert_array_equal(copy.epoch_seq_lengths(), source.epoch_seq_lengths())
    for i in range(12):
        for key in ("data", "classes"):
            np.testing.assert_array_equal(copy.get_data(i, key), source.get_data(i, key))
    assert copy.labels["classes"] == source.labels["classes"]
    copy.close()
    capsys.readouterr()
    assert dump_dataset.main([out, "--num_seqs", "1"]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in text.splitlines()
            if line.startswith(("data ", "classes "))}
    lengths = source.epoch_seq_lengths()
    assert int(rows["data"][5]) == lengths[:, 0].sum() and int(rows["classes"][5]) == lengths[:, 1].sum()


def test_plan_fingerprint_includes_target_lengths(tmp_path):
    a = HDFDataset(write_corpus(tmp_path / "a.hdf", [(10, 3), (12, 4), (8, 2)]))
    b = HDFDataset(write_corpus(tmp_path / "b.hdf", [(10, 3), (12, 16), (8, 2)]))  # a target
    for ds in (a, b):
        ds.init_seq_order(1)
    options = BatchOptions(30)
    assert [x.seq_idx.tolist() for x in generate_batches(a, options)] != \
        [x.seq_idx.tolist() for x in generate_batches(b, options)]  # so the plan depends on it
    assert plan_fingerprint(a, options) != plan_fingerprint(b, options)
    a.close()
    b.close()


def test_config_max_seq_length_forms_reach_the_plan():
    for value in (-30, {"classes": 30}, 35):
        config = Config({"batch_size": 100, "max_seq_length": value})
        assert BatchOptions.from_config(config, train=True).max_seq_length == value


def test_frame_wise_loss_on_label_targets_is_a_clear_error(tmp_path):
    config = tmp_path / "ce_on_labels.py"
    config.write_text(
        "task = 'train'\n"
        "train = {'class': 'LabelFramesDataset', 'num_seqs': 8, 'fixed_random_seed': 1}\n"
        "network = {'output': {'class': 'softmax', 'loss': 'ce', 'from': 'data'}}\n"
        "batch_size = 400\nnum_epochs = 1\n")
    r = run_rnn([str(config)])
    assert r.returncode != 0
    message = [line for line in (r.stdout + r.stderr).splitlines() if "error:" in line]
    assert len(message) == 1 and "Loss of layer 'output' is frame-wise" in message[0], r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
