#!/usr/bin/env python3
"""The mpi backend's fp16 and bf16 sums (``engine/distributed/wire.py``) against other ways to compute
the same bits, on one core, in interleaved runs.

    .venv/bin/python benchmarks/bench_wire_sum.py [--mb 1,16] [--runs 7] [--repeats 10]

Each variant computes ``b += a`` over uint16 bit patterns of fp16 (or bf16) values, as the MPI op and
the ring do, on buffers of ``--mb`` MiB of wire data per operand (1 MiB: a fused segment of
``MPI_Allreduce``, in cache; 16 MiB: a ring chunk of a 25 MB bucket, from memory). A run times
``--repeats`` sums; every variant runs once per round, the order reversed every other round. Printed:
MB/s of wire data (both operands' bytes per second), median (min..max) over the runs, and each
variant's ratio to the engine's sum (per round, median and range). Every variant is checked bit for bit
against the engine's sum first (and against numpy's float16 add for fp16).

fp16 variants:
  engine         wire.fp16_sum_into: numpy's float16 add (each element widened to float32, added,
                 rounded once to float16)
  widened        the same in numpy steps: both operands cast to float32, added in float32, rounded back
                 (bit-identical: float32 holds the exact sum of two fp16 values, or rounds it far below
                 fp16's last bit), in blocks of 64 Ki elements so that the float32 scratch stays in cache
  tensorflow     TensorFlow's float16 add on the CPU (Eigen), one op per call (information: not used by
                 the engine, see docs/performance.md)
bf16 variants:
  engine         wire.bf16_sum_into (widened by a shift, added in float32, rounded with integer ops), in
                 blocks of wire.SUM_BLOCK elements
  whole array    the same over the whole array at once (the engine's sum before the blocks)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from engine.distributed.wire import (bf16_bits_to_float32, bf16_sum_into, float32_to_bf16_bits,  # noqa: E402
                                     fp16_sum_into)

BLOCK = 1 << 16


def widened_fp16_sum_into(a: np.ndarray, b: np.ndarray) -> None:
    """b += a over fp16 bits: cast to float32, add, round back, block by block."""
    x, y = a.view(np.float16), b.view(np.float16)
    left, right = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32)
    for start in range(0, x.size, BLOCK):
        n = min(BLOCK, x.size - start)
        np.copyto(left[:n], x[start:start + n])
        np.copyto(right[:n], y[start:start + n])
        np.add(left[:n], right[:n], out=left[:n])
        np.copyto(y[start:start + n], left[:n], casting="same_kind")


def whole_bf16_sum_into(a: np.ndarray, b: np.ndarray) -> None:
    """The engine's bf16 sum before it went in blocks: the whole array at once."""
    total = bf16_bits_to_float32(a)
    total += bf16_bits_to_float32(b)
    float32_to_bf16_bits(total, out=b)


def tensorflow_fp16_sum_into(a: np.ndarray, b: np.ndarray) -> None:
    import tensorflow as tf

    np.copyto(b.view(np.float16), tf.add(a.view(np.float16), b.view(np.float16)).numpy())


VARIANTS: dict[str, dict[str, Callable[[np.ndarray, np.ndarray], None]]] = {
    "fp16": {"engine": fp16_sum_into, "widened": widened_fp16_sum_into,
             "tensorflow": tensorflow_fp16_sum_into},
    "bf16": {"engine": bf16_sum_into, "whole array": whole_bf16_sum_into},
}


def operands(fmt: str, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays of ``count`` wire values (uint16 bits) of gradient-like magnitudes."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(2 * count) * 1e-2).astype(np.float32)
    if fmt == "fp16":
        bits = values.astype(np.float16).view(np.uint16)
    else:
        bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    return bits[:count].copy(), bits[count:].copy()


def check(fmt: str, count: int) -> None:
    """Every variant gives the engine's bits (and fp16's those of numpy's float16 add)."""
    a, b = operands(fmt, count, seed=1)
    want = b.copy()
    VARIANTS[fmt]["engine"](a, want)
    if fmt == "fp16":
        assert np.array_equal(want, (a.view(np.float16) + b.view(np.float16)).view(np.uint16))
    for name, add in VARIANTS[fmt].items():
        got = b.copy()
        with np.errstate(over="ignore", invalid="ignore"):
            add(a, got)
        if not np.array_equal(got, want):
            sys.exit(f"bench_wire_sum: {fmt} {name} differs from the engine's sum")


def measure(fmt: str, megabytes: float, runs: int, repeats: int) -> dict[str, list[float]]:
    count = int(megabytes * 2**20) // 2
    a, b0 = operands(fmt, count)
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS[fmt]}
    names = list(VARIANTS[fmt])
    for name in names:  # warm-up (imports, page faults)
        VARIANTS[fmt][name](a, b0.copy())
    for i in range(runs):
        for name in (names if i % 2 == 0 else names[::-1]):
            b = b0.copy()
            start = time.perf_counter()
            with np.errstate(over="ignore", invalid="ignore"):
                for _ in range(repeats):
                    VARIANTS[fmt][name](a, b)
            rates[name].append(2 * a.nbytes * repeats / (time.perf_counter() - start) / 1e6)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", default="1,16", help="MiB of wire data per operand, comma-separated")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--formats", default="fp16,bf16")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"bench_wire_sum: MB/s of wire data (both operands), median (min..max) of {args.runs} interleaved "
          f"runs of {args.repeats} sums; ratio: to the engine's sum, per round; "
          f"{len(os.sched_getaffinity(0))} cores, load {os.getloadavg()[0]:.1f}")
    for fmt in args.formats.split(","):
        check(fmt, 3 * BLOCK + 17)
        for mb in (float(m) for m in args.mb.split(",")):
            rates = measure(fmt, mb, args.runs, args.repeats)
            base = rates["engine"]
            for name, values in rates.items():
                ratios = [v / e for v, e in zip(values, base)]
                print(f"  {fmt} {mb:g} MiB {name:12} {statistics.median(values):7.0f} ({min(values):.0f}.."
                      f"{max(values):.0f}) MB/s   ratio {statistics.median(ratios):.2f}x "
                      f"({min(ratios):.2f}..{max(ratios):.2f})")


if __name__ == "__main__":
    main()
