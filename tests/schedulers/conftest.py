"""What the SLURM and Grid Engine tests share: the training job they submit (the 12AX config on 2 ranks,
epochs long enough to be interrupted in the middle), the uninterrupted reference run on the mpi backend,
reading a saved model's parameters, and checking that a job stopped by a signal continued from the very
checkpoint and step where the signal landed."""
from __future__ import annotations

import re
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import ROOT, child_env, run_mpi

CONFIG = str(ROOT / "configs" / "12ax.py")
EPOCHS = 4
# 12000 sequences: about 150 steps and 4 s an epoch on 2 ranks on an idle machine. A mid-epoch checkpoint
# every 50 steps tells the tests when epoch 2 is under way (saving changes no result). A signal sent when
# model.002.step* appears lands some steps later, how many depends on the scheduler and the machine's load
# (on a busy machine Grid Engine's took over 100 steps, into epoch 3): the tests read where the job
# stopped, and the epochs after epoch 2 leave room for the signal to land before the training ends.
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


# Rank 0's last line when the ranks stop on the signal (several ranks may have received it).
STOP_LINE = re.compile(r"stopping on request: SIGUSR1 received by rank \d+(?:; SIGUSR1 received by rank "
                       r"\d+)*; saved checkpoint (?P<path>\S+) \((?P<where>[^)]*)\); exiting with code 99")


def assert_resumed_where_it_stopped(log: str, signalled_after: Path) -> tuple[str, str]:
    """The job's log (both runs) shows one stop on SIGUSR1 that saved a checkpoint at or after the step of
    ``signalled_after`` (the mid-epoch checkpoint that was there when the signal was sent), and a second
    run that continued from exactly that checkpoint and step: in the middle of an epoch, or after an epoch
    when the signal landed at its end. Returns the first run's part of the log and the second's."""
    stops = list(STOP_LINE.finditer(log))
    assert stops and len({m["path"] for m in stops}) == 1, f"not one stop on SIGUSR1:\n{log}"
    stop = stops[-1]
    path, where = stop["path"], stop["where"]
    first, second = log[:stop.end()], log[stop.end():]
    sent = re.fullmatch(r"model\.(\d{3})\.step(\d+)", signalled_after.name)
    assert sent, signalled_after
    sent_epoch, sent_step = int(sent.group(1)), int(sent.group(2))
    mid_epoch = re.fullmatch(r"out/12ax/model\.(\d{3})\.step(\d+)", path)
    if mid_epoch:
        epoch, global_step = int(mid_epoch.group(1)), int(mid_epoch.group(2))
        at = re.fullmatch(rf"epoch {epoch}, step (\d+) of the epoch", where)
        assert at, log
        assert (epoch, global_step) >= (sent_epoch, sent_step), (signalled_after, log)
        resumed = [f"resuming in epoch {epoch} at global step {global_step} from {path}",
                   f"train epoch {epoch}: continuing after step {at.group(1)} ("]
    else:
        after = re.fullmatch(r"out/12ax/model\.(\d{3})", path)
        assert after and where == f"the end of epoch {int(after.group(1))}", log
        epoch = int(after.group(1))
        assert epoch >= sent_epoch, (signalled_after, log)
        resumed = [f"resuming after epoch {epoch} from {path}"]
    assert "resuming" not in first, log  # the first run started afresh
    assert second.count("resuming ") == 1, log
    for line in resumed:
        assert line in second, f"expected {line!r} after the stop:\n{log}"
    return first, second


@pytest.fixture(scope="session")
def reference_model(tmp_path_factory) -> Path:
    """The last model of the same training run uninterrupted, by plain mpirun on the mpi backend."""
    folder = tmp_path_factory.mktemp("reference")
    r = run_mpi(2, [str(ROOT / "rnn.py"), CONFIG, "++use_horovod", "1", *TRAIN_ARGS], timeout=900,
                cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    return folder / "out" / "12ax" / f"model.{EPOCHS:03d}"
