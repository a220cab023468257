#!/usr/bin/env python3
"""What the open-time value checks of ``HDFDataset`` cost: seconds to open a corpus with the structural
checks only, with the class-id check (always on), and with ``check_finite``.

    .venv/bin/python benchmarks/bench_open_checks.py [--dir DIR] [--mb 100] [--repeat 5]

Uses ``bench_data.py``'s corpus (40 float32 features and a sparse target per frame) in both layouts.
The files are in the page cache (they were just written), so this measures the checks' CPU and
memcpy cost; on a cold cache the class-id check adds one read of the sparse streams (4 of every 164
bytes here), ``check_finite`` one read of the whole corpus.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


from bench_data import make_corpus

from engine.datasets import HDFDataset
from engine.datasets.hdf_values import StreamValues


def open_seconds(path: str, variant: str) -> float:
    real_check = StreamValues.check_class_ids
    if variant == "structure only":
        StreamValues.check_class_ids = lambda self, dim, dim_source: None
    try:
        start = time.perf_counter()
        dataset = HDFDataset(path, check_finite=variant == "+ check_finite")
        seconds = time.perf_counter() - start
    finally:
        StreamValues.check_class_ids = real_check
    dataset.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to write the corpus [a temp dir]")
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="bench_open_checks.")
    chunked, contiguous = make_corpus(folder, args.mb)
    variants = ["structure only", "class ids (default)", "+ check_finite"]
    for path in (chunked, contiguous):
        times = {v: [] for v in variants}
        for _ in range(args.repeat):
            for variant in variants:
                times[variant].append(open_seconds(path, variant))
        base = statistics.median(times["structure only"])
        size_mb = os.path.getsize(path) / 1e6
        print(f"{os.path.basename(path)} ({size_mb:.0f} MB):")
        for variant in variants:
            median = statistics.median(times[variant])
            print(f"  {variant:<20} {median * 1e3:8.1f} ms  {median / base:5.2f}x structure only")


if __name__ == "__main__":
    main()
