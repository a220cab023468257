"""Watching real training runs of ``rnn.py``: TensorBoard curves read back with TensorBoard's own reader
(also after a kill and a resume), the step timeline of 2-rank runs on both backends, the progress bar
on a pseudo-terminal and plain progress lines into a pipe, and the end-of-run summary."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from engine.report import timeline
from engine.training.update.lr_control import parse_history
from helpers import ROOT, child_env, run_mpi, run_on_terminal, run_rnn, screen

RNN = str(ROOT / "rnn.py")
# 40 sequences of 12 frames, 10 to a batch: 4 steps an epoch in one process
CONFIG = """
train = {"class": "DummyDataset", "input_dim": 4, "output_dim": 3, "num_seqs": 40, "seq_len": 12,
         "fixed_random_seed": 1}
dev = {"class": "DummyDataset", "input_dim": 4, "output_dim": 3, "num_seqs": 20, "seq_len": 12,
       "fixed_random_seed": 1}
network = {"lstm": {"class": "rec", "unit": "LSTMBlock", "n_out": 8},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
batch_size = 120
learning_rate = 0.01
num_epochs = %(num_epochs)d
model = %(model)r
learning_rate_file = %(lr_file)r
"""
STEP_TAGS = {"train/score", "train/error", "train/learning_rate", "train/frames_per_sec"}
EPOCH_TAGS = {"epoch/train_score", "epoch/train_error", "epoch/dev_score", "epoch/dev_error",
              "epoch/learning_rate", "epoch/frames_per_sec", "epoch/computing_percent",
              "epoch/collective_percent", "epoch/data_wait_percent"}


def write_config(tmp_path, num_epochs: int = 1, extra: str = "") -> str:
    path = tmp_path / "run.py"
    path.write_text(CONFIG % {"num_epochs": num_epochs, "model": str(tmp_path / "net"),
                              "lr_file": str(tmp_path / "lr.txt")} + extra)
    return str(path)


def read_curves(log_dir) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] in file order, every event kept: a duplicate step would show."""
    acc = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.TENSORS: 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def steps(curves, tag) -> list[int]:
    return [step for step, _ in curves[tag]]


# A real run that dies (SIGKILL, no clean-up) after global step N.
KILLED_AT_STEP = """
import os, signal, sys
from engine.training import monitor

step_done = monitor.RunMonitor.step_done

def step_done_then_die(self, scores):
    step_done(self, scores)
    if self.global_step == {step}:
        os.kill(os.getpid(), signal.SIGKILL)

monitor.RunMonitor.step_done = step_done_then_die
from engine.main import main
sys.exit(main({args!r}))
"""


@pytest.mark.tf_latest
@pytest.mark.slow  # several training runs (kill or stop, then resume)
def test_tensorboard_curves_continue_after_a_kill_and_a_resume(tmp_path):
    cfg = write_config(tmp_path, num_epochs=4, extra="save_interval = 2\ntensorboard_step_interval = 1\n")
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_STEP.format(step=14, args=[cfg])],
                            capture_output=True, text=True, env=child_env(), timeout=180)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert "saved model to" in killed.stdout and not os.path.exists(tmp_path / "net.003")
    curves = read_curves(tmp_path / "tensorboard")
    assert set(curves) == STEP_TAGS | EPOCH_TAGS
    assert steps(curves, "epoch/dev_score") == [1, 2, 3]  # epoch 3 is on disk, its checkpoint is not

    resumed = run_rnn([cfg], timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after epoch 2" in resumed.stdout
    curves = read_curves(tmp_path / "tensorboard")
    assert set(curves) == STEP_TAGS | EPOCH_TAGS
    for tag in STEP_TAGS:  # every step once, in order, although the killed run wrote steps 9-14 too
        assert steps(curves, tag) == list(range(1, 17)), tag
    for tag in EPOCH_TAGS:
        assert steps(curves, tag) == [1, 2, 3, 4], tag
    history = parse_history((tmp_path / "lr.txt").read_text(), "lr.txt")
    for epoch in (1, 2, 3, 4):  # the curves hold the scores of the learning-rate file: epochs 3, 4 resumed
        assert dict(curves["epoch/train_score"])[epoch] == pytest.approx(history[epoch].scores["train_score"])
        assert dict(curves["epoch/dev_error"])[epoch] == pytest.approx(history[epoch].scores["dev_error"])
    assert all(value == pytest.approx(0.01) for _, value in curves["train/learning_rate"])
    assert all(value > 0 for _, value in curves["train/frames_per_sec"] + curves["epoch/frames_per_sec"])
    assert all(0 < value <= 100 for _, value in curves["epoch/computing_percent"])

    best_epoch = min(history, key=lambda e: history[e].scores["dev_score"])
    summary = resumed.stdout[resumed.stdout.index("Run summary:"):]
    assert summary.startswith("Run summary: 2 epochs in this run (epochs 3-4), ")
    assert re.search(rf"^  best dev_score: [\d.]+ in epoch {best_epoch} \(dev_error [\d.]+\)$", summary, re.M)
    assert f"  model: {tmp_path / 'net.004'}\n" in summary
    assert f"  TensorBoard: {tmp_path / 'tensorboard'} " in summary and "timeline:" not in summary


def spans_by_rank(events: list[dict]) -> dict[int, dict[str, list[dict]]]:
    by_rank: dict[int, dict[str, list[dict]]] = {}
    for event in events:
        if event["ph"] == "X":
            by_rank.setdefault(event["pid"], {}).setdefault(event["cat"], []).append(event)
    return by_rank


@pytest.mark.version_independent  # the timeline files of two processes
@pytest.mark.mpi
@pytest.mark.parametrize("backend, reduce_type", [
    pytest.param("mpi", "grad", marks=pytest.mark.tf_latest),
    pytest.param("mpi", "param", marks=pytest.mark.tf_latest),
    ("horovod", "grad"),
    ("horovod", "param"),
])
def test_timeline_of_a_two_rank_run(tmp_path, backend, reduce_type):
    path = tmp_path / "timeline.json"
    args = [RNN, write_config(tmp_path), "++use_horovod", "1", "++distributed_backend", backend,
            "++horovod_reduce_type", reduce_type]
    # the config key, or the environment variable
    env = {timeline.ENV_VAR: str(path)} if reduce_type == "param" else None
    if env is None:
        args += ["++timeline_file", str(path)]
    r = run_mpi(2, args, timeout=240, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(tmp_path)) == ["lr.txt", "net.001", "run.py", "tensorboard", "timeline.json"]
    events = json.loads(path.read_text())  # strict JSON: the Chrome trace's JSON Array Format
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == [0, 1] and names[1].startswith("rank 1 of 2 (")
    collective = timeline.ALLREDUCE if reduce_type == "grad" else timeline.PARAM_AVERAGE
    by_rank = spans_by_rank(events)
    kinds = {timeline.DATA_WAIT, timeline.STEP, timeline.STEP_SIGNAL, timeline.EVAL, collective}
    for rank in (0, 1):
        assert kinds <= set(by_rank[rank]), (rank, sorted(by_rank[rank]))
        assert len(by_rank[rank][timeline.STEP]) == 2  # 4 batches, 2 per rank
        sizes = {(e["args"]["bytes"], e["args"]["tensors"]) for e in by_rank[rank][collective]}
        assert len(sizes) == 1 and min(sizes)[0] > 0, sizes
        assert all(e["dur"] >= 0 and e["ts"] > 0 for spans in by_rank[rank].values() for e in spans)
    assert timeline.CHECKPOINT in by_rank[0]  # rank 0 saves
    (save,) = by_rank[0][timeline.CHECKPOINT]
    assert save["args"]["path"] == str(tmp_path / "net.001")
    assert f"timeline: {path} (open it in" in r.stdout
    assert "%|" not in r.stdout and "\r" not in r.stdout  # mpirun's output is a pipe: no progress bar


@pytest.mark.tf_latest
def test_progress_bar_on_a_terminal(tmp_path):
    cfg = write_config(tmp_path, extra="log_verbosity = 5\n")  # per-step lines while the bar is shown
    returncode, raw, stderr = run_on_terminal([sys.executable, RNN, cfg], timeout=180)
    assert returncode == 0, raw + stderr
    assert re.search(r"train epoch 1:  *\d+%\|.*\| [1-4]/4 \[", raw), raw
    rows = screen(raw)
    for step in (1, 2, 3, 4):  # lines printed meanwhile have rows of their own, no bar through them
        assert any(re.fullmatch(rf"train epoch 1, step {step}, score [\d.]+, .*complete [\d.]+%", row)
                   for row in rows), rows
    assert not any("%|" in row for row in rows)  # the bar went when the epoch ended
    assert rows[-1].startswith("  TensorBoard: ")  # the summary's last line


@pytest.mark.tf_latest
def test_progress_lines_into_a_pipe(tmp_path):
    r = run_rnn([write_config(tmp_path), "++progress_interval", "1e-9"])
    assert r.returncode == 0, r.stderr
    lines = re.findall(r"^train epoch 1: step \d.*$", r.stdout, re.M)
    assert [line.split(",")[0] for line in lines] == [
        "train epoch 1: step 1 of 4 (25.0%)", "train epoch 1: step 2 of 4 (50.0%)",
        "train epoch 1: step 3 of 4 (75.0%)", "train epoch 1: step 4 of 4 (100.0%)"]
    assert all(re.search(r", \d+ frames/s, score [\d.]+$", line) for line in lines), lines
    assert "\r" not in r.stdout and "%|" not in r.stdout
