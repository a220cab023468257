"""Three ranks on the side channel (engine/distributed/side_channel.py), rank 0 taking nothing in for a
while: run by tests/test_dist_side_channel_mpi.py as ``mpirun -np 3 python side_channel_stuck_peer.py
FLAG``.

Rank 0 makes no MPI call until the file FLAG exists, so the messages sent to it pile up in shared memory
until its sender's sends stop completing (as behind a cut link). Rank 1 reports waits to rank 0 until
its buffers towards rank 0 are all in flight, then sends a stop notice: rank 2 must get it and answer
at once; rank 1 then writes FLAG, and rank 0, taking messages in again, must get the notice too (sent
again, as the first one to rank 0 was dropped) and answer it. Each rank prints "rank R: ok" or
"rank R: FAILED ..." and exits 1 on failure.
"""
from __future__ import annotations

import os
import sys
import time

from mpi4py import MPI

from engine.distributed.side_channel import SideChannel

SIGNAL = 10  # SIGUSR1
LIMIT = 15.0  # seconds any one step may take


def until(condition, what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {LIMIT:g} s: {what}")
        time.sleep(0.02)


def rank_0(channel: SideChannel, flag: str) -> str:
    until(lambda: os.path.exists(flag), f"rank 1 wrote {flag}")  # no MPI call meanwhile
    notices: list = []
    until(lambda: notices.extend(channel.stop_notices()) or notices, "rank 1's stop notice reached rank 0")
    waits = len(channel.collect_waits())
    assert notices == [(1, SIGNAL)], notices
    return f"got {notices} after rank 1's {waits} reports"


def rank_1(channel: SideChannel, flag: str) -> str:
    reports = 0
    while channel.dropped == 0 and reports < 100_000:  # until rank 0's buffers are all in flight
        channel.report_wait(7, 1.0, "allreduce")
        reports += 1
    assert channel.dropped, f"all {reports} reports to rank 0 went out: the test's premise failed"
    channel.notify_stop(SIGNAL)
    until(lambda: channel.unanswered() == {0}, f"rank 2 answered the stop notice ({channel.unanswered()})")
    with open(flag + ".tmp", "w"):
        pass
    os.rename(flag + ".tmp", flag)
    until(lambda: not channel.unanswered(), "rank 0 answered the stop notice")
    return f"rank 0 stuck after {reports} reports; both answered"


def rank_2(channel: SideChannel, flag: str) -> str:
    notices: list = []
    until(lambda: notices.extend(channel.stop_notices()) or notices, "rank 1's stop notice reached rank 2")
    assert notices == [(1, SIGNAL)], notices
    return f"got {notices} while rank 0 took nothing in"


def main() -> int:
    comm = MPI.COMM_WORLD
    channel = SideChannel(comm, MPI, threads=MPI.Query_thread() >= MPI.THREAD_MULTIPLE)
    check = {0: rank_0, 1: rank_1, 2: rank_2}[comm.Get_rank()]
    try:
        said = check(channel, sys.argv[1])
    except AssertionError as error:
        print(f"rank {comm.Get_rank()}: FAILED {error}", flush=True)
        channel.close()
        return 1
    print(f"rank {comm.Get_rank()}: ok, {said}", flush=True)
    comm.Barrier()
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
