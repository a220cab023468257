#!/usr/bin/env python3
"""What the stall watchdog costs per collective.

    .venv/bin/python benchmarks/bench_stall_watchdog.py            # launches `mpirun -np 2` itself

1. In one process: entering and leaving the watchdog's scopes of one step signal (the "step signal" guard
   around the counted "allreduce" collective), which is all the watchdog adds to a collective that does
   not wait long (no message is sent then).
2. With 2 ranks: the step signal (a 4-int allreduce, the engine's smallest and most frequent collective)
   on two mpi-backend communicators in each process, one with the default limits and one without, in
   interleaved rounds (the machine is noisy: compare the medians).
3. With 2 ranks on Horovod (where it imports): a small in-graph reduction with and without the graph's
   calls that tell the watchdog when it enters and leaves Horovod's collective.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launch(args: argparse.Namespace) -> int:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [str(Path(sys.executable).parent / "mpirun"), "--oversubscribe", "--bind-to", "none",
           "--map-by", "slot", "-np", "2", sys.executable, __file__, "--worker",
           "--rounds", str(args.rounds), "--signals", str(args.signals)]
    return subprocess.call(cmd, env=env, cwd=ROOT)


def scope_cost(repeats: int = 200_000) -> float:
    """Microseconds to enter and leave the scopes of one guarded step signal."""
    from engine.distributed import StallLimits, Watchdog

    dog = Watchdog(StallLimits(60, 300), lambda message, code: None, rank=1, size=2, start=False)

    def guarded() -> None:
        with dog.guard("step signal"), dog.collective("allreduce"):
            pass

    def bare() -> None:
        pass

    times = [timeit.timeit(f, number=repeats) for f in (guarded, bare) for _ in range(3)]
    return (min(times[:3]) - min(times[3:])) / repeats * 1e6


def worker(args: argparse.Namespace) -> None:
    from engine.distributed import StallLimits, step_signal
    from engine.distributed.mpi_backend import MPICommunicator

    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")  # as the engine runs (select.py)
    comms = {"with watchdog": MPICommunicator(StallLimits(warning=60, timeout=300)),
             "without": MPICommunicator(None)}
    times: dict[str, list[float]] = {name: [] for name in comms}
    for _ in range(args.rounds):
        for name, comm in comms.items():
            comm.barrier()
            start = time.perf_counter()
            for _ in range(args.signals):
                step_signal(comm, True, False)
            times[name].append((time.perf_counter() - start) / args.signals * 1e6)
    if comms["without"].rank == 0:
        print(f"watchdog scopes of one step signal, in one process: {scope_cost():.2f} us")
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, value in medians.items():
            print(f"step signal {name:>13}: {value:6.2f} us (median of {args.rounds} rounds of "
                  f"{args.signals})")
        print(f"watchdog cost per collective: {medians['with watchdog'] - medians['without']:+.2f} us")
    from engine.distributed import horovod_import_error

    if horovod_import_error() is None:
        horovod_in_graph(args)


def horovod_in_graph(args: argparse.Namespace) -> None:
    import tensorflow as tf

    from engine.distributed import StallLimits
    from engine.distributed.horovod_backend import HorovodCommunicator

    comm = HorovodCommunicator(StallLimits(warning=60, timeout=300))
    watchdog = comm.watchdog
    reductions = {}
    for name, dog in (("with watchdog", watchdog), ("without", None)):
        comm.watchdog = dog  # read while tracing: decides whether the graph reports to the watchdog
        reductions[name] = tf.function(lambda t: comm.allreduce_tensors([t], "sum")[0])
        reductions[name](tf.ones(4))
    comm.watchdog = watchdog
    times: dict[str, list[float]] = {name: [] for name in reductions}
    calls = max(1, args.signals // 10)
    for _ in range(args.rounds):
        for name, reduce in reductions.items():
            comm.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                reduce(tf.ones(4))
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    if comm.rank == 0:
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, value in medians.items():
            print(f"horovod in-graph allreduce {name:>13}: {value:8.1f} us")
        print(f"watchdog cost per in-graph Horovod collective: "
              f"{medians['with watchdog'] - medians['without']:+.1f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--signals", type=int, default=2000)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.worker:
        return launch(args)
    worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
