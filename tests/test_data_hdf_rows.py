"""Output files laid out first and filled by several writers (the forward task's): read back by h5py and by
the engine's HDF reader, in RETURNN's layout."""
import h5py
import numpy as np
import pytest

from engine.datasets import create_dataset
from engine.datasets.hdf_rows import RowWriter, create_rows_file
from engine.runtime.errors import DataError

pytestmark = pytest.mark.tf_latest


def test_two_writers_fill_disjoint_rows_of_one_file(tmp_path):
    path = str(tmp_path / "out.hdf")
    lengths = np.array([3, 0, 5, 2])
    offset = create_rows_file(path, ["a", "b", "c", "d"], lengths, 4)
    rng = np.random.RandomState(0)
    rows = [rng.randn(n, 4).astype(np.float32) for n in lengths]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    first, second = RowWriter(path, offset, 4), RowWriter(path, offset, 4)
    for k in (2, 0):
        first.write(starts[k], rows[k])
    for k in (3, 1):
        second.write(starts[k], rows[k])
    first.close()
    second.close()
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["inputs"][:], np.concatenate(rows))
        assert f["seqLengths"][:].tolist() == [[3, 3], [0, 0], [5, 5], [2, 2]]
        assert f.attrs["inputPattSize"] == 4 and f.attrs["numTimesteps"] == 10
    dataset = create_dataset(path)
    dataset.init_seq_order(1)
    assert [dataset.get_seq_tag(i) for i in range(4)] == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(dataset.get_data(2, "data"), rows[2])


def test_a_file_without_frames(tmp_path):
    path = str(tmp_path / "empty.hdf")
    assert create_rows_file(path, ["a"], np.array([0]), 3) is None
    writer = RowWriter(path, None, 3)
    writer.write(0, np.zeros((0, 3), np.float32))
    writer.close()
    with h5py.File(path) as f:
        assert f["inputs"].shape == (0, 3)


def test_a_missing_file_names_the_shared_storage(tmp_path):
    with pytest.raises(DataError, match="storage that every rank sees"):
        RowWriter(str(tmp_path / "nowhere.hdf"), 0, 2)
