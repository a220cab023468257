"""What ``distributed_wire_format`` does to the result: dev score and error of a real config after N epochs,
2 ranks in grad mode, float32 / fp16 / bf16 on the wire, on the same seeds.

    python benchmarks/wire_quality.py [--epochs 5] [--seeds 1 2 3] [--backend mpi] [--op-speed]

The runs go one after another, each rank on one TensorFlow thread. The verdict: fp16's dev scores lie
within the seed-to-seed spread (min..max) of float32's. ``bench_multihost.py`` imports
``wire_format_quality`` and prints ``quality_lines``. ``--op-speed`` also measures the mpi backend's
fp16/bf16 sum (one addition over a 1 MiB segment of wire values, as its MPI op runs it).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Sequence

from timing import ROOT, child_env, rnn_command, run_stamped

CONFIG = os.path.join(ROOT, "configs", "12ax.py")
DEV_LINE = re.compile(r"^dev: score (\S+) error (\S+)", re.M)


@dataclass(frozen=True)
class QualityRun:
    wire: str  # "float32", "fp16" or "bf16"
    seed: int
    dev_score: float  # after the last epoch
    dev_error: float
    seconds: float  # the whole run, start-up included


def wire_format_quality(formats: Sequence[str | None] = (None, "fp16", "bf16"),
                        seeds: Sequence[int] = (1, 2, 3), epochs: int = 5, ranks: int = 2,
                        backend: str = "mpi", config: str = CONFIG, overrides: Sequence[str] = (),
                        progress: bool = True) -> list[QualityRun]:
    """One ``ranks``-rank grad-mode training of ``config`` per (format, seed), one after another;
    ``random_seed`` is the seed. A failed run ends the benchmark (``run_stamped``)."""
    env = child_env(threads=1)
    runs = []
    for seed in seeds:
        for wire in formats:
            with tempfile.TemporaryDirectory(prefix="wire-quality-") as tmp:
                args = ["++use_horovod", "1", "++horovod_reduce_type", "grad",
                        "++distributed_backend", backend, "++num_epochs", str(epochs),
                        "++random_seed", str(seed), "++model", f"{tmp}/model", "++tensorboard", "False",
                        *overrides]
                if wire is not None:
                    args += ["++distributed_wire_format", wire]
                start = time.perf_counter()
                output = run_stamped(rnn_command(config, ranks, args, env), env)
                seconds = time.perf_counter() - start
            scores = DEV_LINE.findall(output.text)
            if len(scores) != epochs:
                sys.exit(f"wire_quality: expected {epochs} dev lines, got {len(scores)}:\n"
                         f"{output.text[-3000:]}")
            run = QualityRun(wire or "float32", seed, float(scores[-1][0]), float(scores[-1][1]), seconds)
            runs.append(run)
            if progress:
                print(f"  {run.wire:<8} seed {seed}: dev score {run.dev_score:.4g} error {run.dev_error:.4g} "
                      f"({seconds:.0f} s)", file=sys.stderr, flush=True)
    return runs


def quality_lines(runs: Sequence[QualityRun], epochs: int | None = None) -> list[str]:
    """A table (one row per format: dev score and error per seed, and their range) and one verdict per
    compressed format: its dev scores within float32's min..max over the seeds."""
    lines = [f"wire format quality (2 ranks, grad mode{f', {epochs} epochs' if epochs else ''}; "
             "dev score / dev error after the last epoch, per seed):"]
    by_wire: dict[str, list[QualityRun]] = {}
    for run in runs:
        by_wire.setdefault(run.wire, []).append(run)
    for wire, group in by_wire.items():
        cells = "  ".join(f"s{r.seed} {r.dev_score:.4g}/{r.dev_error:.4g}" for r in group)
        scores = [r.dev_score for r in group]
        lines.append(f"  {wire:<8} {cells}   score {min(scores):.4g}..{max(scores):.4g}")
    reference = [r.dev_score for r in by_wire.get("float32", [])]
    for wire, group in by_wire.items():
        if wire == "float32" or not reference:
            continue
        low, high = min(reference), max(reference)
        inside = all(low <= r.dev_score <= high for r in group)
        mean = sum(r.dev_score for r in group) / len(group)
        lines.append(f"{'PASS' if inside else 'MISS'}: {wire} dev scores within float32's seed-to-seed "
                     f"spread {low:.4g}..{high:.4g} (mean {mean:.4g}, float32's "
                     f"{sum(reference) / len(reference):.4g})")
    return lines


def op_speed_lines(megabytes: float = 1.0, repeats: int = 20) -> list[str]:
    """MB/s of wire data through the mpi backend's fp16 and bf16 sums (one core, one 1 MiB segment)."""
    import numpy as np

    from engine.distributed.wire import numpy_sum

    count = int(megabytes * 2 ** 20) // 2
    rng = np.random.default_rng(0)
    lines = []
    for fmt, dtype in (("fp16", np.float16), ("bf16", None)):
        values = rng.standard_normal(2 * count).astype(np.float32)
        if dtype is not None:
            bits = values.astype(dtype).view(np.uint16)
        else:
            bits = (values.view(np.uint32) >> 16).astype(np.uint16)
        a, b = bits[:count].copy(), bits[count:].copy()
        add = numpy_sum(fmt)
        add(a, b, None)
        start = time.perf_counter()
        for _ in range(repeats):
            add(a, b, None)
        rate = count * 2 * repeats / (time.perf_counter() - start) / 1e6
        lines.append(f"  {fmt} sum: {rate:.0f} MB/s of wire data (links: 1 Gbit/s 125 MB/s, 100 Mbit/s 12.5)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--backend", default="mpi", choices=("mpi", "horovod"))
    parser.add_argument("--op-speed", action="store_true", help="also time the mpi backend's fp16/bf16 sum")
    args = parser.parse_args()
    if args.op_speed:
        print("mpi backend's wire sums:")
        print("\n".join(op_speed_lines()))
    runs = wire_format_quality(seeds=args.seeds, epochs=args.epochs, backend=args.backend)
    print("\n".join(quality_lines(runs, args.epochs)))


if __name__ == "__main__":
    main()
