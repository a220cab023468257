#!/usr/bin/env python3
"""Cost of the step timeline per span, off and on, against the step time of bench_train's model.

    .venv/bin/python benchmarks/bench_timeline.py [--spans 20000] [--repeats 5] [--spans-per-step 6]
        [--step-ms 50]

Times ``with timeline.span(...)`` blocks (with two size arguments, as the collectives record them) and
``timeline.record(...)`` calls from explicit timestamps, with the timeline off and on (writing a part
file in a temporary directory), each the best of ``--repeats`` runs of ``--spans`` calls, minus the
same loop with an empty body. Prints microseconds per span and what ``--spans-per-step`` spans cost
as a share of a ``--step-ms`` step (bench_train's 2-layer LSTM takes about 50-100 ms a step).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


from engine import timeline


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
                with timeline.span("gradient allreduce", timeline.ALLREDUCE, bytes=4_000_000, tensors=12):
                    pass
        else:
            for i in range(spans):
                now = timeline.now()
                timeline.record("step signal", timeline.STEP_SIGNAL, now, now, bytes=8)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spans-per-step", type=int, default=6)
    parser.add_argument("--step-ms", type=float, default=50.0)
    args = parser.parse_args()

    base = loop_seconds("empty", args.spans, args.repeats)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for state in ("off", "on"):
            if state == "on":
                timeline.start(os.path.join(tmp, "timeline.json"), rank=0, size=1)
            for body in ("span", "record"):
                seconds = loop_seconds(body, args.spans, args.repeats) - base
                rows.append((state, body, 1e6 * seconds / args.spans))
            timeline.stop()
        size = os.path.getsize(timeline.part_path(os.path.join(tmp, "timeline.json"), 0))
    per_step = f"{args.spans_per_step} spans / {args.step_ms:g} ms step"
    print(f"{'timeline':<9}{'call':<8}{'us/span':>9}{per_step:>28}")
    for state, body, micros in rows:
        share = 100.0 * micros * args.spans_per_step / (1000.0 * args.step_ms)
        print(f"{state:<9}{body:<8}{micros:>9.2f}{share:>27.4f}%")
    events = 2 * args.repeats * args.spans
    print(f"part file: {size / events:.0f} bytes per span ({events} spans)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
