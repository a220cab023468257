"""The side channel never blocks its sender: behind a cut link its sends never complete, and the stall
watchdog's thread, which reports a wait once a look, must still reach its own deadline (it hung in the
33rd report before). A fake communicator, no MPI."""
from __future__ import annotations

import threading

import pytest

from engine.distributed.side_channel import _RING, SideChannel

pytestmark = pytest.mark.tf_latest


class StuckRequest:
    """A send that never goes out."""

    def Test(self) -> bool:
        return False

    def Wait(self) -> None:
        threading.Event().wait()  # for ever, as MPI_Wait behind a cut link


class Comm:
    def __init__(self) -> None:
        self.sent = 0

    def Dup(self) -> "Comm":
        return self

    def Get_rank(self) -> int:
        return 1

    def Get_size(self) -> int:
        return 2

    def Isend(self, buffer, dest: int, tag: int) -> StuckRequest:
        self.sent += 1
        return StuckRequest()


def test_reports_behind_a_cut_link_are_dropped_instead_of_blocking_the_watchdog_thread():
    comm = Comm()
    channel = SideChannel(comm, mpi=None)
    reporter = threading.Thread(target=lambda: [channel.report_wait(7, float(i), "allreduce")
                                                for i in range(3 * _RING)], daemon=True)
    reporter.start()
    reporter.join(timeout=10)
    assert not reporter.is_alive(), "report_wait blocked on a send that never completes"
    assert comm.sent == _RING  # one send per buffer; the rest are dropped while the buffers are in flight
