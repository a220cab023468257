#!/usr/bin/env python3
"""The synchronous bound of this machine: N ranks doing the same fixed work per step, meeting after every
step, against the same ranks running free; run by ``bench_returnn_attention_speed.py --ranks``:

    mpirun -np N python benchmarks/sync_probe.py --step-ms 20 [--blocks 20] [--block-seconds 1.5]

Every rank repeats one single-threaded matrix product until a step holds ``--step-ms`` of work (rank 0
calibrates the count, all ranks use it: equal work on every rank and step). The run alternates blocks of
steps in two modes: ``sync``, where after each step the ranks allreduce one number, as a data-parallel
step reduces its gradients, and ``free``, where they meet only at the block's end (not timed). Rank 0
prints one line:

    sync-probe: 2 ranks, steps of 20.1 ms: sync 0.853 of free (20 blocks); slow steps 31%, 4%

The ratio: the sync blocks' work per second (N x their steps / their time, the slowest rank's) over the
free blocks' (the sum over the ranks of each rank's steps / its own time). Alternating blocks within one
run, rather than runs, compares the modes under the same drift of the machine's load. Slow steps: the
share of each rank's steps that took over 1.25 times its fastest tenth's median, where a rank was slowed
by something besides its work (other processes, or the host under a virtual machine).

Why: a synchronous step waits for the slowest rank, so its throughput reaches that of free-running
processes only where the cores run at a steady speed. Where they slow down for seconds at a time,
independently of each other, this probe's ratio, with no data and no model, is the most that any
synchronous training with steps of that length can reach over free-running processes on that machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # the work of a step is one thread's, as each rank's compute in the rows
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")  # what the engine sets (distributed/select.py)

import numpy as np  # noqa: E402  (after the thread variables, which numpy's BLAS reads when it loads)

PREFIX = "sync-probe:"
SIZE = 96  # a product of 96 x 96 matrices: well under a millisecond, so a step's work is fine-grained
SLOW_FACTOR = 1.25


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, default=20.0, help="the work of one step, in milliseconds")
    parser.add_argument("--blocks", type=int, default=20, help="blocks of steps, alternately sync and free")
    parser.add_argument("--block-seconds", type=float, default=1.5, help="about how long a block runs")
    args = parser.parse_args(argv)
    if args.step_ms <= 0 or args.blocks < 2 or args.block_seconds <= 0:
        parser.error("--step-ms and --block-seconds must be above 0, --blocks at least 2")
    return args


def products_per_step(step_ms: float) -> int:
    """How many products make ``step_ms`` of work on this core (the median of 30 timed batches)."""
    a = np.random.default_rng(0).standard_normal((SIZE, SIZE), dtype=np.float32)
    for _ in range(50):
        a @ a  # warm the caches
    timings = []
    for _ in range(30):
        start = time.perf_counter()
        for _ in range(20):
            a @ a
        timings.append((time.perf_counter() - start) / 20)
    return max(1, round(step_ms / 1000 / statistics.median(timings)))


def slow_share(step_seconds: list[float]) -> float:
    ordered = sorted(step_seconds)
    fast = statistics.median(ordered[:max(1, len(ordered) // 10)])
    return sum(s > SLOW_FACTOR * fast for s in step_seconds) / len(step_seconds)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    products = comm.bcast(products_per_step(args.step_ms) if comm.rank == 0 else None, root=0)
    steps = max(5, round(args.block_seconds * 1000 / args.step_ms))
    a = np.random.default_rng(comm.rank).standard_normal((SIZE, SIZE), dtype=np.float32) / SIZE
    signal, total = np.ones(1), np.zeros(1)
    step_seconds: list[float] = []
    seconds = {"sync": [], "free": []}  # per block: this rank's time
    for block in range(args.blocks):
        mode = "sync" if block % 2 == 0 else "free"
        comm.Barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step_start = time.perf_counter()
            for _ in range(products):
                a @ a
            step_seconds.append(time.perf_counter() - step_start)
            if mode == "sync":
                comm.Allreduce(signal, total)
        seconds[mode].append(time.perf_counter() - started)
    every_rank = comm.gather(seconds, root=0)
    shares = comm.gather(slow_share(step_seconds), root=0)
    if comm.rank == 0:
        sync_time = sum(max(rank["sync"][b] for rank in every_rank) for b in range(len(seconds["sync"])))
        sync_rate = comm.size * steps * len(seconds["sync"]) / sync_time
        free_rate = sum(steps * len(rank["free"]) / sum(rank["free"]) for rank in every_rank)
        print(f"{PREFIX} {comm.size} ranks, steps of {1000 * statistics.median(step_seconds):.1f} ms: "
              f"sync {sync_rate / free_rate:.3f} of free ({args.blocks} blocks); "
              f"slow steps {', '.join(f'{s:.0%}' for s in shares)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
