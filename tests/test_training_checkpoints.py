"""Checkpoints within an epoch, in one process: the checkpoint_interval forms, when a checkpoint is due,
which mid-epoch checkpoint a run resumes from, the clean-up of older ones and of killed saves' temp files,
a stop by a signal through rnn.py (exit 99) and an exact resume, and a refused resume into a changed
batch plan. The 2-rank versions are in test_engine_resume.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from engine.config.loader import Config
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.file_format import (find_mid_epoch_checkpoints, mid_epoch_path,
                                                     remove_superseded)
from engine.training.checkpoints.interval import CheckpointInterval, CheckpointSchedule
from engine.training.checkpoints.resume import ResumePoint, choose_resume_point, resume_candidates
from helpers import ROOT, child_env, run

pytestmark = pytest.mark.tf_latest
SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")


@pytest.mark.parametrize("value, steps, seconds", [
    (100, 100, None), ("100", 100, None), ("100 steps", 100, None), ("1 step", 1, None),
    ("30 min", None, 1800.0), ("30min", None, 1800.0), ("1.5 h", None, 5400.0), ("2 hours", None, 7200.0),
    ("90 s", None, 90.0), ("45 sec", None, 45.0), (0, None, None), ("0", None, None), ("off", None, None),
    (None, None, None),
])
def test_interval_forms(value, steps, seconds):
    interval = CheckpointInterval.parse(value)
    assert (interval.steps, interval.seconds) == (steps, seconds)
    assert interval.enabled == bool(steps or seconds)


@pytest.mark.parametrize("value", [-5, "-5", "often", "1.5 steps", "10 days", True, "0 min", [10]])
def test_bad_intervals_are_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="checkpoint_interval"):
        CheckpointInterval.parse(value)


def test_a_step_interval_counts_global_steps_and_a_time_interval_the_clock():
    by_steps = CheckpointSchedule(CheckpointInterval(steps=4))
    assert [g for g in range(1, 13) if by_steps.due(g, step_in_epoch=g % 5)] == [4, 8, 12]
    assert not by_steps.due(8, step_in_epoch=0)  # an epoch's start: its checkpoint was just written
    now = [0.0]
    by_time = CheckpointSchedule(CheckpointInterval(seconds=60), clock=lambda: now[0])
    now[0] = 59.0
    assert not by_time.due(1, 1)
    now[0] = 60.0
    assert by_time.due(2, 2)
    by_time.saved()
    now[0] = 100.0
    assert not by_time.due(3, 3)


def test_resume_prefers_a_mid_epoch_checkpoint_newer_than_the_newest_epoch_and_orders_the_fallbacks(tmp_path):
    prefix = str(tmp_path / "net")
    assert resume_candidates(prefix) == []
    assert choose_resume_point(Config({"model": prefix}), None)[0].start_epoch == 1
    for name in ("net.001", "net.002", "net.002.step20", "net.003.step25", "net.003.step31"):
        (tmp_path / name).write_bytes(b"")
    assert resume_candidates(prefix) == [
        ResumePoint(3, prefix + ".003.step31", mid_epoch=True),
        ResumePoint(3, prefix + ".003.step25", mid_epoch=True), ResumePoint(3, prefix + ".002"),
        ResumePoint(2, prefix + ".002.step20", mid_epoch=True), ResumePoint(2, prefix + ".001")]
    (tmp_path / "net.003").write_bytes(b"")  # epoch 3 finished: its mid-epoch ones come after it
    assert resume_candidates(prefix)[:2] == [ResumePoint(4, prefix + ".003"),
                                             ResumePoint(3, prefix + ".003.step31", mid_epoch=True)]
    with pytest.raises(ConfigError, match="start_epoch"):
        choose_resume_point(Config({"model": prefix, "start_epoch": 0}), None)


def test_a_save_removes_older_mid_epoch_checkpoints_and_killed_saves_temp_files(tmp_path):
    prefix = str(tmp_path / "net")
    names = ["net.001", "net.002.step10", "net.002.step12", ".net.002.step14.k2j4_x9a.tmp",
             ".net.003.ab12cd.tmp", ".lr.txt.qq11ee.tmp", "net.002.step12.txt", "netx.002.step3"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    keep = mid_epoch_path(prefix, 2, 12)
    removed = remove_superseded(prefix, keep)
    assert sorted(os.path.basename(p) for p in removed) == [".net.002.step14.k2j4_x9a.tmp",
                                                            ".net.003.ab12cd.tmp", "net.002.step10"]
    assert sorted(os.listdir(tmp_path)) == sorted([".lr.txt.qq11ee.tmp", "net.001", "net.002.step12",
                                                   "net.002.step12.txt", "netx.002.step3"])
    assert find_mid_epoch_checkpoints(prefix) == [(2, 12, keep)]


def one_process_config(folder, **overrides) -> dict:
    values = {
        "train": {"class": "Task12AXDataset", "num_seqs": 40, "fixed_random_seed": 1,
                  "seq_ordering": "laplace:4"},
        "dev": {"class": "Task12AXDataset", "num_seqs": 8, "fixed_random_seed": 2},
        "network": {"lstm": {"class": "rec", "unit": "lstm", "n_out": 6, "dropout": 0.3},
                    "output": {"class": "softmax", "loss": "ce", "from": "lstm"}},
        "optimizer": {"class": "adam"}, "learning_rate": 0.02, "learning_rate_control": "newbob",
        "newbob_relative_error_threshold": 0.5, "model": str(folder / "net"), "batch_size": 200,
        "max_seqs": 4, "num_epochs": 2, "log_verbosity": 3, "checkpoint_interval": "3 steps",
    }
    values.update(overrides)
    return values


def train_one(folder, values: dict, *options: str, expect: int = 0):
    folder.mkdir(exist_ok=True)
    result = run([sys.executable, SCRIPT, str(folder), repr(values), *options], timeout=180)
    assert result.returncode == expect, result.stdout + result.stderr
    return None if expect else dict(np.load(folder / "rank0.npz")), result.stdout + result.stderr


@pytest.mark.slow  # several training runs (kill or stop, then resume)
def test_one_process_stop_and_exact_resume_without_a_learning_rate_file(tmp_path):
    """newbob whose learning-rate file is gone: its history comes back from the checkpoint. A resume into
    another batch plan is refused first, and changes nothing."""
    reference, _ = train_one(tmp_path / "reference", one_process_config(tmp_path / "reference"))
    values = one_process_config(tmp_path / "stopped")
    _, output = train_one(tmp_path / "stopped", values, "fail=SIGTERM", "fail_rank=0", "fail_step=13",
                          expect=99)
    assert output.count("stopping on request: SIGTERM received by rank 0; saved checkpoint") == 1, output

    _, output = train_one(tmp_path / "stopped", dict(values, batch_size=150), expect=2)
    assert "taken 4 steps into a different batch plan than this run makes" in output, output
    assert "Traceback" not in output

    os.remove(tmp_path / "stopped" / "net.learning_rates")  # written by default beside the checkpoints
    resumed, output = train_one(tmp_path / "stopped", values)
    assert "resuming in epoch 2 at global step 14" in output, output
    np.testing.assert_array_equal(resumed["params"], reference["params"])


@pytest.mark.slow  # several training runs (kill or stop, then resume)
def test_rnn_py_answers_sigterm_with_a_checkpoint_and_exit_99_then_resumes(tmp_path):
    values = one_process_config(tmp_path, num_epochs=1, checkpoint_interval=0, log_verbosity=5,
                                train={"class": "Task12AXDataset", "num_seqs": 4000, "fixed_random_seed": 1})
    config = tmp_path / "config.py"
    config.write_text("".join(f"{key} = {value!r}\n" for key, value in values.items()))
    command = [sys.executable, str(ROOT / "rnn.py"), str(config)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=child_env())
    lines = []
    for line in process.stdout:  # wait until training runs, then ask it to stop
        lines.append(line)
        if "train epoch 1, step 3," in line:
            process.send_signal(signal.SIGTERM)
            break
    output = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == 99, output
    stop = [line for line in output.splitlines() if line.startswith("stopping on request")]
    assert len(stop) == 1 and "SIGTERM received by rank 0; saved checkpoint" in stop[0], output
    saved = stop[0].split("saved checkpoint ")[1].split(" ")[0]
    assert os.path.isfile(saved) and ".001.step" in saved
    resumed = run(command, timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming in epoch 1 at global step {saved.rsplit('step', 1)[1]}" in resumed.stdout
    assert os.path.isfile(tmp_path / "net.001") and not os.path.exists(saved)  # superseded by the epoch's


class _Model:
    def __init__(self, trainable: list[str], frozen: list[str] = ()):
        self.trainable = {name: np.zeros(2, np.float32) for name in trainable}
        self.frozen = {name: np.zeros(2, np.float32) for name in frozen}

    def named_variables(self) -> dict:
        return {**self.trainable, **self.frozen}

    def named_trainable_variables(self) -> dict:
        return dict(self.trainable)


def _resume_with_sync_base(model: _Model, base: dict):
    """A Checkpointer continuing a 1-rank param-mode checkpoint 3 steps into epoch 2 whose base of the next
    average holds ``base``."""
    from engine.training.checkpoints.policy import Checkpointer
    from engine.training.checkpoints.resume import SYNC_BASE

    from engine.distributed.local_backend import LocalCommunicator
    from engine.distributed.strategy import Strategy

    strategy, restored = Strategy(LocalCommunicator()), []
    strategy.keeps_rank_state = True  # param mode: the ranks' own state comes from the checkpoint
    strategy.restore_sync_base = restored.append
    updater = type("Updater", (), {"named_variables": lambda self: {}})()
    checkpoints = Checkpointer(Config({}), strategy, model, updater, lr_control=None)
    checkpoints._loaded = (  # what ``load`` keeps of a checkpoint for ``restore_rank_states``
        {"ranks": 1, "global_step": 13, "learning_rate": 0.1},
        {SYNC_BASE: base, "resume": {"steps": np.array([3]), "batches_done": np.array([3]),
                                     "scores": np.zeros((1, 4)), "fingerprints": np.array([0])}})
    point = ResumePoint(2, "out/net.002.step13", mid_epoch=True)
    return restored, lambda: checkpoints.restore_rank_states(point)


def test_a_sync_base_with_other_parameter_names_is_refused_naming_them():
    base = {"a/W": np.ones(2, np.float32), "b/W": np.full(2, 2, np.float32)}
    restored, restore = _resume_with_sync_base(_Model(["b/W", "a/W"]), base)
    assert restore() == 10  # the global step at the epoch's start
    assert [list(v) for v in restored[0]] == [[2, 2], [1, 1]]  # in the model's order

    restored, restore = _resume_with_sync_base(_Model(["a/W", "c/W"], frozen=["b/W"]), base)
    with pytest.raises(ConfigError) as caught:
        restore()
    text = str(caught.value)
    assert "Cannot continue from the mid-epoch checkpoint 'out/net.002.step13'" in text
    assert "lacks c/W, which this model trains and has b/W, which this model does not train" in text
    assert restored == []
