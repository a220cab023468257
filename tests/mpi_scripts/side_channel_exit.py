"""Two ranks of the mpi backend exit at different times: run by tests/test_dist_side_channel_mpi.py as
``mpirun -np 2 python side_channel_exit.py``.

Rank 1 reports a wait to rank 0 on the side channel, then lingers ``LINGER`` seconds before it exits;
rank 0 exits at once. At exit each rank first meets the others (``SideChannel.meet_before_finalize``,
registered by the backend), then MPI is finalised. Rank 0 registers a handler of its own before the
backend exists, so that it runs after the meeting: it prints how long after rank 0's own end of work the
meeting let it go, and whether rank 1's report was left for it (it must have been taken in).
"""
from __future__ import annotations

import atexit
import time

from mpi4py import MPI

LINGER = 2.0
finished_work = 0.0


def after_the_meeting() -> None:
    channel = comm.side_channel
    left = channel._comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
    waited = time.monotonic() - finished_work
    print(f"rank 0: left after {waited:.2f} s; a message left in: {left}", flush=True)


atexit.register(after_the_meeting)  # before the backend's meeting, so after it at exit

from engine.distributed import StallLimits, create_communicator  # noqa: E402

comm = create_communicator("mpi", StallLimits(0, 0))
if comm.rank != 0:
    atexit.unregister(after_the_meeting)
comm.barrier()
if comm.rank == 1:
    comm.side_channel.report_wait(1, 0.5, "allreduce")
    time.sleep(LINGER)
finished_work = time.monotonic()
