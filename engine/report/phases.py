"""Where a rank's time goes: every phase of the step loop is timed, always, and added up per category.

Phases are the timeline's categories (``engine.report.timeline``): waiting for data, the step's compute, the
collectives (gradient allreduce, parameter average, step signal), checkpoint writes and evaluation.
Each is timed where it is implemented (the batch prefetcher, the backends, the step protocol, the
strategy, the checkpoint writer), so that the epoch report, TensorBoard and the end-of-run summary
know the shares of the epoch spent in collectives and waiting for data whether or not the timeline is
on; when it is on, every phase is also a span on it.

Cost when the timeline is off: two clock reads and one locked addition, a microsecond or two a phase
(``benchmarks/bench_timeline.py``). An op timed inside a ``tf.function`` (``timed_in_graph``) costs two
timestamp ops and a variable update, plus one ``tf.numpy_function`` call when the timeline is on.
Thread-safe: the mpi backend's allreduce inside a ``tf.function`` runs in one of TensorFlow's threads.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from engine.report import timeline
from engine.report.timeline import ALLREDUCE, CATEGORIES, DATA_WAIT, PARAM_AVERAGE, STEP_SIGNAL

if TYPE_CHECKING:
    import tensorflow as tf

COLLECTIVES = (ALLREDUCE, PARAM_AVERAGE, STEP_SIGNAL)

_lock = threading.Lock()
_seconds = dict.fromkeys(CATEGORIES, 0.0)
_graph_seconds: dict[str, tf.Variable] = {}  # timed_in_graph's totals, by category

now = timeline.now  # the clock of ``record``'s start and end


def record(name: str, category: str, start: float, end: float, **args: Any) -> None:
    """Add the phase ``start``..``end`` (``now()`` readings) to its category's total, and to the
    timeline when it is on, with ``args`` (sizes, counts) as the span's arguments."""
    with _lock:
        _seconds[category] += end - start
    timeline.record(name, category, start, end, **args)


class _Span:
    __slots__ = ("name", "category", "args", "start")

    def __init__(self, name: str, category: str, args: dict[str, Any]) -> None:
        self.name, self.category, self.args = name, category, args

    def __enter__(self) -> "_Span":
        self.start = now()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.args["exception"] = exc_type.__name__
        record(self.name, self.category, self.start, now(), **self.args)


def span(name: str, category: str, **args: Any) -> _Span:
    """``with phases.span("checkpoint", CHECKPOINT, path=p):`` times the block as one phase; a block
    that raises gets an ``exception`` argument with the exception's type."""
    return _Span(name, category, args)


def timed_in_graph(name: str, category: str, inputs: list[tf.Tensor],
                   compute: Callable[[list[tf.Tensor]], list[tf.Tensor]], *, gate_inputs: bool = True,
                   **args: Any) -> list[tf.Tensor]:
    """``compute(inputs)`` inside a ``tf.function`` (an op that runs outside Python, such as Horovod's
    allreduce), timed as a phase without leaving the graph: ``tf.timestamp`` once every input is ready
    (``compute`` waits for it) and once every result is; the difference is added to a variable that
    ``totals`` reads. When the timeline is on or expected (``timeline.expect_recording``) while
    the function is traced, one ``tf.numpy_function``
    also records each span (``tf.function`` runs stateful ops even when nothing uses their output).
    ``gate_inputs`` False: ``compute`` may start on each input as soon as it exists (a reduction in
    buckets that overlaps the work producing the later inputs); the span is then the exposed part, from
    the last input to the last result."""
    import tensorflow as tf

    with _lock, tf.init_scope():  # one variable per category, made outside any graph
        seconds = _graph_seconds.get(category)
        if seconds is None:
            seconds = _graph_seconds[category] = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    with tf.control_dependencies(inputs):
        start = tf.timestamp()
    if gate_inputs:
        with tf.control_dependencies([start]):
            inputs = [tf.identity(t) for t in inputs]
    results = compute(inputs)
    with tf.control_dependencies(list(results) + [start]):
        end = tf.timestamp()
        seconds.assign_add(end - start)
        if timeline.recording_expected():
            def span(wall_start: np.ndarray, wall_end: np.ndarray) -> None:
                offset = time.time() - now()  # tf.timestamp is wall-clock time, the timeline's clock is now()
                timeline.record(name, category, float(wall_start) - offset, float(wall_end) - offset, **args)

            tf.numpy_function(span, [start, end], [], stateful=True, name="phase_span")
    return results


def totals() -> dict[str, float]:
    """Seconds per category since the process started; differences of two readings time an epoch."""
    with _lock:
        seconds = dict(_seconds)
        in_graph = list(_graph_seconds.items())
    for category, variable in in_graph:
        seconds[category] += float(variable.numpy())
    return seconds


def collective_and_wait_seconds(before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
    """(seconds in collectives, seconds waiting for data) between two ``totals()`` readings."""
    collective = sum(after[c] - before[c] for c in COLLECTIVES)
    return collective, after[DATA_WAIT] - before[DATA_WAIT]
