"""Small out-of-band messages between the ranks of an MPI job, next to the collectives, never blocking.

A duplicate of the job's communicator carries three kinds of 64-byte messages, so they can never be
mistaken for the training's own traffic:

- waits: "this rank has waited s seconds in collective #k (name), inside a checkpoint window or not",
  sent to rank 0 by a rank's stall watchdog while the rank waits long (``watchdog.py``); never while
  collectives finish quickly;
- stop notices: "rank r received stop signal s", sent to every other rank, for the one mode in which the
  ranks do not meet every step (``strategy.ParamAverage`` with ``random_seed_offset``);
- acknowledgements of a stop notice: the receiver answers each notice it takes in, and the sender sends
  it again to every rank that has not answered, first after 0.5 s, then at doubling intervals up to 8 s,
  until all have answered or the job ends. A notice is thus never lost to a send that could not start.

Sends are ``Isend`` from a ring of buffers per destination rank (a buffer is reused only after its send
completed, which for such small messages happens at once). A message that finds its destination's next
buffer still in flight (behind a cut link, or to a rank that stopped taking messages in) is dropped
(``dropped`` counts them): a wait is reported again at the next look, a stop notice resent until answered.
A stuck destination costs only its own messages, never another rank's. Receives use matched probes
(``Improbe``), so a rank never waits here and two threads never take the same message.

Threads: needs MPI with ``THREAD_MULTIPLE`` (what mpi4py asks for) for the watchdog's messages (the
watchdog threads send and receive while the main threads run collectives) and for the resend thread,
which a rank starts when it sends a stop notice (it also answers the other ranks' notices meanwhile:
ranks stopped at once answer each other while they all wait in the step signal). Below it
(``threads=False``, ``mpi_backend``) only the main thread uses the channel, for stop notices, and the
resends happen when the main thread sends or looks for notices (at step boundaries), not while it waits
in a collective.

A message: the number (int64: the collective's number or the signal's), the value (float64: seconds
waited), one byte of flags (1: inside a checkpoint window), the text (UTF-8, NUL-terminated).
"""
from __future__ import annotations

import atexit
import threading
import time
from typing import Any

import numpy as np

_WAIT, _STOP, _STOP_ACK = 1, 2, 3
_MESSAGE_BYTES = 64
_TEXT = 17  # where the text starts: after the number, the value and the flags
_SAVING = 1
_RING = 32  # send buffers per destination rank
RESEND_FIRST, RESEND_MAX = 0.5, 8.0  # seconds until an unanswered stop notice is sent again
MEET_TIMEOUT = 30.0  # seconds the ranks wait for each other at exit (meet_before_finalize)


class _Outbox:
    """The send buffers towards one rank, used in turn."""

    def __init__(self) -> None:
        self.buffers = [np.zeros(_MESSAGE_BYTES, np.uint8) for _ in range(_RING)]
        self.requests: list[Any] = [None] * _RING
        self.next = 0

    def free_buffer(self) -> int | None:
        """The next buffer's index when its last send has completed, else None."""
        slot = self.next
        if self.requests[slot] is not None and not self.requests[slot].Test():
            return None
        self.next = (slot + 1) % _RING
        return slot


class SideChannel:
    def __init__(self, comm: Any, mpi: Any, *, threads: bool = True,
                 clock: Any = time.monotonic) -> None:
        """``comm``: the job's communicator (duplicated here); ``mpi``: mpi4py's ``MPI`` module;
        ``threads``: MPI runs with ``THREAD_MULTIPLE``, so a thread of the channel may resend stop notices
        while the main thread waits in a collective."""
        self._comm = comm.Dup()
        self._mpi = mpi
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self._threads = threads
        self._clock = clock
        self._outboxes: dict[int, _Outbox] = {}
        self.dropped = 0  # messages dropped because their destination's buffers were all in flight
        self._send_lock = threading.Lock()  # the watchdog, resend and main threads all send
        # the stop notice this rank sent: the signal, rank -> (when to resend, interval) while unanswered
        self._stop_signal = 0
        self._unanswered: dict[int, tuple[float, float]] = {}
        self._stop_lock = threading.Lock()
        self._notices: list[tuple[int, int]] = []  # taken in by the resend thread, not yet returned
        self._noticed: set[int] = set()  # ranks whose notice was taken in (resends are not news)
        self._closed = threading.Event()
        self._resender: threading.Thread | None = None

    # ----- waits (the stall watchdog) -----
    def report_wait(self, count: int, waited: float, what: str, saving: bool = False) -> None:
        self._send(0, _WAIT, count, waited, what, _SAVING if saving else 0)

    def collect_waits(self) -> list[tuple[int, int, float, str, bool]]:
        return [(rank, count, waited, what, bool(flags & _SAVING))
                for rank, count, waited, flags, what in self._receive_all(_WAIT)]

    # ----- stop notices -----
    def notify_stop(self, signal_number: int) -> None:
        """Tell every other rank that this rank got stop signal ``signal_number``, and keep telling the
        ranks that have not answered (``unanswered``)."""
        now = self._clock()
        with self._stop_lock:
            self._stop_signal = signal_number
            self._unanswered = {rank: (now, RESEND_FIRST) for rank in range(self.size) if rank != self.rank}
        self.resend_stop()
        if self._threads and self._resender is None and not self._closed.is_set():
            self._resender = threading.Thread(target=self._resend_until_answered, name="stop-notices",
                                              daemon=True)
            self._resender.start()
            atexit.register(self.close)  # before MPI is finalised (atexit runs the newest first)

    def stop_notices(self) -> list[tuple[int, int]]:
        """(rank, signal number) of the stop notices received since the last call, each rank's once;
        every notice taken in is answered."""
        if not self._threads:
            self.resend_stop()
        self._take_notices()
        with self._stop_lock:
            notices, self._notices = self._notices, []
        return notices

    def unanswered(self) -> set[int]:
        """The ranks that have not answered this rank's stop notice yet."""
        with self._stop_lock:
            return set(self._unanswered)

    def resend_stop(self) -> None:
        """One round: take in answers (and the other ranks' notices, answering them), then send the stop
        notice to each rank that has not answered and whose resend is due."""
        for rank, _, _, _, _ in self._receive_all(_STOP_ACK):
            with self._stop_lock:
                self._unanswered.pop(rank, None)
        self._take_notices()
        now = self._clock()
        with self._stop_lock:
            due = [rank for rank, (when, _) in self._unanswered.items() if when <= now]
            for rank in due:
                interval = self._unanswered[rank][1]
                self._unanswered[rank] = (now + interval, min(2 * interval, RESEND_MAX))
            signal_number = self._stop_signal
        for rank in due:
            self._send(rank, _STOP, signal_number, 0.0, "")

    def close(self) -> None:
        """End the resend thread, and wait for it: it must not be inside an MPI call when MPI ends."""
        self._closed.set()
        if self._resender is not None and self._resender is not threading.current_thread():
            self._resender.join(timeout=5.0)

    def meet_before_finalize(self, timeout: float = MEET_TIMEOUT) -> bool:
        """A rank's last exchange before ``MPI_Finalize`` (at exit): a barrier with the other ranks, then the
        channel's messages still addressed to this rank taken in. Without it a rank that finishes first
        tears its side of the shared-memory transport down while another still handles messages from it:
        Open MPI 5 then crashes in ``MPI_Finalize`` now and then (seen once in ~150 two-rank jobs: rank 1
        segfaulted in ``mca_btl_sm_poll_handle_frag`` after a complete run; Open MPI's issue 10313, whose
        maintainers name a barrier before finalising as the remedy). The barrier is polled and gives up
        after ``timeout`` seconds (False): a rank that never comes is dead, and the job ends without it.
        The backend registers it with atexit before the stall watchdog and the resend thread exist, so it runs
        after their stops, and before mpi4py finalises MPI; only ranks that exit normally run it (a failure
        ends its rank by MPI_Abort or os._exit)."""
        if self._mpi.Is_finalized():
            return True
        request = self._comm.Ibarrier()
        deadline = time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        self._receive_all(self._mpi.ANY_TAG)
        return True

    def _resend_until_answered(self) -> None:
        while not self._closed.wait(RESEND_FIRST / 2):
            self.resend_stop()
            if not self.unanswered():
                return

    def _take_notices(self) -> None:
        """Receive the stop notices that have arrived, answer each, keep each rank's first."""
        for rank, number, _, _, _ in self._receive_all(_STOP):
            self._send(rank, _STOP_ACK, number, 0.0, "")
            with self._stop_lock:
                if rank not in self._noticed:
                    self._noticed.add(rank)
                    self._notices.append((rank, number))

    # ----- the messages -----
    def _send(self, dest: int, tag: int, number: int, value: float, text: str, flags: int = 0) -> None:
        with self._send_lock:
            outbox = self._outboxes.get(dest)
            if outbox is None:
                outbox = self._outboxes[dest] = _Outbox()
            slot = outbox.free_buffer()
            if slot is None:
                # 32 sends to that rank ago and still not out: the link to it is cut, or it takes nothing
                # in. Waiting here would block the stall watchdog's thread, the one that must end the job
                # then (seen with a cut link during a long reduction); the message is dropped instead.
                self.dropped += 1
                return
            buffer = outbox.buffers[slot]
            buffer[:16] = np.frombuffer(np.int64(number).tobytes() + np.float64(value).tobytes(), np.uint8)
            buffer[16] = flags
            encoded = text.encode("utf-8")[:_MESSAGE_BYTES - _TEXT - 1]
            buffer[_TEXT:_TEXT + len(encoded)] = np.frombuffer(encoded, np.uint8)
            buffer[_TEXT + len(encoded)] = 0
            outbox.requests[slot] = self._comm.Isend(buffer, dest, tag)

    def _receive_all(self, tag: int) -> list[tuple[int, int, float, int, str]]:
        """(source, number, value, flags, text) of every message with ``tag`` that has arrived."""
        # own buffers per call: several threads receive (each its own tags; matched probes regardless)
        received, inbox, status = [], np.zeros(_MESSAGE_BYTES, np.uint8), self._mpi.Status()
        while True:
            message = self._comm.Improbe(self._mpi.ANY_SOURCE, tag, status)
            if message is None:
                return received
            source = status.Get_source()
            message.Recv(inbox)
            number, value = int(inbox[:8].view(np.int64)[0]), float(inbox[8:16].view(np.float64)[0])
            text = bytes(inbox[_TEXT:]).split(b"\0", 1)[0].decode("utf-8", "replace")
            received.append((source, number, value, int(inbox[16]), text))
