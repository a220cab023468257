"""Orderings, epochs and seeds; generated and NumPy datasets; creating datasets from config values."""
from __future__ import annotations

import numpy as np
import pytest

from engine.datasets import (DataKeyInfo, DummyDataset, HDFDataset, HDFWriter, NpzDataset, Task12AXDataset,
                             create_dataset, parse_byte_size)
from engine.datasets.generated import SYMBOLS_12AX, targets_12ax
from engine.datasets.ordering import epoch_order, parse_seq_ordering
from engine.runtime.errors import DataError

pytestmark = pytest.mark.tf_latest
LENGTHS = np.random.RandomState(5).randint(1, 100, 101)


def order(method, epoch=1, **kwargs):
    return epoch_order(parse_seq_ordering(method), num_seqs=len(LENGTHS), epoch=epoch,
                       get_lengths=lambda: LENGTHS, **kwargs)


# ----- orderings -----
def test_simple_orderings():
    np.testing.assert_array_equal(order("default"), np.arange(101))
    np.testing.assert_array_equal(order("reverse"), np.arange(101)[::-1])
    assert (np.diff(LENGTHS[order("sorted")]) >= 0).all()
    assert (np.diff(LENGTHS[order("sorted_reverse")]) <= 0).all()
    ties = order("sorted")  # stable: equal lengths keep corpus order
    for a, b in zip(ties[:-1], ties[1:]):
        assert LENGTHS[a] < LENGTHS[b] or a < b


def test_random_is_deterministic_and_changes_per_epoch():
    a, b, c = order("random", 1), order("random", 1), order("random", 2)
    np.testing.assert_array_equal(a, b)
    assert sorted(a) == list(range(101)) and not np.array_equal(a, c)
    # random:3 keeps the seed for 3 epochs
    assert np.array_equal(order("random:3", 1), order("random:3", 3))
    assert not np.array_equal(order("random:3", 3), order("random:3", 4))
    # fixed_random_seed: the same order in every epoch; offsets give every rank its own order
    assert np.array_equal(order("random", 1, fixed_random_seed=7), order("random", 9, fixed_random_seed=7))
    assert not np.array_equal(order("random", 1), order("random", 1, random_seed_offset=16127))


@pytest.mark.parametrize("method", ["random", "random:3", "laplace:.10"])
def test_fixed_random_seed_ignores_the_offset_as_returnn(method):
    """RETURNN's Dataset._get_random_seed_for_epoch returns fixed_random_seed alone when it is set: a rank
    offset (random_seed_offset distribution) does not change a fixed order, nor generated data."""
    fixed = order(method, 1, fixed_random_seed=7)
    assert np.array_equal(order(method, 4, fixed_random_seed=7, random_seed_offset=16127), fixed)
    assert np.array_equal(fixed, epoch_order(parse_seq_ordering(method), num_seqs=101, epoch=1,
                                             get_lengths=lambda: LENGTHS, fixed_random_seed=7,
                                             random_seed_offset=3 * 16127, partition_epoch=1))
    own, shifted = (Task12AXDataset(num_seqs=20, fixed_random_seed=3, seq_ordering=method,
                                    random_seed_offset=offset) for offset in (0, 16127))
    own.init_seq_order(2)
    shifted.init_seq_order(2)
    assert own.order.tolist() == shifted.order.tolist()  # the generated sequences are the same too
    assert own.epoch_seq_lengths().tolist() == shifted.epoch_seq_lengths().tolist()
    # without fixed_random_seed the offset still moves the seed
    assert not np.array_equal(order(method, 4, random_seed_offset=16127), order(method, 4))


@pytest.mark.parametrize("method, bins", [("laplace:4", 4), ("laplace:.25", 4), ("laplace:3:2", 3)])
def test_laplace_bins_alternate_sort_direction(method, bins):
    got = order(method)
    assert sorted(got) == list(range(101))
    for b in range(bins):
        part = LENGTHS[got[b * 101 // bins:(b + 1) * 101 // bins]]
        assert (np.diff(part) >= 0).all() if b % 2 == 0 else (np.diff(part) <= 0).all()
    assert np.array_equal(got, order(method))
    if method.endswith(":2"):  # seed kept for 2 epochs
        assert np.array_equal(order(method, 1), order(method, 2))


@pytest.mark.parametrize("method", ["random", "laplace:5", "sorted", "default"])
@pytest.mark.parametrize("parts", [1, 3, 7])
def test_partition_epoch_covers_every_sequence_once(method, parts):
    for full in range(2):
        seen = np.concatenate([order(method, full * parts + k + 1, partition_epoch=parts)
                               for k in range(parts)])
        assert sorted(seen.tolist()) == list(range(101))
        sizes = [len(order(method, k + 1, partition_epoch=parts)) for k in range(parts)]
        assert max(sizes) - min(sizes) <= 1


def test_laplace_bins_as_returnn():
    """RETURNN (Dataset.get_seq_order_for_epoch): bare "laplace" is 2 bins; "laplace:.S" is
    max(num_seqs // S, 2) bins, so at least 2 also where num_seqs // S is 0 or 1."""
    assert parse_seq_ordering("laplace") == parse_seq_ordering("laplace:2")
    two = order("laplace:2")
    np.testing.assert_array_equal(order("laplace"), two)
    assert np.array_equal(order("laplace", 3), order("laplace:2", 3))
    assert not np.array_equal(order("laplace", 3), two)
    halves = two[:50], two[50:]  # 101 // 2: the first bin ascends, the second descends
    assert (np.diff(LENGTHS[halves[0]]) >= 0).all() and (np.diff(LENGTHS[halves[1]]) <= 0).all()
    for seqs_per_bin in (60, 101, 500):  # 101 // S is 1 or 0: 2 bins, not one sorted run
        np.testing.assert_array_equal(order(f"laplace:.{seqs_per_bin}"), two)
    np.testing.assert_array_equal(order("laplace:.34"), order("laplace:2"))  # 101 // 34 = 2
    np.testing.assert_array_equal(order("laplace:.33"), order("laplace:3"))  # 101 // 33 = 3
    np.testing.assert_array_equal(order("laplace:.20:2", 2), order("laplace:5:2", 1))
    # one sequence: a single bin, whatever the count
    one = epoch_order(parse_seq_ordering("laplace"), num_seqs=1, epoch=1, get_lengths=lambda: LENGTHS[:1])
    assert one.tolist() == [0]


@pytest.mark.parametrize("bad", ["shuffle", "random:0", "random:x", "laplace:", "laplace:.0", "laplace:0",
                                 "laplace:2:0", "laplace:2:3:4", "sorted:2", 3])
def test_bad_orderings_name_the_value(bad):
    with pytest.raises(DataError, match="seq_ordering") as info:
        parse_seq_ordering(bad, owner="train")
    assert repr(bad) in str(info.value) and "laplace:.S" in str(info.value)


def test_dataset_epochs_use_ordering_and_partition():
    ds = Task12AXDataset(num_seqs=30, fixed_random_seed=1, seq_ordering="sorted", partition_epoch=3)
    ds.init_seq_order(2)
    assert ds.num_seqs == 10
    lengths = [ds.get_seq_length(i)["data"] for i in range(10)]
    assert lengths == sorted(lengths)
    corpus = []
    for sub_epoch in (1, 2, 3):
        ds.init_seq_order(sub_epoch)
        corpus += [ds.get_corpus_seq_idx(i) for i in range(ds.num_seqs)]
    assert sorted(corpus) == list(range(30))


# ----- generated datasets -----
def test_12ax_rules_by_hand():
    seq = np.array([SYMBOLS_12AX.index(c) for c in "1AXBY2BYAX3AXCZ1CXAX"])
    assert "".join("LR"[v] for v in targets_12ax(seq)) == "LLRLLLLRLLLLLLLLLLLR"


def test_12ax_dataset_is_consistent_and_deterministic():
    ds = Task12AXDataset(num_seqs=200, fixed_random_seed=3)
    ds.init_seq_order(1)
    assert ds.num_outputs == {"data": (9, 2), "classes": (2, 1)}  # one-hot inputs, as in RETURNN
    assert ds.labels["data"] == list("123ABCXYZ") and ds.labels["classes"] == ["L", "R"]
    rights = 0
    for i in range(ds.num_seqs):
        data, classes = ds.get_data(i, "data"), ds.get_data(i, "classes")
        assert data.dtype == np.float32 and (data.sum(axis=1) == 1).all()
        symbols = data.argmax(axis=1)
        np.testing.assert_array_equal(classes, targets_12ax(symbols))
        assert symbols[0] <= 2  # starts with a digit
        rights += classes.sum()
    assert rights > 100  # enough R frames to learn from
    again = Task12AXDataset(num_seqs=200, fixed_random_seed=3)
    again.init_seq_order(5)  # fixed seed: same content in every epoch
    np.testing.assert_array_equal(again.get_data(7, "data"), ds.get_data(7, "data"))
    other = Task12AXDataset(num_seqs=200)
    epochs = []
    for epoch in (1, 2, 1):  # no fixed seed: new data every epoch, as in RETURNN, reproducible per epoch
        other.init_seq_order(epoch)
        epochs.append(np.concatenate([other.get_data(i, "data") for i in range(200)]))
    assert not np.array_equal(epochs[0], epochs[1]) and np.array_equal(epochs[0], epochs[2])


def test_dummy_dataset():
    ds = DummyDataset(input_dim=5, output_dim=3, num_seqs=4, seq_len=7, fixed_random_seed=2)
    ds.init_seq_order(1)
    x = ds.get_data(2, "data")
    assert x.shape == (7, 5) and x.dtype == np.float32
    assert ds.get_data(2, "classes").shape == (7,) and ds.get_data(2, "classes").max() < 3
    np.testing.assert_array_equal(x, ds.get_data(2, "data"))
    assert ds.num_outputs == {"data": (5, 2), "classes": (3, 1)}
    with pytest.raises(DataError, match="seq_len must be a positive integer"):
        DummyDataset(input_dim=5, output_dim=3, num_seqs=4, seq_len=0)


# ----- NumPy files -----
def test_npz_dataset(tmp_path):
    path = str(tmp_path / "c.npz")
    np.savez(path, data=np.arange(10, dtype=np.float32).reshape(5, 2), data_lengths=[2, 0, 3],
             classes=np.array([1, 2, 0, 1, 1], np.int32), classes_lengths=[1, 2, 2], classes_dim=4,
             classes_labels=np.array(["a", "b", "c", "d"]), seq_tags=np.array(["x", "y", "z"]))
    ds = NpzDataset(path, seq_ordering="reverse")
    ds.init_seq_order(1)
    assert ds.data_keys == ["data", "classes"] and ds.num_outputs == {"data": (2, 2), "classes": (4, 1)}
    assert ds.get_seq_tag(0) == "z" and ds.labels["classes"] == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(ds.get_data(0, "data"), [[4, 5], [6, 7], [8, 9]])
    np.testing.assert_array_equal(ds.get_data(1, "classes"), [2, 0])
    assert ds.get_data(1, "data").shape == (0, 2)


def test_npz_errors(tmp_path):
    bad = str(tmp_path / "bad.npz")
    np.savez(bad, data=np.zeros((5, 2)), data_lengths=[2, 2])
    with pytest.raises(DataError, match="data_lengths") as info:
        NpzDataset(bad)
    assert bad in str(info.value)
    (tmp_path / "x.npz").write_text("text")
    with pytest.raises(DataError, match="not an .npz"):
        NpzDataset(str(tmp_path / "x.npz"))


# ----- creating datasets from config values -----
def test_create_dataset_forms(tmp_path):
    path = str(tmp_path / "a.hdf")
    with HDFWriter(path, {"classes": DataKeyInfo(dim=3, sparse=True)}) as writer:
        for i in range(5):
            writer.insert(f"s{i}", {"classes": np.arange(i % 3, dtype=np.int32)})
    ds = create_dataset({"class": "HDFDataset", "files": [path], "cache_byte_size": "1M",
                         "use_cache_manager": True}, cache_size="0")
    assert isinstance(ds, HDFDataset) and ds.cache_size == 2**20  # the dict's own value wins
    assert create_dataset(path, cache_size="1K").cache_size == 1024  # the global key fills in
    ds = create_dataset("Task12AXDataset:num_seqs=7,seq_ordering=laplace:.2,fixed_random_seed=1")
    assert ds.corpus_num_seqs == 7 and ds.seq_ordering.seqs_per_bin == 2
    ds = create_dataset({"class": "Task12AXDataset", "num_seqs": 5}, default_seq_ordering="sorted",
                        random_seed_offset=16127)
    assert ds.seq_ordering.method == "sorted" and ds.random_seed_offset == 16127
    ds = create_dataset("HDFDataset:files=['%s'],partition_epoch=2" % path)
    ds.init_seq_order(1)
    assert ds.num_seqs == 3  # RETURNN's split of 5: the first part takes the odd one


@pytest.mark.parametrize("spec, words", [
    ({"class": "NumpyDumpDataset"},
     "'NumpyDumpDataset' in {'class': 'NumpyDumpDataset'} (a RETURNN dataset class this engine"),
    ({"files": ["a.hdf"]}, "Unknown dataset class None"),
    ({"class": "Task12AXDataset", "num_seq": 3}, "option 'num_seq' (did you mean 'num_seqs'?)"),
    ({"class": "Task12AXDataset", "seq_list_filter_file": "x"},
     "RETURNN defines that this engine does not implement: dataset (Task12AXDataset) option"),
    ("Task12AXDataset:num_seqs", "expected 'name=value'"),
    ({"class": "Task12AXDataset", "partition_epoch": 0}, "partition_epoch"),
    ({"class": "HDFDataset", "files": []}, "non-empty list"),
    ({"class": "DummyDataset", "input_dim": 3}, "required option(s) 'num_seqs', 'output_dim' missing"),
    ({"class": "HDFDataset", "files": ["a.hdf"], "cache_size": "lots"}, "cache_size 'lots'"),
])
def test_create_dataset_errors(spec, words):
    with pytest.raises(DataError) as info:
        create_dataset(spec)
    assert words in str(info.value)


def test_parse_byte_size():
    assert parse_byte_size("0") == 0 and parse_byte_size(1234) == 1234
    assert parse_byte_size("512M") == 512 * 2**20 and parse_byte_size("1.5G") == 3 * 2**29
    assert parse_byte_size("2KB") == 2048
