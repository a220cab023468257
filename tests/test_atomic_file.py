"""engine.runtime.atomic_file (checkpoints, learning-rate file, hostfiles) and HDFWriter: unpredictable temp
names created exclusively, planted symlinks not followed, nothing left behind on failure, file and
directory flushed to disk; a checkpoint that cannot be written is a clear error that keeps the old one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from engine.datasets import DataKeyInfo, HDFWriter
from engine.runtime import atomic_file
from engine.runtime.atomic_file import atomic_path, write_text_atomically
from helpers import ROOT, child_env

pytestmark = pytest.mark.tf_latest


def test_writes_whole_file_with_plain_open_permissions(tmp_path):
    path = tmp_path / "sub" / "lr"
    old = os.umask(0o027)
    try:
        write_text_atomically(str(path), "epoch 1\n")
    finally:
        os.umask(old)
    assert path.read_text() == "epoch 1\n" and os.listdir(path.parent) == ["lr"]
    assert (path.stat().st_mode & 0o777) == 0o640


def test_failure_leaves_the_previous_file_and_no_temp(tmp_path):
    path = tmp_path / "lr"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="crash"):
        with atomic_path(str(path)) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("crash")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["lr"]


def test_temp_names_are_unpredictable(tmp_path):
    names = set()
    for _ in range(3):
        with atomic_path(str(tmp_path / "net.001")) as tmp:
            names.add(os.path.basename(tmp))
            open(tmp, "w").close()
    assert len(names) == 3 and all(n.startswith(".net.001.") and n.endswith(".tmp") for n in names)


def test_symlink_planted_at_the_old_predictable_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "net.001"
    planted = tmp_path / f"net.001.tmp-{os.getpid()}"  # the name the old code used
    planted.symlink_to(victim)
    write_text_atomically(str(target), "checkpoint")
    assert target.read_text() == "checkpoint" and victim.read_text() == "precious"
    assert os.readlink(planted) == str(victim)


def test_symlink_planted_at_a_guessed_temp_name_is_skipped(tmp_path, monkeypatch):
    """Even a correctly guessed name is not followed: the temp file is created with O_EXCL, so mkstemp
    moves on to the next name."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / ".net.001.guessed.tmp").symlink_to(victim)
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(["guessed", "fresh"]))
    with atomic_path(str(tmp_path / "net.001")) as tmp:
        assert os.path.basename(tmp) == ".net.001.fresh.tmp"
        with open(tmp, "w") as f:
            f.write("checkpoint")
    assert victim.read_text() == "precious" and (tmp_path / "net.001").read_text() == "checkpoint"


def record_syncs(monkeypatch) -> list[str]:
    """What gets fsynced and renamed, in order: 'sync <path>' / 'rename <dst>'."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(f"sync {os.readlink(f'/proc/self/fd/{fd}')}")
        real_fsync(fd)

    def replace(src, dst):
        events.append(f"rename {dst}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_file_then_directory_are_flushed_around_the_rename(tmp_path, monkeypatch):
    events = record_syncs(monkeypatch)
    with atomic_path(str(tmp_path / "hosts")) as tmp:
        open(tmp, "w").close()
    assert events == [f"sync {tmp}", f"rename {tmp_path / 'hosts'}", f"sync {tmp_path}"]


def test_hdf_writer_flushes_file_and_directory_and_cleans_up(tmp_path, monkeypatch):
    events = record_syncs(monkeypatch)
    path = tmp_path / "corpus.hdf"
    with HDFWriter(str(path), {"classes": DataKeyInfo(dim=3, sparse=True)}) as writer:
        tmp = writer.tmp_path
        writer.insert("s0", {"classes": np.array([0, 2], dtype=np.int32)})
    assert os.path.basename(tmp).startswith(".corpus.hdf.")
    assert events == [f"sync {tmp}", f"rename {path}", f"sync {tmp_path}"]
    with pytest.raises(ValueError):
        with HDFWriter(str(tmp_path / "other.hdf"), {"classes": DataKeyInfo(dim=3, sparse=True)}):
            raise ValueError
    assert sorted(os.listdir(tmp_path)) == ["corpus.hdf"]


def test_os_errors_are_described_with_their_errno():
    assert atomic_file.describe_io_error(OSError(28, "No space left on device")) == \
        "No space left on device (ENOSPC)"
    h5py_style = OSError("Can't write data (file write failed: time = x, errno = 27, error message = "
                         "'File too large', buf = 0x1)")
    assert atomic_file.describe_io_error(h5py_style) == "File too large (EFBIG)"
    assert atomic_file.describe_io_error(RuntimeError("Can't decrement id ref count (unable to extend file "
                                                      "properly, errno = 28, error message = 'x')")) == \
        "No space left on device (ENOSPC)"
    assert atomic_file.describe_io_error(OSError("something else")) == "something else"


# A process whose files may not grow beyond 64 KiB (SIGXFSZ ignored, so writes fail with EFBIG):
# a small checkpoint fits, a big one over it or beside it fails.
FILE_SIZE_LIMIT = """
import json, os, resource, signal, sys
import numpy as np, tensorflow as tf
from engine.runtime.errors import EngineError
from engine.training.checkpoints.file_format import load_checkpoint, save_checkpoint
folder = sys.argv[1]
small = {"w": tf.Variable(np.full((10,), 1.0, np.float32))}
save_checkpoint(os.path.join(folder, "net.001"), small, [], epoch=1, global_step=10)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
big = {"w": tf.Variable(np.full((10,), 2.0, np.float32)), "v": tf.Variable(np.zeros((100, 1000), np.float32))}
errors = []
for name in ("net.001", "net.002"):
    try:
        save_checkpoint(os.path.join(folder, name), big, [], epoch=2, global_step=20)
    except EngineError as exc:
        errors.append(str(exc))
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
info = load_checkpoint(os.path.join(folder, "net.001"), small)
print(json.dumps({"errors": errors, "epoch": info.epoch, "w": small["w"].numpy().tolist(),
                  "files": sorted(os.listdir(folder))}))
"""


def test_checkpoint_that_cannot_be_written_is_a_clear_error_and_keeps_the_previous_one(tmp_path):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(FILE_SIZE_LIMIT), str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env=child_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert len(result["errors"]) == 2, result
    for name, error in zip(("net.001", "net.002"), result["errors"]):
        assert error.startswith(f"Cannot write checkpoint '{tmp_path / name}': File too large (EFBIG). "
                                "Earlier checkpoints are unchanged"), error
    assert result["epoch"] == 1 and result["w"] == [1.0] * 10
    assert result["files"] == ["net.001"]  # no temp file left behind
