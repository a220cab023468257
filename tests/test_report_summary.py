"""The end-of-run summary: epochs, time, frames/s, time shares, best dev score, where the files are."""
from __future__ import annotations

import pytest

from engine.report.summary import EpochRecord, summary_text

pytestmark = pytest.mark.tf_latest


def record(epoch: int, dev: float | None, seconds: float = 100.0) -> EpochRecord:
    scores = {"train_score": 2.0 / epoch}
    if dev is not None:
        scores.update(dev_score=dev, dev_error=dev / 10)
    return EpochRecord(epoch, seconds=seconds, frames=1000.0 * epoch * seconds, compute_seconds=0.9 * seconds,
                       collective_seconds=0.05 * seconds, data_wait_seconds=0.01 * seconds, scores=scores)


def test_summary_of_a_run():
    text = summary_text([record(2, 1.5), record(1, 1.8), record(3, 1.6, seconds=200.0)], total_seconds=425.0,
                        model="out/model.003", tensorboard_dir="out/tensorboard", timeline_file="out/t.json")
    lines = text.splitlines()
    assert lines[0] == "Run summary: 3 epochs in this run (epochs 1-3), 0:07:05 in all."
    assert lines[1].split() == ["epoch", "time", "frames/s", "computing", "collectives", "data", "wait",
                                "train_score", "dev_score"]
    assert lines[2].split() == ["1", "0:01:40", "1000.0", "90.0%", "5.0%", "1.0%", "2.0000", "1.8000"]
    assert lines[4].split() == ["3", "0:03:20", "3000.0", "90.0%", "5.0%", "1.0%", "0.6667", "1.6000"]
    assert lines[5].split() == ["all", "0:06:40", "2000.0", "90.0%", "5.0%", "1.0%"]
    assert lines[6] == "  best dev_score: 1.5000 in epoch 2 (dev_error 0.1500)"
    assert lines[7:] == ["  model: out/model.003",
                         "  TensorBoard: out/tensorboard (tensorboard --logdir out/tensorboard)",
                         "  timeline: out/t.json (open it in https://ui.perfetto.dev or chrome://tracing)"]


def test_resumed_run_best_from_the_whole_history_and_long_runs_shorten_the_table():
    records = [record(e, 1.0 + e / 100) for e in range(11, 36)]
    history = {e: {"dev_score": 5.0 - e / 10} for e in range(1, 11)} | {r.epoch: r.scores for r in records}
    text = summary_text(records, total_seconds=3600.0, history=history, max_rows=5)
    lines = text.splitlines()
    assert lines[0] == "Run summary: 25 epochs in this run (epochs 11-35), 1:00:00 in all."
    assert lines[2] == "  (20 earlier epochs not shown)"
    assert [line.split()[0] for line in lines[3:9]] == ["31", "32", "33", "34", "35", "all"]
    assert lines[9] == "  best dev_score: 1.1100 in epoch 11 (dev_error 0.1110)"
    history[4] = {"dev_score": 0.5}  # an epoch before the resume was better
    resumed = summary_text(records, total_seconds=1.0, history=history)
    assert "  best dev_score: 0.5000 in epoch 4" in resumed.splitlines()
    assert "model:" not in text and "TensorBoard" not in text and "timeline" not in text


def test_without_dev_data_or_epochs():
    text = summary_text([record(1, None)], total_seconds=100.0)
    assert text.splitlines()[0] == "Run summary: 1 epoch in this run (epoch 1), 0:01:40 in all."
    assert "  best dev_score: none (no epoch has one)" in text.splitlines()
    assert summary_text([], total_seconds=5.0).splitlines() == [
        "Run summary: no epoch trained in this run, 0:00:05 in all.",
        "  best dev_score: none (no epoch has one)"]
    by_error = summary_text([record(1, 1.0)], total_seconds=1.0, best_key="dev_error")
    assert "  best dev_error: 0.1000 in epoch 1" in by_error.splitlines()


def test_epochs_after_the_runs_last_one_are_not_its_own():
    """A learning-rate file that another run took to epoch 50 (seen: a 2-epoch run reporting `best
    dev_score: 0.0000 in epoch 50`): only the history up to this run's last epoch counts."""
    records = [record(1, 1.8), record(2, 1.5)]
    history = {r.epoch: r.scores for r in records} | {50: {"dev_score": 0.0, "dev_error": 0.0}}
    lines = summary_text(records, total_seconds=200.0, history=history).splitlines()
    assert "  best dev_score: 1.5000 in epoch 2 (dev_error 0.1500)" in lines
