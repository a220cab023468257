"""``hdf-dump`` (engine/tools/hdf_dump.py, run as ``tools/hdf_dump.py``) on every input form, and
``dump-dataset``."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from engine.datasets import DataKeyInfo, HDFDataset, HDFWriter, Task12AXDataset
from engine.runtime.errors import DATA_ERROR_EXIT_CODE
from engine.tools import dump_dataset, hdf_dump
from helpers import run_on_terminal, screen

pytestmark = pytest.mark.tf_latest
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def contents(dataset, epoch=1):
    dataset.init_seq_order(epoch)
    return [(dataset.get_seq_tag(i), {k: dataset.get_data(i, k).tolist() for k in dataset.data_keys})
            for i in range(dataset.num_seqs)]


def small_hdf(path, tags):
    with HDFWriter(str(path), {"data": DataKeyInfo(dim=2), "classes": DataKeyInfo(dim=3, sparse=True)},
                   labels={"classes": ["x", "y", "z"]}) as writer:
        for i, tag in enumerate(tags):
            writer.insert(tag, {"data": np.full((i + 1, 2), i, np.float32),
                                "classes": np.arange(i % 3, dtype=np.int32)})
    return str(path)


TWELVE_AX = {"class": "Task12AXDataset", "num_seqs": 12, "fixed_random_seed": 5}


@pytest.mark.parametrize("form", ["dict", "class-string", "config", "config-dev", "hdf-list", "npz"])
def test_dump_every_input_form(tmp_path, form, capsys):
    out = str(tmp_path / "out.hdf")
    expected = contents(Task12AXDataset(num_seqs=12, fixed_random_seed=5))
    if form == "dict":
        arg = repr(TWELVE_AX)
    elif form == "class-string":
        arg = "Task12AXDataset:num_seqs=12,fixed_random_seed=5"
    elif form.startswith("config"):
        arg = str(tmp_path / "setup.config")
        with open(arg, "w") as f:
            f.write(f"#!rnn.py\ntask = 'train'\ntrain = {TWELVE_AX!r}\n"
                    f"dev = {dict(TWELVE_AX, num_seqs=4)!r}\ncache_size = '0'\nbatch_size = 100\n")
        if form == "config-dev":
            expected = contents(Task12AXDataset(num_seqs=4, fixed_random_seed=5))
    elif form == "hdf-list":
        a, b = small_hdf(tmp_path / "a.hdf", ["a0", "a1"]), small_hdf(tmp_path / "b.hdf", ["b0", "b1", "b2"])
        arg = f"{a},{b}"
        expected = contents(HDFDataset([a, b]))
    else:
        arg = str(tmp_path / "c.npz")
        np.savez(arg, data=np.arange(6, dtype=np.float32).reshape(3, 2), data_lengths=[1, 2],
                 seq_tags=["p", "q"])
        expected = [("p", {"data": [[0.0, 1.0]]}), ("q", {"data": [[2.0, 3.0], [4.0, 5.0]]})]
    argv = [arg, out] + (["--dataset", "dev"] if form == "config-dev" else [])
    assert hdf_dump.main(argv) == 0
    printed = capsys.readouterr().out
    assert f"Wrote {len(expected)} sequences to {out}" in printed and "MiB" in printed
    assert contents(HDFDataset(out)) == expected


def test_range_epoch_and_labels(tmp_path):
    src = small_hdf(tmp_path / "a.hdf", [f"s{i}" for i in range(6)])
    out = str(tmp_path / "part.hdf")
    spec = repr({"class": "HDFDataset", "files": [src], "seq_ordering": "reverse"})
    assert hdf_dump.main([spec, out, "--start_seq", "1", "--end_seq", "3", "--epoch", "2"]) == 0
    dumped = HDFDataset(out)
    assert [tag for tag, _ in contents(dumped)] == ["s4", "s3", "s2"]  # reverse order, 1..3 inclusive
    assert dumped.labels == {"classes": ["x", "y", "z"]}


def test_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "out.hdf"
    out.write_bytes(b"precious")
    assert hdf_dump.main([repr(TWELVE_AX), str(out)]) == DATA_ERROR_EXIT_CODE
    assert "--overwrite" in capsys.readouterr().err and out.read_bytes() == b"precious"
    assert hdf_dump.main([repr(TWELVE_AX), str(out), "--overwrite"]) == 0
    assert HDFDataset(str(out)).corpus_num_seqs == 12


@pytest.mark.parametrize("arg, words", [
    ("NoSuchDataset:num_seqs=3", "Unknown dataset class 'NoSuchDataset'"),
    ("missing.hdf", "does not exist"),
])
def test_bad_input_is_one_clear_message(tmp_path, arg, words, capsys):
    out = tmp_path / "o.hdf"
    assert hdf_dump.main([arg, str(out)]) == DATA_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and not out.exists()


def test_config_without_the_dataset(tmp_path, capsys):
    config = tmp_path / "c.py"
    config.write_text("train = 'Task12AXDataset:num_seqs=3'\n")
    assert hdf_dump.main([str(config), str(tmp_path / "o.hdf"), "--dataset", "eval"]) == DATA_ERROR_EXIT_CODE
    assert "defines no 'eval' dataset" in capsys.readouterr().err


def test_command_line_entry(tmp_path):
    """The real script in a child process (also checks it runs from another working directory)."""
    out = tmp_path / "cli.hdf"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "hdf_dump.py"),
                           "Task12AXDataset:num_seqs=5,fixed_random_seed=1", str(out)],
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "Wrote 5 sequences" in proc.stdout and out.exists()


def test_progress_bar_on_a_terminal(tmp_path):
    out = tmp_path / "big.hdf"
    returncode, shown, _ = run_on_terminal([sys.executable, os.path.join(ROOT, "tools", "hdf_dump.py"),
                                            "Task12AXDataset:num_seqs=2000", str(out)], stderr_too=True)
    assert returncode == 0, shown
    assert re.search(r"hdf_dump:  *\d+%\|.*\| \d+/2000 \[", shown) and "seq/s" in shown, shown
    assert screen(shown)[-1].startswith("Wrote 2000 sequences to ")  # the bar is gone


def test_dump_dataset_info(tmp_path, capsys):
    src = small_hdf(tmp_path / "a.hdf", ["first", "second", "third"])
    assert dump_dataset.main([src, "--num_seqs", "2"]) == 0
    text = capsys.readouterr().out
    assert "Sequences: 3 in the corpus, 3 in epoch 1" in text
    assert "classes" in text and "Labels of classes (3): x, y, z" in text
    assert "Sequence 1 'second'" in text and "Sequence 2" not in text
    data_row = next(line for line in text.splitlines() if line.startswith("data "))
    # key, dim, sparse, dtype ... frames, min, max, mean length
    assert data_row.split()[:4] == ["data", "2", "no", "float32"]
    assert data_row.split()[-4:] == ["6", "1", "3", "2.0"]
