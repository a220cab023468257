"""HDF corpus files: writer -> reader round trips, RETURNN's two writer variants, integrity errors."""
from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from engine.datasets import BatchOptions, DataKeyInfo, HDFDataset, HDFWriter, create_dataset, generate_batches
from engine.datasets.hdf_raw import RawRows
from engine.runtime.errors import DataError

pytestmark = pytest.mark.tf_latest


def corpus(num_seqs=6, dim=3, classes=5, seed=0, zero_len_at=(2,), other_len_offset=1):
    """Sequences with dense data, sparse classes and a non-frame-synced sparse 'orth'."""
    rng = np.random.RandomState(seed)
    seqs = []
    for i in range(num_seqs):
        n = 0 if i in zero_len_at else int(rng.randint(1, 9))
        seqs.append((f"seq-{i}", {
            "data": rng.standard_normal((n, dim)).astype(np.float32),
            "classes": rng.randint(0, classes, n).astype(np.int32),
            "orth": rng.randint(0, 7, n + other_len_offset).astype(np.int32),
        }))
    return seqs


KEYS = {"data": DataKeyInfo(dim=3), "classes": DataKeyInfo(dim=5, sparse=True),
        "orth": DataKeyInfo(dim=7, sparse=True)}


def write(path, seqs, keys=KEYS, **kwargs):
    with HDFWriter(str(path), keys, **kwargs) as writer:
        for tag, data in seqs:
            writer.insert(tag, data)
    return str(path)


def assert_same(dataset, seqs):
    dataset.init_seq_order(1)
    assert dataset.num_seqs == len(seqs)
    for i, (tag, data) in enumerate(seqs):
        assert dataset.get_seq_tag(i) == tag
        for key, arr in data.items():
            got = dataset.get_data(i, key)
            assert got.dtype == arr.dtype and got.shape == arr.shape, (key, got.dtype, got.shape)
            np.testing.assert_array_equal(got, arr)
            assert dataset.get_seq_length(i)[key] == len(arr)


# ----- round trips -----
@pytest.mark.parametrize("cache_size", [0, 300, "1G"])
def test_round_trip_sparse_dense_unsynced_zero_length(tmp_path, cache_size):
    seqs = corpus()
    labels = {"classes": ["a", "b", "c", "d", "e"], "orth": [f"ø{i}" for i in range(7)]}
    path = write(tmp_path / "c.hdf", seqs, labels=labels)
    ds = HDFDataset(path, cache_size=cache_size)
    cached = [s.cache_rows / max(1, s.ds.shape[0]) for s in ds.files[0].streams.values()]
    # 0: all from file; 300 bytes: the small target streams whole, a prefix of 'data'; 1G: everything
    assert cached == {0: [0, 0, 0], 300: [pytest.approx(cached[0]), 1, 1], "1G": [1, 1, 1]}[cache_size]
    assert cache_size != 300 or 0 < cached[0] < 1
    assert ds.data_keys == ["data", "classes", "orth"]
    assert ds.num_outputs == {"data": (3, 2), "classes": (5, 1), "orth": (7, 1)}
    assert ds.is_sparse("classes") and not ds.is_sparse("data")
    assert ds.get_data_shape("data") == (3,) and ds.get_data_shape("classes") == ()
    assert ds.labels == labels
    assert_same(ds, seqs)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int16", "int32", "int64",
                                   "uint8", "uint16", "uint32"])
def test_round_trip_every_dtype(tmp_path, dtype):
    rng = np.random.RandomState(1)
    class_dtype = dtype if np.dtype(dtype).kind in "iu" else "int32"  # sparse keys hold class indices
    keys = {"data": DataKeyInfo(dim=4, dtype=dtype),
            "classes": DataKeyInfo(dim=50, sparse=True, dtype=class_dtype)}
    seqs = [(f"s{i}", {"data": (rng.rand(n, 4) * 50).astype(dtype),
                       "classes": rng.randint(0, 50, n).astype(class_dtype)})
            for i, n in enumerate([3, 0, 7])]
    ds = HDFDataset(write(tmp_path / "t.hdf", seqs, keys))
    assert ds.get_data_dtype("data") == dtype
    # integer dense data with a feature axis stays dense; 1-D integer data is sparse
    assert not ds.is_sparse("data") and ds.is_sparse("classes")
    assert_same(ds, seqs)
    with pytest.raises(DataError, match="integer dtype"):
        DataKeyInfo(dim=3, sparse=True, dtype="float32")
    ds.init_seq_order(1)
    batch = next(iter(generate_batches(ds, BatchOptions(100))))
    assert batch.data["classes"].dtype == np.int32 and batch.data["data"].dtype == np.dtype(dtype)


def test_unicode_tags_and_labels(tmp_path):
    seqs = [("Grüße/ß/日本語-1", {"classes": np.array([0, 1], np.int32)}),
            ("ü-2", {"classes": np.array([1], np.int32)})]
    keys = {"classes": DataKeyInfo(dim=2, sparse=True)}
    ds = HDFDataset(write(tmp_path / "u.hdf", seqs, keys, labels={"classes": ["ja", "nein✓"]}))
    assert ds.labels == {"classes": ["ja", "nein✓"]}
    assert_same(ds, seqs)


def test_data_only_file_has_returnn_layout(tmp_path):
    """Forward output: dense data only -> no targets group, 2 seqLengths columns (RETURNN's dummy)."""
    seqs = [(f"s{i}", {"data": np.full((n, 2), i, np.float32)}) for i, n in enumerate([2, 0, 3])]
    path = write(tmp_path / "f.hdf", seqs, {"data": DataKeyInfo(dim=2)})
    with h5py.File(path, "r") as f:
        assert "targets" not in f
        assert f["seqLengths"].shape == (3, 2) and f["seqLengths"].dtype == np.int32
        assert f.attrs["inputPattSize"] == 2 and f.attrs["numSeqs"] == 3 and f.attrs["numTimesteps"] == 5
        assert f["labels"].shape == (0,)
    assert_same(HDFDataset(path), seqs)


def test_writer_layout_matches_streaming_writer(tmp_path):
    path = write(tmp_path / "c.hdf", corpus())
    with h5py.File(path, "r") as f:
        assert set(f["targets"]) == {"data", "size", "labels"}
        assert list(f["targets/size"].attrs["classes"]) == [5, 1]
        assert f["seqLengths"].shape == (6, 3)  # inputs, then targets sorted: classes, orth
        np.testing.assert_array_equal(f["seqLengths"][:, 2] - f["seqLengths"][:, 1], 1)
        assert h5py.check_string_dtype(f["seqTags"].dtype) is not None
        assert f["inputs"].maxshape[0] is None and f["inputs"].chunks is not None


def test_multiple_files_concatenate_in_order(tmp_path):
    a, b = corpus(4, seed=1), corpus(3, seed=2)
    b = [(tag + "-b", data) for tag, data in b]
    pa, pb = write(tmp_path / "a.hdf", a), write(tmp_path / "b.hdf", b)
    assert_same(HDFDataset([pa, pb]), a + b)
    assert_same(create_dataset(f"{pa},{pb}"), a + b)
    ds = HDFDataset([pa, pb], seq_ordering="reverse")
    ds.init_seq_order(1)
    assert ds.get_seq_tag(0) == "seq-2-b" and ds.get_corpus_seq_idx(0) == 6


def test_many_writes_flush_in_parts(tmp_path):
    seqs = corpus(60, seed=3)
    path = tmp_path / "p.hdf"
    with HDFWriter(str(path), KEYS, flush_bytes=200) as writer:  # flushes every few sequences
        for tag, data in seqs:
            writer.insert(tag, data)
    assert_same(HDFDataset(str(path)), seqs)


# ----- RETURNN's writer variants, crafted with plain h5py -----
def returnn_file(path, seqs, variant, scalar_size=False):
    keys = ["classes", "orth"]
    lengths = np.array([[len(d["data"])] + [len(d[k]) for k in keys] for _, d in seqs], np.int32)
    with h5py.File(path, "w") as f:
        f.attrs["inputPattSize"] = 3
        tags = [t for t, _ in seqs]

        # hdf_dump: fixed S<max+1> tags, fixed-size datasets, only inputPattSize;
        # streaming: vlen str tags, resizable datasets, root attrs and an (empty) root labels
        def make(group, name, arr):
            resizable = {} if variant == "dump" else {"maxshape": (None,) + arr.shape[1:]}
            group.create_dataset(name, data=arr, **resizable)

        if variant == "dump":
            width = max(map(len, tags)) + 1
            f.create_dataset("seqTags", data=np.array([t.encode() for t in tags], dtype=f"S{width}"))
        else:
            make(f, "seqTags", np.array(tags, dtype=h5py.string_dtype()))
            f.attrs.update(numSeqs=len(seqs), numTimesteps=int(lengths[:, 0].sum()), numLabels=3, numDims=1)
            f.create_dataset("labels", (0,), dtype="S5")
        make(f, "seqLengths", lengths)
        make(f, "inputs", np.concatenate([d["data"] for _, d in seqs]))
        for i, key in enumerate(keys):
            make(f.require_group("targets/data"), key, np.concatenate([d[key] for _, d in seqs]))
            dim = [5, 7][i]
            f.require_group("targets/size").attrs[key] = dim if scalar_size else np.array([dim, 1])
            names = [f"{key}-class-{j}".encode() for j in range(dim)]
            if variant == "streaming":
                names = [b"dummy-label"]
            f.require_group("targets/labels").create_dataset(key, data=np.array(names))
    return str(path)


@pytest.mark.parametrize("variant", ["dump", "streaming"])
@pytest.mark.parametrize("scalar_size", [False, True])
def test_reads_returnn_writer_variants(tmp_path, variant, scalar_size):
    seqs = corpus()
    ds = HDFDataset(returnn_file(tmp_path / "r.hdf", seqs, variant, scalar_size))
    assert ds.num_outputs == {"data": (3, 2), "classes": (5, 1), "orth": (7, 1)}
    assert_same(ds, seqs)
    # dump variant has real-length label lists; the streaming writer's one-element dummy is dropped
    assert ("classes" in ds.labels) == (variant == "dump")


def test_fixed_width_tags_cut_at_nul(tmp_path):
    seqs = corpus(3)
    path = returnn_file(tmp_path / "r.hdf", seqs, "dump")
    ds = HDFDataset(path)
    ds.init_seq_order(1)
    assert [ds.get_seq_tag(i) for i in range(3)] == ["seq-0", "seq-1", "seq-2"]


def test_compressed_and_big_endian_streams_read_through_h5py(tmp_path):
    seqs = corpus()
    path = str(tmp_path / "z.hdf")
    returnn_file(path, seqs, "dump")
    with h5py.File(path, "r+") as f:  # rewrite the streams gzip-compressed and big-endian
        inputs, classes = f["inputs"][...], f["targets/data/classes"][...]
        del f["inputs"], f["targets/data/classes"]
        f.create_dataset("inputs", data=inputs, compression="gzip", chunks=(4, 3))
        f["targets/data"].create_dataset("classes", data=classes.astype(">i4"))
    ds = HDFDataset(path)
    assert ds.files[0].streams["data"].raw is None and ds.files[0].streams["classes"].raw is None
    assert ds.files[0].streams["orth"].raw is not None
    assert_same(ds, seqs)  # native byte order out
    ds.init_seq_order(1)
    (batch,) = list(generate_batches(ds, BatchOptions(1000)))
    for j, (_, data) in enumerate(seqs):
        n = len(data["classes"])
        np.testing.assert_array_equal(batch.data["classes"][j, :n], data["classes"])
        np.testing.assert_array_equal(batch.data["data"][j, :n], data["data"])


# ----- raw reads agree with h5py for every layout -----
@pytest.mark.parametrize("layout", ["contiguous", "chunked", "chunked-partial-rows", "compressed"])
def test_raw_path_and_fallback_agree(tmp_path, layout):
    data = np.arange(1000 * 6, dtype=np.float32).reshape(1000, 6)
    opts = {"contiguous": {}, "chunked": {"chunks": (64, 6), "maxshape": (None, 6)},
            "chunked-partial-rows": {"chunks": (64, 3)},
            "compressed": {"chunks": (64, 6), "compression": "gzip"}}
    path = str(tmp_path / "l.hdf")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, **opts[layout])
    with h5py.File(path, "r") as f:
        fd = os.open(path, os.O_RDONLY)
        try:
            raw = RawRows.open(fd, f["x"])
            assert (raw is not None) == (layout in ("contiguous", "chunked"))
            if raw is not None:
                for start, n in [(0, 1), (60, 10), (63, 130), (999, 1), (500, 0)]:
                    out = np.empty((n, 6), np.float32)
                    raw.read_into(start, out)
                    np.testing.assert_array_equal(out, data[start:start + n])
        finally:
            os.close(fd)


# ----- integrity errors, each naming file and object -----
def broken(tmp_path, mutate):
    path = write(tmp_path / "b.hdf", corpus())
    with h5py.File(path, "r+") as f:
        mutate(f)
    return path


def replace(f, name, data):
    del f[name]
    f.create_dataset(name, data=data)


@pytest.mark.parametrize("mutate, obj, words", [
    (lambda f: f.__delitem__("seqTags"), "seqTags", "missing"),
    (lambda f: f.__delitem__("seqLengths"), "seqLengths", "missing"),
    (lambda f: replace(f, "seqLengths", f["seqLengths"][:, 0]), "seqLengths", "2-D"),
    (lambda f: replace(f, "seqLengths", f["seqLengths"][:, :2]), "seqLengths", "columns"),
    (lambda f: replace(f, "seqLengths", f["seqLengths"][:-1]), "seqTags", "rows"),
    (lambda f: replace(f, "seqLengths", f["seqLengths"][...] * np.array([1, 1, -1])), "seqLengths",
     "negative"),
    (lambda f: replace(f, "seqLengths", f["seqLengths"][...] + np.array([0, 1, 0])), "targets/data/classes",
     "sums to"),
    (lambda f: replace(f, "inputs", f["inputs"][:-1]), "inputs", "sums to"),
    (lambda f: f.__delitem__("targets/size"), "targets/size", "missing"),
    (lambda f: f.__delitem__("targets/labels"), "targets/labels", "missing"),
    (lambda f: f.__delitem__("targets/data"), "targets/data", "missing"),
    (lambda f: f["targets/size"].attrs.__delitem__("orth"), "targets/size", "orth"),
    (lambda f: f["targets/size"].attrs.__setitem__("classes", [5, 2]), "targets/size attribute 'classes'",
     "ndim"),
])
def test_integrity_errors(tmp_path, mutate, obj, words):
    path = broken(tmp_path, mutate)
    with pytest.raises(DataError) as info:
        HDFDataset(path)
    message = str(info.value)
    assert path in message and f"'{obj}'" in message and words in message, message


def test_not_hdf5_and_truncated_and_missing(tmp_path):
    text = tmp_path / "text.hdf"
    text.write_text("not an hdf file")
    with pytest.raises(DataError, match="not an HDF5 file"):
        HDFDataset(str(text))
    path = write(tmp_path / "t.hdf", corpus(50))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(DataError, match="truncated") as info:
        HDFDataset(path)
    assert path in str(info.value)
    with pytest.raises(DataError, match="does not exist"):
        HDFDataset(str(tmp_path / "nope.hdf"))


def test_files_that_disagree_name_both(tmp_path):
    a = write(tmp_path / "a.hdf", corpus())
    keys = dict(KEYS, classes=DataKeyInfo(dim=6, sparse=True))
    b = write(tmp_path / "b.hdf", corpus(), keys)
    with pytest.raises(DataError, match="disagree") as info:
        HDFDataset([a, b])
    assert a in str(info.value) and b in str(info.value) and "classes" in str(info.value)
    c = write(tmp_path / "c.hdf", [(t, {"data": d["data"]}) for t, d in corpus()], {"data": KEYS["data"]})
    with pytest.raises(DataError, match="different data keys"):
        HDFDataset([a, c])


# ----- writer: bad input and interrupted writes -----
def test_writer_rejects_bad_sequences(tmp_path):
    path = tmp_path / "w.hdf"
    with HDFWriter(str(path), KEYS) as writer:
        good = corpus(1)[0][1]
        with pytest.raises(DataError, match="expected exactly"):
            writer.insert("x", {"data": good["data"]})
        with pytest.raises(DataError, match=r"expected shape \(T, 3\)"):
            writer.insert("x", dict(good, data=np.zeros((2, 4), np.float32)))
        with pytest.raises(DataError, match=r"class indices must lie in \[0, 5\)"):
            writer.insert("x", dict(good, classes=np.array([5], np.int32)))
        with pytest.raises(DataError, match="cannot be stored"):
            writer.insert("x", dict(good, classes=np.array([0.5])))
        writer.insert("ok", good)
    assert HDFDataset(str(path)).corpus_num_seqs == 1
    with pytest.raises(DataError, match="exists already"):
        HDFWriter(str(path), KEYS, overwrite=False)


def test_exception_inside_writer_leaves_no_file(tmp_path):
    path = tmp_path / "x.hdf"
    with pytest.raises(RuntimeError):
        with HDFWriter(str(path), KEYS, flush_bytes=10) as writer:
            for tag, data in corpus(5):
                writer.insert(tag, data)
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_existing_file_survives_failed_overwrite(tmp_path):
    path = write(tmp_path / "x.hdf", corpus(3))
    with pytest.raises(RuntimeError):
        with HDFWriter(path, KEYS) as writer:
            writer.insert(*corpus(1)[0])
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == ["x.hdf"]
    assert HDFDataset(path).corpus_num_seqs == 3


def test_killed_writer_leaves_nothing_under_final_name(tmp_path):
    path = tmp_path / "killed.hdf"
    script = (
        "import numpy as np\n"
        "from engine.datasets import HDFWriter, DataKeyInfo\n"
        f"w = HDFWriter({str(path)!r}, {{'data': DataKeyInfo(dim=8)}}, flush_bytes=1000)\n"
        "i = 0\n"
        "while True:\n"
        "    w.insert(f's{i}', {'data': np.zeros((50, 8), np.float32)})\n"
        "    i += 1\n"
        "    if i == 20: print('writing', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.kill()
    finally:
        proc.wait(timeout=30)
    assert not path.exists()
    assert all(name.endswith(".tmp") for name in os.listdir(tmp_path))
