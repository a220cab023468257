"""engine.report.phases: every phase is added up per category whether or not the timeline is on, and is a span
on the timeline when it is; the epoch report takes its shares of collectives and data waits from it."""
from __future__ import annotations

import json
import threading

import pytest

from engine.report import phases, timeline
from engine.training.report import EpochReport

pytestmark = [pytest.mark.tf_latest, pytest.mark.usefixtures("timeline_stopped")]


def test_phases_add_up_with_the_timeline_off_and_on(tmp_path):
    before = phases.totals()
    phases.record("gradient allreduce", timeline.ALLREDUCE, 10.0, 10.25, bytes=64)
    with pytest.raises(KeyError):
        with phases.span("data wait", timeline.DATA_WAIT):
            raise KeyError("x")
    path = str(tmp_path / "t.json")
    timeline.start(path)
    phases.record("step signal", timeline.STEP_SIGNAL, 20.0, 20.5, bytes=16)
    with phases.span("checkpoint", timeline.CHECKPOINT, path="m.001") as span:
        span.args["epoch"] = 1
    timeline.stop()
    after = phases.totals()
    assert after[timeline.ALLREDUCE] - before[timeline.ALLREDUCE] == pytest.approx(0.25)
    assert after[timeline.STEP_SIGNAL] - before[timeline.STEP_SIGNAL] == pytest.approx(0.5)
    assert after[timeline.DATA_WAIT] > before[timeline.DATA_WAIT]
    collective, waiting = phases.collective_and_wait_seconds(before, after)
    assert collective == pytest.approx(0.75)
    assert waiting == after[timeline.DATA_WAIT] - before[timeline.DATA_WAIT]
    spans = [e for e in json.load(open(timeline.part_path(path, 0))) if e["ph"] == "X"]
    assert [(e["name"], e["args"]) for e in spans] == [  # only what came while the timeline was on
        ("step signal", {"bytes": 16}), ("checkpoint", {"path": "m.001", "epoch": 1})]
    assert spans[0]["dur"] == pytest.approx(500_000)


def test_phases_from_many_threads_add_up():
    before = phases.totals()[timeline.PARAM_AVERAGE]

    def record_many() -> None:
        for _ in range(5000):
            phases.record("parameter average", timeline.PARAM_AVERAGE, 0.0, 0.001)

    threads = [threading.Thread(target=record_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert phases.totals()[timeline.PARAM_AVERAGE] - before == pytest.approx(20.0)


def test_the_epoch_report_takes_its_shares_from_the_phases():
    report = EpochReport("train epoch 1")
    phases.record("step signal", timeline.STEP_SIGNAL, 0.0, 0.5)
    phases.record("gradient allreduce", timeline.ALLREDUCE, 0.0, 1.0)
    phases.record("data wait", timeline.DATA_WAIT, 0.0, 0.25)
    phases.record("train step", timeline.STEP, 0.0, 3.0)  # the step's compute: neither
    report.finish()
    assert report.collective_seconds == pytest.approx(1.5) and report.data_wait_seconds == pytest.approx(0.25)
    frozen = report.elapsed
    assert report.elapsed == frozen and report.percent(frozen / 2) == pytest.approx(50.0)


def test_an_op_inside_a_tf_function_timed_by_markers(tmp_path):
    import time

    import numpy as np
    import tensorflow as tf

    def slow_double(x: np.ndarray) -> np.ndarray:
        time.sleep(0.05)
        return (x * 2).astype(np.float32)

    @tf.function
    def step(x):
        y = x + 1  # the marker waits for its inputs
        (z,) = phases.timed_in_graph("slow op", timeline.ALLREDUCE, [y], lambda ts: [
            tf.numpy_function(slow_double, ts, tf.float32, stateful=True)], bytes=4, tensors=1)
        return z - 1

    path = str(tmp_path / "t.json")
    timeline.start(path)
    before = phases.totals()[timeline.ALLREDUCE]
    assert [float(step(tf.constant(1.0))) for _ in range(3)] == [3.0, 3.0, 3.0]
    timeline.stop()
    spans = [e for e in json.load(open(timeline.part_path(path, 0))) if e["ph"] == "X"]
    assert [(e["name"], e["args"]) for e in spans] == [("slow op", {"bytes": 4, "tensors": 1})] * 3
    assert all(50_000 <= e["dur"] < 5_000_000 for e in spans)
    assert phases.totals()[timeline.ALLREDUCE] - before == pytest.approx(sum(e["dur"] for e in spans) / 1e6)


def test_an_op_timed_in_graph_adds_up_without_the_timeline():
    import tensorflow as tf

    @tf.function
    def step(x):
        return phases.timed_in_graph("op", timeline.PARAM_AVERAGE, [x], lambda ts: [ts[0] * 2])[0]

    before = phases.totals()[timeline.PARAM_AVERAGE]
    for _ in range(5):
        assert float(step(tf.constant(1.5))) == 3.0
    assert 0 < phases.totals()[timeline.PARAM_AVERAGE] - before < 5.0
