"""Run under ``mpirun -np N``: rank 1 (or ``--failing-rank``) fails in the way MODE names while the other
ranks wait in the step signal (forever, unless the failure handling ends the job).

    python dist_failure.py exception|engine_error|thread|sigkill|stall|stall_in_graph|freeze [--backend mpi]
        [--failing-rank R] [--stall-warning S] [--stall-timeout S]

Each rank prints ``up at T`` (``time.monotonic()``, the same clock in every process of the machine) once
every rank has started, so that a test can time the failure handling without the start-up.
"""
from __future__ import annotations

import argparse
import os
import signal
import threading
import time

from engine.distributed import StallLimits, create_communicator, install_failure_handler, step_signal
from engine.runtime import process
from engine.runtime.errors import DataError


def fail(mode: str) -> None:
    if mode == "exception":
        raise RuntimeError("boom: the original error of rank 1")
    if mode == "engine_error":
        raise DataError("HDF file 'corpus.hdf': dataset 'inputs' is missing; expected a float32 matrix")
    if mode == "thread":
        def loader() -> None:
            raise RuntimeError("boom: the data loader thread of rank 1 crashed")

        threading.Thread(target=loader).start()
        time.sleep(600)  # the main thread would wait for the loader forever
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode in ("stall", "stall_in_graph"):
        time.sleep(600)  # alive, but never joins the next collective
    if mode == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops, the stall watchdog's too
    raise ValueError(f"unknown mode {mode!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--failing-rank", type=int, default=1)
    parser.add_argument("--stall-warning", type=float, default=None)
    parser.add_argument("--stall-timeout", type=float, default=None)
    args = parser.parse_args()
    if args.mode == "stall_in_graph":
        import tensorflow  # noqa: F401  (loaded during the start-up, not while the others wait)
    comm = create_communicator(args.backend, StallLimits(args.stall_warning, args.stall_timeout))
    process.set_communicator(comm)
    install_failure_handler()
    step_signal(comm, True, False)  # everyone is up
    print(f"up at {time.monotonic():.3f}", flush=True)
    if comm.rank == args.failing_rank:
        fail(args.mode)
    if args.mode == "stall_in_graph":  # wait inside a tf.function's reduction, where no Python code runs
        import tensorflow as tf

        reduce = tf.function(lambda t: comm.allreduce_tensors([t])[0])
        while True:
            reduce(tf.ones(3))
    while True:
        step_signal(comm, True, False)


if __name__ == "__main__":
    main()
