#!/usr/bin/env python3
"""The first thing to run on a new cluster: does every rank find the others, and do the collectives of
every available backend give exact results?

    mpirun -np 4 python demos/demo-horovod-mpi.py --expect-size 4     (see demo-horovod-mpi.sh)

Prints each rank's process, versions and scheduler environment, the hosts of the job, then checks each
backend (mpi, and horovod when it imports): rank and size agree with MPI, an allreduce of known values
gives the exact sum, broadcasts arrive. Ends with one verdict line; exit status 1 if anything failed.
"""
from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
from typing import Any, Callable

import numpy as np

SCHEDULER_VARS = ("JOB_ID", "NSLOTS", "NHOSTS", "PE", "PE_HOSTFILE",  # SGE
                  "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_PROCID",
                  "SLURM_LOCALID", "SLURM_NODEID",
                  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMI_SIZE",
                  "CUDA_VISIBLE_DEVICES")


def version_of(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception as exc:  # not installed, or built for another TensorFlow
        return f"not available ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


def describe_process(MPI: Any) -> dict[str, Any]:
    env = {name: os.environ[name] for name in SCHEDULER_VARS if name in os.environ}
    hostfile = os.environ.get("PE_HOSTFILE")
    if hostfile:
        try:
            with open(hostfile, encoding="utf-8") as f:
                env["PE_HOSTFILE contents"] = f.read().strip().replace("\n", " | ")
        except OSError as exc:
            env["PE_HOSTFILE contents"] = f"unreadable: {exc}"
    return {
        "pid": os.getpid(), "host": socket.gethostname(),
        "python": f"{platform.python_version()} ({sys.executable})",
        "tensorflow": version_of("tensorflow"), "horovod": version_of("horovod"),
        "mpi4py": version_of("mpi4py"), "numpy": np.__version__,
        "MPI library": MPI.Get_library_version().strip().splitlines()[0].rstrip(", "),
        "MPI standard": "%d.%d" % MPI.Get_version(), "thread level": MPI.Query_thread(),
        "environment": env,
    }


class Checks:
    """Collects (name, ok, detail) of this rank; an exception in a check is a failed check."""

    def __init__(self) -> None:
        self.results: list[tuple[str, bool, str]] = []

    def run(self, name: str, check: Callable[[], str | None]) -> None:
        try:
            problem = check()
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        self.results.append((name, problem is None, problem or ""))


def check_backend(name: str, world: Any, checks: Checks) -> None:
    from engine.distributed import create_communicator

    try:
        comm = create_communicator(name)
    except Exception as exc:
        checks.results.append((f"{name}: start", False, f"{type(exc).__name__}: {exc}"))
        return
    rank, size = world.Get_rank(), world.Get_size()
    s = size * (size + 1) // 2

    def identity() -> str | None:
        if (comm.rank, comm.size) != (rank, size):
            return f"backend says rank {comm.rank} of {comm.size}, MPI says rank {rank} of {size}"
        return None

    def allreduce() -> str | None:
        values = [np.arange(1000, dtype=dtype) * (rank + 1) for dtype in (np.float32, np.float64, np.int64)]
        expected = [np.arange(1000, dtype=v.dtype) * s for v in values]
        for got, want in zip(comm.allreduce(values, "sum"), expected):
            if not np.array_equal(got, want):
                return f"{want.dtype} sum wrong: got {got[:4]}..., expected {want[:4]}..."
        return None

    def allreduce_in_graph() -> str | None:
        import tensorflow as tf

        reduce = tf.function(lambda t: comm.allreduce_tensors([t], "sum")[0])
        got = reduce(tf.constant(np.arange(7, dtype=np.float32) * (rank + 1))).numpy()
        return None if np.array_equal(got, np.arange(7) * s) else f"got {got}, expected {np.arange(7) * s}"

    def broadcast() -> str | None:
        import tensorflow as tf

        got = comm.broadcast_object({"from": rank, "hosts": socket.gethostname()}, root=size - 1)
        if got["from"] != size - 1:
            return f"broadcast_object from rank {size - 1} delivered {got}"
        var = tf.Variable(np.full(5, rank, np.float32))
        comm.broadcast_variables([var], root=0)
        comm.barrier()
        return None if (var.numpy() == 0).all() else f"broadcast_variables delivered {var.numpy()}"

    for check_name, check in (("rank/size", identity), ("allreduce", allreduce),
                              ("allreduce in tf.function", allreduce_in_graph), ("broadcast", broadcast)):
        checks.run(f"{name}: {check_name}", check)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--expect-size", type=int, help="fail unless the job has exactly this many ranks")
    parser.add_argument("--backends", default="available",
                        help="'available' (mpi, plus horovod when it imports) or a list like 'mpi,horovod'")
    parser.add_argument("--timeout", type=float, default=300, help="abort the job after this many seconds")
    args = parser.parse_args()

    from mpi4py import MPI  # before Horovod: mpi4py initialises MPI

    from engine.runtime import log, process
    from engine.distributed import horovod_import_error
    from engine.distributed.mpi_backend import MPICommunicator
    from engine.distributed.watchdog import StallLimits
    from engine.runtime.launch import env_size

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    comm = MPICommunicator(StallLimits(timeout=args.timeout))  # a hung collective must not hang the demo
    process.set_communicator(comm)
    log.init()
    print(f"[rank {rank}/{size}] pid {os.getpid()} on {socket.gethostname()}: MPI is up", flush=True)
    with comm.stall_guard("demo-horovod-mpi"):
        infos = world.allgather(describe_process(MPI))
        if rank == 0:
            for r, info in enumerate(infos):
                env = info.pop("environment")
                print(f"--- rank {r}: " + ", ".join(f"{k} {v}" for k, v in info.items()))
                for key, value in env.items():
                    print(f"      {key}={value}")
            hosts: dict[str, list[int]] = {}
            for r, info in enumerate(infos):
                hosts.setdefault(info["host"], []).append(r)
            print("hosts: " + ", ".join(f"{h} (ranks {','.join(map(str, rs))})" for h, rs in hosts.items()),
                  flush=True)

        checks = Checks()
        launched = env_size()
        checks.run("launcher", lambda: None if launched == size else (
            f"the launcher started {launched} processes but MPI sees a job of {size}: mpi4py's MPI library "
            "is not the one this mpirun/srun belongs to (each process runs alone)"))
        if args.expect_size is not None:
            checks.run("size", lambda: None if size == args.expect_size else (
                f"expected {args.expect_size} ranks (--expect-size), MPI sees {size}"))
        why_no_horovod = horovod_import_error()
        backends = args.backends.split(",") if args.backends != "available" else (
            ["mpi"] + (["horovod"] if why_no_horovod is None else []))
        if rank == 0 and "horovod" not in backends:
            print(f"horovod: not checked ({why_no_horovod or 'not requested'})", flush=True)
        for name in backends:
            check_backend(name, world, checks)
        everyone = world.allgather(checks.results)
    failures = [f"rank {r}: {name}: {detail}" for r, results in enumerate(everyone)
                for name, ok, detail in results if not ok]
    if rank == 0:
        for name, ok, detail in checks.results:
            print(f"  {'ok  ' if ok else 'FAIL'} {name}" + (f" ({detail})" if detail else ""))
        hosts_count = len({info["host"] for info in infos})
        if failures:
            shown = "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else "")
            print(f"demo-horovod-mpi: FAIL ({len(failures)} failed checks): {shown}", flush=True)
        else:
            print(f"demo-horovod-mpi: PASS: {size} ranks on {hosts_count} host(s), backends "
                  f"{', '.join(backends)}: rank/size, exact allreduce, broadcast all ok", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
