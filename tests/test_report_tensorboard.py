"""TensorBoard curves, read back with TensorBoard's own reader: tags, steps, and a resume without
duplicate steps after a run that died past its last checkpoint."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator  # installed by tools/install_env.sh

from engine.config.loader import Config
from engine.report.tensorboard import TensorBoardWriter, cut_event_files
from engine.runtime.errors import ConfigError
from helpers import ROOT, child_env

pytestmark = pytest.mark.tf_latest


def read_curves(log_dir) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] in file order, every event kept (no sampling, no purging of steps that
    go backwards: a duplicate step must show)."""
    acc = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.TENSORS: 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def steps(curves, tag):
    return [step for step, _ in curves[tag]]


def train(writer: TensorBoardWriter, first_epoch: int, last_epoch: int, steps_per_epoch: int,
          run: float) -> None:
    """Epochs of a fake run; ``run`` marks the values so that a test sees which run wrote them."""
    for epoch in range(first_epoch, last_epoch + 1):
        for step in range((epoch - 1) * steps_per_epoch + 1, epoch * steps_per_epoch + 1):
            writer.step(step, score=run + step / 1000, error=0.5, learning_rate=0.001, frames_per_sec=900.0)
        writer.epoch(epoch, {"train_score": run + epoch, "dev_score": run + epoch / 10, "dev_error": 0.2},
                     learning_rate=0.001, frames_per_sec=880.0, computing_percent=91.5,
                     collective_percent=6.0, data_wait_percent=1.5)


def test_tags_and_steps(tmp_path):
    writer = TensorBoardWriter(str(tmp_path), step_interval=25)
    assert not writer.step(24, score=1.0) and writer.wants_step(50)
    train(writer, 1, 2, 60, run=0)
    writer.close()
    curves = read_curves(tmp_path)
    assert set(curves) == {
        "train/score", "train/error", "train/learning_rate", "train/frames_per_sec",
        "epoch/train_score", "epoch/dev_score", "epoch/dev_error", "epoch/learning_rate",
        "epoch/frames_per_sec", "epoch/computing_percent", "epoch/collective_percent",
        "epoch/data_wait_percent"}
    assert steps(curves, "train/score") == [25, 50, 75, 100]
    assert curves["train/score"][1][1] == pytest.approx(0.05)
    assert steps(curves, "epoch/dev_score") == [1, 2]
    assert [v for _, v in curves["epoch/train_score"]] == [1.0, 2.0]
    assert curves["epoch/computing_percent"][0][1] == pytest.approx(91.5)


def test_resume_cuts_what_the_interrupted_run_wrote_past_its_checkpoint(tmp_path):
    first = TensorBoardWriter(str(tmp_path), step_interval=10)
    train(first, 1, 3, 40, run=0)
    for step in range(121, 151):  # epoch 4 dies after 30 steps; its checkpoint never came
        first.step(step, score=step / 1000)
    first.close()
    # Resume from the checkpoint of epoch 2 (global step 80): steps 90-150 and epoch 3 must go.
    second = TensorBoardWriter(str(tmp_path), step_interval=10, resume_step=80, resume_epoch=2)
    train(second, 3, 4, 40, run=100)
    second.close()
    curves = read_curves(tmp_path)
    assert steps(curves, "train/score") == list(range(10, 161, 10))
    assert steps(curves, "epoch/dev_score") == [1, 2, 3, 4]
    assert [v for _, v in curves["epoch/train_score"]] == [1.0, 2.0, 103.0, 104.0]
    assert dict(curves["train/score"])[90] == pytest.approx(100.09)  # from the resumed run
    assert dict(curves["train/score"])[80] == pytest.approx(0.08)  # from the first run


def test_a_fresh_run_starts_with_no_curves(tmp_path):
    old = TensorBoardWriter(str(tmp_path), step_interval=1)
    train(old, 1, 1, 3, run=0)
    old.close()
    fresh = TensorBoardWriter(str(tmp_path), step_interval=1)
    train(fresh, 1, 1, 2, run=100)
    fresh.close()
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 1
    curves = read_curves(tmp_path)
    assert curves["train/score"] == [(1, pytest.approx(100.001)), (2, pytest.approx(100.002))]


KILLED_RUN = """
import os, signal, sys
from engine.report.tensorboard import TensorBoardWriter
writer = TensorBoardWriter({log_dir!r}, step_interval=1)
for step in range(1, 21):
    writer.step(step, score=step / 1000)
writer.epoch(1, {{"train_score": 1.0}})
for step in range(21, 31):
    writer.step(step, score=step / 1000)
writer.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_resume_after_a_killed_run_with_a_torn_last_record(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN.format(root=str(ROOT), log_dir=str(tmp_path))],
                          env=child_env(), timeout=120)
    assert proc.returncode == -signal.SIGKILL
    (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    with open(path, "rb+") as f:  # the kill came in the middle of a record
        f.truncate(os.path.getsize(path) - 5)
    open(path + ".tmp-99", "wb").write(b"left by a killed rewrite")
    assert cut_event_files(str(tmp_path), max_step=25, max_epoch=1) == 4  # steps 26-29; 30 was torn
    assert not os.path.exists(path + ".tmp-99")
    assert cut_event_files(str(tmp_path), max_step=25, max_epoch=1) == 0  # a second cut changes nothing
    # As if the run had died this very second on a host whose name sorts last: the resumed run's file
    # must still come after it in name order, the order readers take the files in.
    os.rename(path, str(tmp_path / f"events.out.tfevents.{int(time.time())}.zzz.1.0.v2"))
    writer = TensorBoardWriter(str(tmp_path), step_interval=1, resume_step=25, resume_epoch=1)
    writer.step(26, score=1.0)
    writer.close()
    curves = read_curves(tmp_path)
    assert steps(curves, "train/score") == list(range(1, 27))
    assert steps(curves, "epoch/train_score") == [1]


KILLED_REWRITE = """
import os, signal
import tensorflow as tf
from engine.report.tensorboard import TensorBoardWriter, cut_event_files
writer = TensorBoardWriter({log_dir!r}, step_interval=1)
for step in range(1, 31):
    writer.step(step, score=step / 1000)
writer.close()
real_writer = tf.io.TFRecordWriter

class DiesAfterThreeRecords:  # the rewrite is killed half-way, its temp file on disk
    def __init__(self, path):
        self.writer, self.records = real_writer(path), 0
    def __enter__(self):
        return self
    def __exit__(self, *exc_info):
        self.writer.close()
    def write(self, record):
        self.writer.write(record)
        self.records += 1
        if self.records == 3:
            self.writer.flush()
            os.kill(os.getpid(), signal.SIGKILL)

tf.io.TFRecordWriter = DiesAfterThreeRecords
cut_event_files({log_dir!r}, max_step=10, max_epoch=0)
"""


def test_a_killed_rewrite_leaves_nothing_tensorboard_reads_and_its_temp_goes_at_the_next_start(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED_REWRITE.format(log_dir=str(tmp_path))],
                          env=child_env(), timeout=120)
    assert proc.returncode == -signal.SIGKILL
    names = os.listdir(tmp_path)
    (temp,) = [name for name in names if name.endswith(".tmp")]  # the killed rewrite's, with 3 records
    assert os.path.getsize(tmp_path / temp) > 0
    assert "tfevents" not in temp  # TensorBoard reads every file whose name contains "tfevents"
    assert steps(read_curves(tmp_path), "train/score") == list(range(1, 31))  # once each, no duplicates
    writer = TensorBoardWriter(str(tmp_path), step_interval=1, resume_step=10)
    writer.close()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    assert steps(read_curves(tmp_path), "train/score") == list(range(1, 11))


def test_temp_files_of_killed_rewrites_by_earlier_versions_are_removed(tmp_path):
    writer = TensorBoardWriter(str(tmp_path), step_interval=1)
    writer.step(1, score=1.0)
    writer.close()
    (event_file,) = os.listdir(tmp_path)
    stale = [f".{event_file}.k2j4_x8q.tmp", f"{event_file}.tmp-99", ".tb-rewrite.abc123.tmp"]
    kept = ["notes.tmp", ".other.tmp"]  # not ours
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"left by a killed rewrite")
    assert cut_event_files(str(tmp_path), max_step=1, max_epoch=0) == 0
    assert sorted(os.listdir(tmp_path)) == sorted([event_file] + kept)


def test_from_config(tmp_path):
    model = str(tmp_path / "run" / "model")
    writer = TensorBoardWriter.from_config(Config({"model": model}))
    assert writer.log_dir == str(tmp_path / "run" / "tensorboard") and writer.step_interval == 100
    writer.close()
    moved = TensorBoardWriter.from_config(Config({"model": model, "tensorboard_dir": str(tmp_path / "tb"),
                                                  "tensorboard_step_interval": "10"}))
    assert moved.log_dir == str(tmp_path / "tb") and moved.step_interval == 10
    moved.close()
    assert TensorBoardWriter.from_config(Config({"model": model, "tensorboard": False})) is None
    assert TensorBoardWriter.from_config(Config({})) is None
    with pytest.raises(ConfigError, match="'tensorboard_step_interval' must be at least 1"):
        TensorBoardWriter.from_config(Config({"model": model, "tensorboard_step_interval": 0}))
