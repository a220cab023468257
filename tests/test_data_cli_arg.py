"""dataset_from_cli_arg (the dataset argument of the data tools): a file is executed as a Python config
only when it says it is one (.py, .config, a '#!' first line); any other file that is not HDF or .npz is
refused, naming it."""
from __future__ import annotations

import numpy as np
import pytest

from engine.datasets import DataKeyInfo, HDFDataset, HDFWriter, NpzDataset, dataset_from_cli_arg
from engine.runtime.errors import DataError

pytestmark = pytest.mark.tf_latest

CONFIG = "train = 'Task12AXDataset:num_seqs=3'\nopen({marker!r}, 'w').close()\n"


@pytest.mark.parametrize("name, first_line", [("cfg.py", ""), ("setup.config", ""),
                                              ("train_cfg", "#!rnn.py\n")])
def test_declared_configs_are_executed(tmp_path, name, first_line):
    marker = tmp_path / "executed"
    path = tmp_path / name
    path.write_text(first_line + CONFIG.format(marker=str(marker)))
    dataset = dataset_from_cli_arg(str(path))
    assert dataset.corpus_num_seqs == 3 and marker.exists()


@pytest.mark.parametrize("name", ["notes.txt", "train_cfg", "corpus.bin"])
def test_other_files_are_refused_and_never_executed(tmp_path, name):
    marker = tmp_path / "executed"
    path = tmp_path / name
    path.write_text(CONFIG.format(marker=str(marker)))
    with pytest.raises(DataError) as info:
        dataset_from_cli_arg(str(path))
    message = str(info.value)
    assert f"'{path}' is not an HDF5 file, not a .npz archive and not a config file" in message
    assert ".py or .config or start with a '#!' line" in message
    assert not marker.exists()


def test_hdf_and_npz_files_are_read_as_data_whatever_their_name(tmp_path):
    hdf = tmp_path / "corpus.data"  # HDF5 by content, not by name
    with HDFWriter(str(hdf), {"classes": DataKeyInfo(dim=3, sparse=True)}) as writer:
        writer.insert("s0", {"classes": np.array([1, 2], dtype=np.int32)})
    assert isinstance(dataset_from_cli_arg(str(hdf)), HDFDataset)
    npz = tmp_path / "corpus.npz"
    np.savez(npz, data=np.zeros((5, 3), np.float32), data_lengths=np.array([2, 3]))
    assert isinstance(dataset_from_cli_arg(str(npz)), NpzDataset)
