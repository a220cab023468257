"""Values in HDF corpora checked at open time: class ids within [0, dim), optionally no NaN/Inf; a bad
corpus ends rnn.py (one process and a 2-rank mpirun job) with the DataError exit code, not a traceback."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from engine.datasets import DataKeyInfo, HDFDataset, HDFWriter, create_dataset, hdf_values
from engine.runtime.errors import DATA_ERROR_EXIT_CODE, DataError
from helpers import ROOT, run_mpi, run_rnn

pytestmark = pytest.mark.tf_latest

KEYS = {"data": DataKeyInfo(dim=4), "classes": DataKeyInfo(dim=3, sparse=True)}


def write_corpus(path, num_seqs=20, seq_len=12, keys=KEYS, seed=0) -> str:
    rng = np.random.RandomState(seed)
    with HDFWriter(str(path), keys) as writer:
        for i in range(num_seqs):
            data = {}
            for key, info in keys.items():
                data[key] = (rng.randint(0, info.dim, seq_len).astype(info.dtype) if info.sparse
                             else rng.standard_normal((seq_len, info.dim)).astype(info.dtype))
            writer.insert(f"seq-{i}", data)
    return str(path)


def poke(path, obj, row, value, column=None):
    with h5py.File(path, "r+") as f:
        if column is None:
            f[obj][row] = value
        else:
            f[obj][row, column] = value


@pytest.mark.parametrize("value", [99, 3, -1])
def test_class_id_outside_dim_names_file_object_sequence_value_and_dim(tmp_path, value):
    path = write_corpus(tmp_path / "c.hdf")
    poke(path, "targets/data/classes", 5 * 12 + 7, value)  # sequence 5, frame 7
    with pytest.raises(DataError) as info:
        HDFDataset(path)
    message = str(info.value)
    for part in (f"HDF file '{path}'", "object 'targets/data/classes'", f"class id {value} ",
                 "sequence 'seq-5' (number 5, frame 7)", "outside [0, 3)",
                 "dim 3 from targets/size attribute 'classes'"):
        assert part in message, message


def test_sparse_inputs_are_checked_against_input_patt_size(tmp_path):
    keys = {"data": DataKeyInfo(dim=10, sparse=True), "classes": DataKeyInfo(dim=3, sparse=True)}
    path = write_corpus(tmp_path / "s.hdf", keys=keys)
    HDFDataset(path).close()
    poke(path, "inputs", 0, 10)
    with pytest.raises(DataError, match=r"object 'inputs': class id 10 in sequence 'seq-0' \(number 0, "
                                        r"frame 0\) is outside \[0, 10\) \(dim 10 from root attribute "
                                        r"inputPattSize\)"):
        HDFDataset(path)


def test_check_reads_block_by_block_and_finds_the_first_bad_row(tmp_path, monkeypatch):
    """Blocks much smaller than the stream: the first bad value is found in a later block, and its
    row maps to the right sequence across block boundaries."""
    path = write_corpus(tmp_path / "b.hdf", num_seqs=50)
    poke(path, "targets/data/classes", 40 * 12 + 11, 7)
    poke(path, "targets/data/classes", 45 * 12, 8)
    reads = []
    real_blocks = hdf_values._blocks

    def counting_blocks(ds):
        for start, block in real_blocks(ds):
            reads.append(len(block))
            yield start, block

    monkeypatch.setattr(hdf_values, "_BLOCK_BYTES", 64)  # 16 int32 rows per block
    monkeypatch.setattr(hdf_values, "_blocks", counting_blocks)
    with pytest.raises(DataError, match=r"class id 7 in sequence 'seq-40' \(number 40, frame 11\)"):
        HDFDataset(path)
    assert max(reads) <= 16 and len(reads) > 10


def test_nan_and_inf_only_rejected_with_check_finite(tmp_path):
    path = write_corpus(tmp_path / "f.hdf")
    poke(path, "inputs", 3 * 12 + 2, np.inf, column=1)
    poke(path, "inputs", 9 * 12, np.nan, column=0)
    HDFDataset(path).close()  # off by default
    with pytest.raises(DataError) as info:
        create_dataset({"class": "HDFDataset", "files": [path], "check_finite": True})
    message = str(info.value)
    assert f"HDF file '{path}', object 'inputs': value inf in sequence 'seq-3' (number 3, frame 2) " \
           "is not finite (check_finite is on)" in message, message
    with pytest.raises(DataError, match="check_finite must be True or False"):
        HDFDataset(path, check_finite="yes")


def test_clean_corpus_passes_both_checks(tmp_path):
    path = write_corpus(tmp_path / "ok.hdf")
    dataset = HDFDataset(path, check_finite=True)
    dataset.init_seq_order(1)
    assert dataset.num_seqs == 20 and dataset.get_data(19, "classes").max() < 3
    dataset.close()


CONFIG = """
train = {"class": "HDFDataset", "files": [%(train)r]}
network = {"lstm": {"class": "rec", "unit": "LSTMBlock", "n_out": 8},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
batch_size = 120
num_epochs = 1
model = %(model)r
"""


def bad_corpus_config(tmp_path) -> str:
    train = write_corpus(tmp_path / "train.hdf")
    poke(train, "targets/data/classes", 30, 99)
    config = tmp_path / "bad.py"
    config.write_text(CONFIG % {"train": train, "model": str(tmp_path / "net")})
    return str(config)


def test_rnn_exits_with_the_data_error_code_before_training(tmp_path):
    r = run_rnn([bad_corpus_config(tmp_path)], timeout=120)
    assert r.returncode == DATA_ERROR_EXIT_CODE == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "class id 99 in sequence 'seq-2' (number 2, frame 6) is outside [0, 3)" in r.stderr, r.stderr


@pytest.mark.mpi
@pytest.mark.version_independent
def test_two_ranks_exit_with_the_data_error_code(tmp_path):
    r = run_mpi(2, [str(ROOT / "rnn.py"), bad_corpus_config(tmp_path), "++use_horovod", "1"], timeout=120)
    assert r.returncode == DATA_ERROR_EXIT_CODE, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "class id 99" in r.stderr, r.stderr
    assert not (tmp_path / "net.001").exists()
