#!/usr/bin/env python3
"""fp16's range guard (``engine/distributed/wire_guard.py``) on one core, without MPI: the work it adds to
each reduction, apart from the other ranks' noise.

    .venv/bin/python benchmarks/bench_wire_guard.py [--runs 9] [--models lstm,large]

For the gradient lists of ``bench_allreduce.py`` (a 2-layer LSTM of 0.9 MB, a 4x512 BLSTM of 103 MB)
one ``tf.function`` casts them to the wire and back as the ``mpi`` backend does (``wire.compress`` and
``wire.decompress``, fp16 as uint16 bits, nothing reduced in between); the guarded variant adds the
peaks, their exchange (a ``numpy_function`` that computes the factors of 2 ranks, with no MPI call: the
allreduce of a few floats itself is in ``bench_allreduce.py``'s rows), the scaling before the cast and
the unscaling after it. Rows are interleaved (the order reversed every other round); printed: ms per
reduction, median (min..max) over the runs, and the guarded variant's extra time and ratio per round.
One TensorFlow thread, as each of 2 ranks on 2 cores has.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

from bench_allreduce import MODELS  # noqa: E402  (the script's own directory is on sys.path)


def functions(shapes: list[tuple]) -> dict:
    import tensorflow as tf

    from engine.distributed.wire import compress, decompress
    from engine.distributed.wire_guard import RangeGuard

    rng = np.random.default_rng(0)
    tensors = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    guard = RangeGuard(2)

    def exchange(peaks: tf.Tensor) -> tf.Tensor:
        factors = tf.numpy_function(guard.factors, [peaks], tf.float32, stateful=True)
        factors.set_shape(peaks.shape)
        return factors

    def through_the_wire(guarded: bool):
        @tf.function
        def run() -> list:
            on_wire = compress(tensors, "fp16", "sum", as_bits=True, exchange=exchange if guarded else None)
            return decompress([tf.identity(t) for t in on_wire.tensors], on_wire)
        return run

    return {"unguarded": through_the_wire(False), "guarded": through_the_wire(True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--models", default="lstm,large", help="comma-separated: " + ", ".join(MODELS))
    args = parser.parse_args()
    print(f"bench_wire_guard: ms per reduction's cast to fp16 and back, median (min..max) of {args.runs} "
          f"interleaved runs; one TensorFlow thread; load {os.getloadavg()[0]:.1f}")
    for key in args.models.split(","):
        title, shapes, reps = MODELS[key]
        reps = max(1, reps // 2)
        rows = functions(shapes)
        times: dict[str, list[float]] = {name: [] for name in rows}
        for fn in rows.values():  # tracing, first allocations
            fn()
        for i in range(args.runs):
            for name in (list(rows) if i % 2 == 0 else list(rows)[::-1]):
                start = time.perf_counter()
                for _ in range(reps):
                    rows[name]()
                times[name].append((time.perf_counter() - start) / reps * 1e3)
        on, off = times["guarded"], times["unguarded"]
        extra = [a - b for a, b in zip(on, off)]
        ratios = [a / b for a, b in zip(on, off)]
        mb = sum(int(np.prod(s)) for s in shapes) * 4 / 1e6
        for name, values in times.items():
            print(f"  {title} ({mb:.1f} MB)  {name:9} {statistics.median(values):9.3f} ms "
                  f"({min(values):.3f}..{max(values):.3f})")
        print(f"  {title}: the guard adds {statistics.median(extra):.3f} ms "
              f"({min(extra):.3f}..{max(extra):.3f}) per reduction, ratio {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}..{max(ratios):.2f})")


if __name__ == "__main__":
    main()
