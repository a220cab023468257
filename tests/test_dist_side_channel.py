"""The side channel never blocks its sender: behind a cut link its sends never complete, and the stall
watchdog's thread, which reports a wait once a look, must still reach its own deadline (it hung in the
33rd report before). One rank whose sends are stuck costs only its own messages: the others' still go out
(a shared ring of buffers once dropped every message to every rank behind one stuck send). A stop notice
is sent again until its receiver answers. A fake communicator, no MPI (the 3-rank mpirun test:
test_dist_side_channel_mpi.py)."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from engine.distributed.side_channel import _RING, _STOP, _STOP_ACK, RESEND_FIRST, SideChannel

pytestmark = pytest.mark.tf_latest


class Request:
    def __init__(self, done: bool) -> None:
        self.done = done

    def Test(self) -> bool:
        return self.done

    def Wait(self) -> None:
        if not self.done:
            threading.Event().wait()  # for ever, as MPI_Wait behind a cut link


class Status:
    def __init__(self) -> None:
        self.source = -1

    def Get_source(self) -> int:
        return self.source


class Message:
    def __init__(self, payload: np.ndarray) -> None:
        self.payload = payload

    def Recv(self, buffer: np.ndarray) -> None:
        buffer[:] = self.payload


MPI = SimpleNamespace(ANY_SOURCE=-1, Status=Status)


class Comm:
    """Rank ``rank`` of ``size``; sends to the ranks in ``stuck`` never complete (until ``unstick``);
    ``arrive`` puts a message from another rank into this rank's inbox."""

    def __init__(self, rank: int = 1, size: int = 2, stuck: tuple[int, ...] = ()) -> None:
        self.rank, self.size, self.stuck = rank, size, set(stuck)
        self.sent: list[tuple[int, int, int]] = []  # (destination, tag, number)
        self.requests: dict[int, list[Request]] = {}
        self.inbox: list[tuple[int, int, np.ndarray]] = []

    def Dup(self) -> "Comm":
        return self

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Isend(self, buffer: np.ndarray, dest: int, tag: int) -> Request:
        self.sent.append((dest, tag, int(buffer[:8].view(np.int64)[0])))
        request = Request(done=dest not in self.stuck)
        self.requests.setdefault(dest, []).append(request)
        return request

    def unstick(self, dest: int) -> None:
        self.stuck.discard(dest)
        for request in self.requests.get(dest, []):
            request.done = True

    def arrive(self, source: int, tag: int, number: int) -> None:
        payload = np.zeros(64, np.uint8)
        payload[:8] = np.frombuffer(np.int64(number).tobytes(), np.uint8)
        self.inbox.append((source, tag, payload))

    def Improbe(self, source: int, tag: int, status: Status) -> Message | None:
        for i, (sender, sent_tag, payload) in enumerate(self.inbox):
            if sent_tag == tag:
                del self.inbox[i]
                status.source = sender
                return Message(payload)
        return None

    def to(self, dest: int, tag: int) -> list[int]:
        return [number for d, t, number in self.sent if d == dest and t == tag]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reports_behind_a_cut_link_are_dropped_instead_of_blocking_the_watchdog_thread():
    comm = Comm(stuck=(0,))
    channel = SideChannel(comm, MPI, threads=False)
    reporter = threading.Thread(target=lambda: [channel.report_wait(7, float(i), "allreduce")
                                                for i in range(3 * _RING)], daemon=True)
    reporter.start()
    reporter.join(timeout=10)
    assert not reporter.is_alive(), "report_wait blocked on a send that never completes"
    assert len(comm.sent) == _RING  # one send per buffer; the others dropped while those are in flight
    assert channel.dropped == 2 * _RING


def test_a_rank_whose_sends_are_stuck_does_not_silence_the_channel_to_the_others():
    comm = Comm(rank=1, size=3, stuck=(0,))
    channel = SideChannel(comm, MPI, threads=False)
    for i in range(3 * _RING):  # rank 0 takes nothing in: its buffers fill up
        channel.report_wait(7, float(i), "allreduce")
    channel.notify_stop(10)
    assert comm.to(2, _STOP) == [10], "the stop notice to rank 2 was dropped behind rank 0's stuck sends"
    assert comm.to(0, _STOP) == []  # dropped: rank 0's buffers are all in flight
    assert channel.unanswered() == {0, 2}


def test_a_stop_notice_is_sent_again_until_each_rank_answers():
    comm, clock = Comm(rank=1, size=3, stuck=(0,)), Clock()
    channel = SideChannel(comm, MPI, threads=False, clock=clock)
    for i in range(_RING):
        channel.report_wait(7, float(i), "allreduce")
    channel.notify_stop(15)
    comm.arrive(2, _STOP_ACK, 15)
    channel.resend_stop()  # not due yet: rank 2's answer is taken in, nothing is sent
    assert channel.unanswered() == {0} and comm.to(0, _STOP) == [] and comm.to(2, _STOP) == [15]
    clock.now += RESEND_FIRST
    channel.resend_stop()  # due, but rank 0's buffers are still in flight: dropped again
    assert comm.to(0, _STOP) == []
    comm.unstick(0)  # rank 0 takes its messages in again
    clock.now += 2 * RESEND_FIRST
    channel.resend_stop()
    assert comm.to(0, _STOP) == [15] and comm.to(2, _STOP) == [15]  # rank 2 answered: never resent
    clock.now += 4 * RESEND_FIRST
    channel.resend_stop()  # still no answer: sent again
    assert comm.to(0, _STOP) == [15, 15]
    comm.arrive(0, _STOP_ACK, 15)
    clock.now += 100
    channel.resend_stop()
    assert channel.unanswered() == set() and comm.to(0, _STOP) == [15, 15]


def test_each_notice_taken_in_is_answered_and_reported_once_per_rank():
    comm = Comm(rank=0, size=3)
    channel = SideChannel(comm, MPI, threads=False)
    comm.arrive(1, _STOP, 10)
    comm.arrive(2, _STOP, 15)
    comm.arrive(1, _STOP, 10)  # a resend: the answer was not back yet
    assert sorted(channel.stop_notices()) == [(1, 10), (2, 15)]
    assert comm.to(1, _STOP_ACK) == [10, 10] and comm.to(2, _STOP_ACK) == [15]
    comm.arrive(1, _STOP, 10)
    assert channel.stop_notices() == [] and comm.to(1, _STOP_ACK) == [10, 10, 10]


def test_the_resend_thread_ends_once_every_rank_answered():
    comm = Comm(rank=0, size=2)
    channel = SideChannel(comm, MPI, threads=True)
    channel.notify_stop(12)
    comm.arrive(1, _STOP_ACK, 12)
    channel._resender.join(timeout=10)
    assert not channel._resender.is_alive() and channel.unanswered() == set()
    channel.close()
