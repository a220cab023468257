#!/usr/bin/env python3
"""Allreduce of realistic gradient lists with 2 ranks: the engine's backends against raw mpi4py.

    .venv/bin/python benchmarks/bench_allreduce.py            # launches `mpirun -np 2` itself
    .venv-latest/bin/python benchmarks/bench_allreduce.py --tf --no-horovod --models lstm,large

Gradient lists: the variable shapes of a 2-layer LSTM with 128 units (input 40, 50 classes; 0.9 MB) and
of a 4-layer BLSTM with 512 units (input 40, 4501 classes; 25.8 M parameters, 103 MB). Methods, timed
in interleaved rounds (the machine is noisy: read the ratios, not the absolute times):

  raw          mpi4py Allreduce(IN_PLACE) of one preallocated float32 buffer of the same byte count
  raw-seg      the same buffer, reduced in the engine's segments (what segmenting alone gives)
  mpi          engine mpi backend, comm.allreduce(list of numpy arrays)  <- the fused path
  mpi-graph    engine mpi backend, comm.allreduce_tensors inside a tf.function
  mpi-eager    engine mpi backend from tensors: .numpy() -> comm.allreduce -> tf.convert_to_tensor
  hvd-graph    engine horovod backend, comm.allreduce_tensors inside a tf.function (grouped allreduce)
  hvd          engine horovod backend, comm.allreduce(list of numpy arrays)
  tf           engine tf backend (--tf), comm.allreduce(list of numpy arrays): TensorFlow's collectives, eager
  tf-graph     engine tf backend (--tf), comm.allreduce_tensors inside a tf.function

With ``--tf`` the tf backend's collective runtime starts before TensorFlow's first operation, so every row
of that run is timed in a process whose TensorFlow runs a gRPC server (as a tf-backend job's does); the
ratios tf/mpi and tf-graph/mpi-graph are taken per round (the rows ran side by side).

and with ``distributed_wire_format = "fp16"``, inside a tf.function, each with fp16's range guard
(engine/distributed/wire_guard.py: the peaks' exchange, the scaling before the cast and after it) and
without it (``-off``: the guard turned off, as only benchmarks do), side by side in every round:

  mpi-fp16     mpi backend, allreduce_tensors: one fused reduction
  mpi-bkt16    mpi backend, allreduce_tensor_buckets in 25 MB buckets (training's default path)
  hvd-fp16     horovod backend, allreduce_tensors
  hvd-bkt16    horovod backend, allreduce_tensor_buckets in 25 MB buckets

and the guard's exchange alone, the MAX of one float per tensor: ``raw-peaks`` (mpi4py's Allreduce) and
``mpi-peaks`` (the mpi backend's allreduce_tensors in a tf.function, as a reduction's exchange runs).

Phase 1 runs before Horovod is initialised (as a job on the mpi backend runs); phase 2 after
``hvd.init`` (as a job on the horovod backend runs: Horovod's background thread polls all the time).
Targets (issue 4): mpi >= 0.9x raw, and at least as fast as Horovod. The guard's cost is reported as
the ratio of guarded to unguarded time, per round (issue 28; no target).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from timing import Side, compare  # the script's own directory is on sys.path

ROOT = Path(__file__).resolve().parent.parent


def lstm_shapes(n_in: int, units: int, layers: int, n_out: int, directions: int = 1) -> list[tuple]:
    """Keras LSTM variables (kernel, recurrent kernel, bias) per layer and direction, then the softmax."""
    shapes, dim = [], n_in
    for _ in range(layers):
        shapes += [(dim, 4 * units), (units, 4 * units), (4 * units,)] * directions
        dim = units * directions
    return shapes + [(dim, n_out), (n_out,)]


BUCKET_MB = 25.0  # distributed_bucket_mb's default
GUARDED = ("mpi-fp16", "mpi-bkt16", "hvd-fp16", "hvd-bkt16")  # each also measured with "-off"

# name: (title, shapes, reductions per timed block)
MODELS = {
    "lstm": ("2-layer LSTM 128 (in 40, out 50)", lstm_shapes(40, 128, 2, 50), 200),
    "large": ("4-layer BLSTM 512 (in 40, out 4501)", lstm_shapes(40, 512, 4, 4501, directions=2), 6),
}


def launch(args: argparse.Namespace) -> int:
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [str(Path(sys.executable).parent / "mpirun"), "--oversubscribe", "--bind-to", "none",
           "--map-by", "slot", "-np", str(args.np), sys.executable, __file__, "--worker",
           "--rounds", str(args.rounds), "--models", args.models]
    cmd += ["--no-horovod"] if args.no_horovod else []
    cmd += ["--fp16-only"] if args.fp16_only else []
    cmd += ["--tf"] if args.tf else []
    return subprocess.call(cmd, env=env, cwd=ROOT)


class Bench:
    """Builds each model's methods and times them in interleaved rounds on all ranks."""

    def __init__(self, args: argparse.Namespace) -> None:
        from mpi4py import MPI  # first: MPI is initialised by mpi4py, then shared with Horovod

        import numpy as np
        import tensorflow as tf

        from engine.distributed import create_communicator

        self.MPI, self.np, self.tf, self.args = MPI, np, tf, args
        # the tf backend starts TensorFlow's collective runtime: before TensorFlow's first operation
        self.tf_comm = create_communicator("tf") if args.tf else None
        self.world = MPI.COMM_WORLD
        # One communicator per engine path, as in a job that uses only that path: results handed to
        # TensorFlow keep their fusion buffer until TensorFlow's deferred release, so paths sharing one
        # communicator would steal each other's pooled buffers in this interleaved timing.
        guarded = tuple(f"{path}{off}" for path in GUARDED[:2] for off in ("", "-off"))
        paths = ("mpi", "mpi-graph", "mpi-eager", "mpi-peaks") + guarded
        self.comms = {path: create_communicator("mpi") for path in paths}
        self.data = {}
        for key in args.models.split(","):
            title, shapes, reps = MODELS[key]
            rng = np.random.default_rng(self.world.Get_rank())
            arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
            self.data[key] = (title, reps, arrays, [tf.constant(a) for a in arrays])

    def mpi_methods(self, arrays: list, tensors: list) -> dict[str, Callable]:
        from engine.distributed.fusion import SEGMENT_BYTES

        MPI, tf, world, comms = self.MPI, self.tf, self.world, self.comms
        count = sum(a.size for a in arrays)
        raw, seg = self.np.ones(count, self.np.float32), SEGMENT_BYTES // 4

        def raw_segmented() -> None:
            for start in range(0, count, seg):
                world.Allreduce(MPI.IN_PLACE, raw[start:start + seg])

        def mpi_eager() -> None:
            [tf.convert_to_tensor(r) for r in comms["mpi-eager"].allreduce([t.numpy() for t in tensors])]

        # the range guard's exchange alone: one float per tensor, MAX (raw, and in a tf.function)
        peaks = self.np.ones(len(tensors), self.np.float32)
        peaks_tensor = tf.constant(peaks)
        return {"raw": lambda: world.Allreduce(MPI.IN_PLACE, raw), "raw-seg": raw_segmented,
                "mpi": lambda: comms["mpi"].allreduce(arrays, "sum"),
                "mpi-graph": tf.function(lambda: comms["mpi-graph"].allreduce_tensors(tensors, "sum")),
                "mpi-eager": mpi_eager,
                "raw-peaks": lambda: world.Allreduce(MPI.IN_PLACE, peaks, op=MPI.MAX),
                "mpi-peaks": tf.function(lambda: comms["mpi-peaks"].allreduce_tensors([peaks_tensor], "max")),
                **self.fp16_methods("mpi", lambda path: comms[path], tensors),
                **self.tf_methods(arrays, tensors)}

    def tf_methods(self, arrays: list, tensors: list) -> dict[str, Callable]:
        """The tf backend's rows (``--tf``), numpy and in a tf.function."""
        comm = self.tf_comm
        if comm is None:
            return {}
        return {"tf": lambda: comm.allreduce(arrays, "sum"),
                "tf-graph": self.tf.function(lambda: comm.allreduce_tensors(tensors, "sum"))}

    def fp16_methods(self, backend: str, comm_for: Callable, tensors: list) -> dict[str, Callable]:
        """The fp16 rows of ``backend``, fused and in buckets, each with the range guard and without it
        (``comm_for(path)``: the communicator of that row)."""
        from engine.distributed.buckets import buckets_for

        buckets = buckets_for(tensors, BUCKET_MB)
        methods = {}
        for path in (f"{backend}-fp16", f"{backend}-bkt16"):
            for name in (path, f"{path}-off"):
                comm = comm_for(name)
                if path.endswith("bkt16"):
                    def reduce(comm=comm) -> list:
                        return comm.allreduce_tensor_buckets(tensors, buckets, "sum", wire="fp16")
                else:
                    def reduce(comm=comm) -> list:
                        return comm.allreduce_tensors(tensors, "sum", wire="fp16")
                methods[name] = self.traced(comm, reduce, guarded=not name.endswith("-off"))
        return methods

    def traced(self, comm, fn: Callable, guarded: bool) -> Callable:
        """``tf.function(fn)``, traced now with fp16's range guard on or off (read while tracing)."""
        saved = comm.fp16_range
        comm.fp16_range = saved if guarded else None
        try:
            function = self.tf.function(fn)
            function.get_concrete_function()
        finally:
            comm.fp16_range = saved
        return function

    def run_phase(self, make_methods: Callable) -> list[tuple[str, int, dict[str, list[float]]]]:
        rows = []
        for title, reps, arrays, tensors in self.data.values():
            methods = make_methods(arrays, tensors)
            if self.args.fp16_only:
                methods = {k: f for k, f in methods.items() if k == "raw" or "16" in k or "peaks" in k}
            want = self.world.allreduce(arrays[-2], op=self.MPI.SUM)
            for name in ("mpi", "mpi-graph", "hvd", "hvd-graph", "tf", "tf-graph"):
                if name in methods:
                    got = self.np.asarray(methods[name]()[-2])
                    assert self.np.array_equal(got, want), f"{name}: wrong sum"
            times: dict[str, list[float]] = {name: [] for name in methods}
            for fn in methods.values():  # warm-up: tracing, buffer allocation
                self.timed(fn, 2)
            for _ in range(self.args.rounds):
                for name, fn in methods.items():
                    times[name].append(self.timed(fn, reps))
            rows.append((title, sum(a.size for a in arrays), times))
        return rows

    def timed(self, fn: Callable, reps: int) -> float:
        self.world.Barrier()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        elapsed = (time.perf_counter() - start) / reps
        return self.world.allreduce(elapsed, op=self.MPI.MAX)  # the slowest rank defines the time


def worker(args: argparse.Namespace) -> None:
    from engine.distributed import create_communicator, horovod_import_error

    bench = Bench(args)
    phases = [("phase 1: Horovod not initialised", bench.run_phase(bench.mpi_methods))]
    if not args.no_horovod and horovod_import_error() is None:
        hvd = create_communicator("horovod")

        def with_horovod(arrays: list, tensors: list) -> dict[str, Callable]:
            methods = bench.mpi_methods(arrays, tensors)
            methods = {k: methods[k] for k in ("raw", "mpi", "mpi-graph")}
            methods["hvd-graph"] = bench.tf.function(lambda: hvd.allreduce_tensors(tensors, "sum"))
            methods["hvd"] = lambda: hvd.allreduce(arrays, "sum")
            return {**methods, **bench.fp16_methods("hvd", lambda path: hvd, tensors)}

        phase2 = bench.run_phase(with_horovod)
        phases.append(("phase 2: Horovod initialised (its background thread runs)", phase2))
    if bench.world.Get_rank() == 0:
        report(phases, args, bench.MPI, bench.tf)


def report(phases: list, args: argparse.Namespace, MPI, tf) -> None:
    lib = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
    print(f"allreduce benchmark: {args.np} ranks, {lib}, TensorFlow {tf.__version__}, "
          f"median of {args.rounds} interleaved rounds; 'raw/this' > 1 means faster than raw")
    for phase, rows in phases:
        print(f"\n{phase}\n{'model':36} {'params':>11} {'MB':>7}  {'method':13} {'time/red':>10} "
              f"{'range ms':>17} {'alg GB/s':>9} {'raw/this':>9}")
        for title, count, times in rows:
            medians = {name: statistics.median(t) for name, t in times.items()}
            for name, t in medians.items():
                spread = f"{min(times[name]) * 1e3:.3f}..{max(times[name]) * 1e3:.3f}"
                print(f"{title:36} {count:>11,} {count * 4 / 1e6:>7.2f}  {name:13} {t * 1e3:>8.3f}ms "
                      f"{spread:>17} {count * 4 / t / 1e9:>9.2f} {medians['raw'] / t:>8.2f}x")
    print()
    for line in verdicts(phases):
        print(line)
    for line in tf_ratios(phases):
        print(line)
    print("\nfp16's range guard: time per reduction with it and without it (-off), median of the rounds; the "
          "ratio is taken per round (the two ran side by side), its median and range")
    for line in guard_costs(phases):
        print(line)


def guard_costs(phases: list) -> list[str]:
    """Per model and fp16 row: guarded and unguarded medians, the difference, and the per-round ratios."""
    out = []
    for _, rows in phases:
        for title, _, times in rows:
            for name in GUARDED:
                if name not in times:
                    continue
                on, off = times[name], times[f"{name}-off"]
                ratios = [a / b for a, b in zip(on, off)]
                out.append(f"{title:36} {name:10} {statistics.median(on) * 1e3:9.3f} ms  off "
                           f"{statistics.median(off) * 1e3:9.3f} ms  "
                           f"+{(statistics.median(on) - statistics.median(off)) * 1e3:8.3f} ms  "
                           f"ratio {statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})")
    return out


def tf_ratios(phases: list) -> list[str]:
    """Per model: the tf backend's time over the mpi backend's, per round, median and range (> 1: the tf
    backend is the slower)."""
    out = []
    for _, rows in phases[:1]:
        for title, _, times in rows:
            for tf_row, mpi_row in (("tf", "mpi"), ("tf-graph", "mpi-graph")):
                if tf_row not in times or mpi_row not in times:
                    continue
                ratios = [a / b for a, b in zip(times[tf_row], times[mpi_row])]
                out.append(f"info: {title}: {tf_row} / {mpi_row} time ratio {statistics.median(ratios):.2f} "
                           f"({min(ratios):.2f}..{max(ratios):.2f}), "
                           f"{statistics.median(times[tf_row]) * 1e3:.3f} ms vs "
                           f"{statistics.median(times[mpi_row]) * 1e3:.3f} ms")
    return out


def verdicts(phases: list) -> list[str]:
    """Per model: mpi >= 0.9x raw (interleaved in phase 1), and mpi (phase 1) at least as fast as Horovod
    (phase 2; the phases run one after the other, so that comparison is not interleaved), each by
    ``timing.compare``: ranges of the seconds per reduction, INCONCLUSIVE where they overlap."""
    def side(times: dict, name: str, phase: int) -> Side:
        return Side(f"{name} (phase {phase}) s", tuple(times[name]))

    first = {title: times for title, _, times in phases[0][1]}
    second = {title: times for title, _, times in phases[1][1]} if len(phases) > 1 else {}
    out = []
    for title, m in first.items():
        if "mpi" not in m:  # --fp16-only
            continue
        ratio = statistics.median(m["raw"]) / statistics.median(m["mpi"])
        graph = statistics.median(m["mpi-graph"]) / statistics.median(m["mpi"])
        eager = statistics.median(m["mpi-eager"]) / statistics.median(m["mpi"])
        out.append(compare(side(m, "mpi", 1), side(m, "raw", 1),
                           f"{title}: engine mpi = {ratio:.2f}x raw (target >= 0.9x: its time <= raw's "
                           "/ 0.9)",
                           better="lower", factor=1 / 0.9, fmt="{:.5f}"))
        out.append(f"info: {title}: tf.function path {graph:.2f}x and eager-from-tensors path {eager:.2f}x "
                   "the time of the numpy call")
        if title in second:
            h = second[title]
            for mine, theirs in (("mpi", "hvd"), ("mpi-graph", "hvd-graph")):
                deployed = statistics.median(h[theirs]) / statistics.median(m[mine])
                side_by_side = statistics.median(h[theirs]) / statistics.median(h[mine])
                out.append(compare(side(m, mine, 1), side(h, theirs, 2),
                                   f"{title}: {mine} (phase 1) is {deployed:.2f}x as fast as {theirs} "
                                   f"(phase 2) (target >= 1x); in phase 2 side by side: {side_by_side:.2f}x",
                                   better="lower", fmt="{:.5f}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="lstm,large", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--no-horovod", action="store_true", help="skip phase 2")
    parser.add_argument("--fp16-only", action="store_true",
                        help="only raw and the fp16 rows with and without the range guard (issue 28)")
    parser.add_argument("--tf", action="store_true", help="also time the tf backend (tf, tf-graph)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        sys.exit(launch(args))


if __name__ == "__main__":
    main()
