#!/usr/bin/env python3
"""Cost of a timed phase per span, timeline off and on, against the step time of bench_train's model.

    .venv/bin/python benchmarks/bench_timeline.py [--spans 20000] [--repeats 5] [--spans-per-step 6]
        [--step-ms 50]

Times ``with phases.span(...)`` blocks (with two size arguments, as the collectives record them) and
``phases.record(...)`` calls from explicit timestamps, as the engine makes them: with the timeline off
(the per-phase totals only) and on (writing a part file in a temporary directory), each the best of
``--repeats`` runs of ``--spans`` calls, minus the same loop with an empty body. Prints microseconds
per span and what ``--spans-per-step`` spans cost as a share of a ``--step-ms`` step (bench_train's
2-layer LSTM takes about 50-100 ms a step; its monitoring rows count the spans a step really has).
Then what timing an op inside a ``tf.function`` (``phases.timed_in_graph``, the horovod backend's
gradient allreduce) adds to a step, timeline off and on.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


from engine.report import phases, timeline


def loop_seconds(body: str, spans: int, repeats: int) -> float:
    """Best time of ``repeats`` runs of ``spans`` iterations of one of the bodies below."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        if body == "empty":
            for i in range(spans):
                pass
        elif body == "span":
            for i in range(spans):
                with phases.span("gradient allreduce", timeline.ALLREDUCE, bytes=4_000_000, tensors=12):
                    pass
        else:
            for i in range(spans):
                now = phases.now()
                phases.record("step signal", timeline.STEP_SIGNAL, now, now, bytes=8)
        best = min(best, time.perf_counter() - t0)
    return best


def span_costs(spans: int, repeats: int) -> tuple[list[tuple[str, str, float]], int]:
    """([(timeline off/on, span/record, microseconds per span)], part-file bytes written)."""
    base = loop_seconds("empty", spans, repeats)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for state in ("off", "on"):
            if state == "on":
                timeline.start(os.path.join(tmp, "timeline.json"), rank=0, size=1)
            for body in ("span", "record"):
                seconds = loop_seconds(body, spans, repeats) - base
                rows.append((state, body, 1e6 * seconds / spans))
            timeline.stop()
        size = os.path.getsize(timeline.part_path(os.path.join(tmp, "timeline.json"), 0))
    return rows, size


def in_graph_cost(calls: int, repeats: int, tmp: str) -> dict[str, float]:
    """Microseconds that ``phases.timed_in_graph`` (the horovod backend's gradient allreduce timing) adds
    to a ``tf.function`` call, timeline off and on: a small step with and without it, best of
    ``repeats`` runs of ``calls`` calls, the three kinds taking turns."""
    for name, value in (("TF_CPP_MIN_LOG_LEVEL", "2"), ("TF_NUM_INTRAOP_THREADS", "1"),
                        ("TF_NUM_INTEROP_THREADS", "1")):  # as the ranks of bench_train run
        os.environ.setdefault(name, value)
    import numpy as np
    import tensorflow as tf

    def double(ts):
        return [t * 2 for t in ts]

    def timed(x):
        return phases.timed_in_graph("op", timeline.ALLREDUCE, [x], double)[0]

    functions = {"plain": tf.function(lambda x: double([x])[0]), "off": tf.function(timed)}
    x = tf.constant(np.ones(1000, np.float32))
    functions["off"](x)  # traced with the timeline off
    timeline.start(os.path.join(tmp, "graph.json"))
    functions["on"] = tf.function(timed)
    functions["on"](x)  # traced with the timeline on: records every call
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(repeats):
        for name, function in functions.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                function(x)
            best[name] = min(best[name], time.perf_counter() - t0)
    timeline.stop()
    return {name: 1e6 * (best[name] - best["plain"]) / calls for name in ("off", "on")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spans-per-step", type=int, default=6)
    parser.add_argument("--step-ms", type=float, default=50.0)
    args = parser.parse_args()

    rows, size = span_costs(args.spans, args.repeats)
    per_step = f"{args.spans_per_step} spans / {args.step_ms:g} ms step"
    print(f"{'timeline':<9}{'call':<8}{'us/span':>9}{per_step:>28}")
    for state, body, micros in rows:
        share = 100.0 * micros * args.spans_per_step / (1000.0 * args.step_ms)
        print(f"{state:<9}{body:<8}{micros:>9.2f}{share:>27.4f}%")
    events = 2 * args.repeats * args.spans
    print(f"part file: {size / events:.0f} bytes per span ({events} spans)")
    with tempfile.TemporaryDirectory() as tmp:
        costs = in_graph_cost(2000, args.repeats, tmp)
    for state, micros in costs.items():
        print(f"an op timed inside a tf.function (horovod's allreduce), timeline {state}: {micros:.1f} us a "
              f"step, {100.0 * micros / (1000.0 * args.step_ms):.3f}% of a {args.step_ms:g} ms step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
