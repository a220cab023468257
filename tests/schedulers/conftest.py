"""What the SLURM and Grid Engine tests share: the training job they submit (the 12AX config on 2 ranks,
epochs long enough to be interrupted in the middle), the uninterrupted reference run on the mpi backend,
and reading a saved model's parameters."""
from __future__ import annotations

import re
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import ROOT, child_env, run_mpi

CONFIG = str(ROOT / "configs" / "12ax.py")
EPOCHS = 3
# 12000 sequences: 150 steps and about 4 s an epoch on 2 ranks here. A mid-epoch checkpoint every 50 steps
# tells the tests when epoch 2 is under way (saving changes no result): a signal sent when
# model.002.step* appears lands in the middle of epoch 2.
TRAIN_ARGS = ["++model", "out/12ax/model", "++num_epochs", str(EPOCHS), "++distributed_backend", "mpi",
              "++checkpoint_interval", "50",
              "++train", "{'class': 'Task12AXDataset', 'num_seqs': 12000, 'fixed_random_seed': 1, "
              "'seq_ordering': 'random'}"]


def job_env(extra: dict | None = None) -> dict:
    """The environment a job is submitted with (both schedulers pass it on to the job): this venv's
    interpreter and mpirun, one TensorFlow thread per rank, unbuffered output."""
    import sys

    return child_env({"PYTHON": sys.executable, "LOG_DIR": "log", **(extra or {})})


def params(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f["params"][name][()] for name in f["params"]}


def assert_bitwise_equal(model: Path, reference: Path) -> None:
    mine, theirs = params(model), params(reference)
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=f"{name} of {model}")


def wait_for_line(path: Path, pattern: str, timeout: float) -> str:
    """The log's text once a line matches ``pattern`` (regex); fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if re.search(pattern, text, re.M):
            return text
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern!r} in {path} within {timeout} s:\n{text}")


def wait_for_file(folder: Path, pattern: str, timeout: float) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {pattern} in {folder} within {timeout} s")


@pytest.fixture(scope="session")
def reference_model(tmp_path_factory) -> Path:
    """The last model of the same training run uninterrupted, by plain mpirun on the mpi backend."""
    folder = tmp_path_factory.mktemp("reference")
    r = run_mpi(2, [str(ROOT / "rnn.py"), CONFIG, "++use_horovod", "1", *TRAIN_ARGS], timeout=300,
                cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    return folder / "out" / "12ax" / f"model.{EPOCHS:03d}"
