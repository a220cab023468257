"""Small out-of-band messages between the ranks of an MPI job, next to the collectives, never blocking.

A duplicate of the job's communicator carries two kinds of 64-byte messages, so they can never be
mistaken for the training's own traffic:

- waits: "this rank has waited s seconds in collective #k (name), inside a checkpoint window or not",
  sent to rank 0 by a rank's stall watchdog while the rank waits long (``watchdog.py``); never while
  collectives finish quickly;
- stop notices: "rank r received stop signal s", sent to every other rank, for the one mode in which the
  ranks do not meet every step (``strategy.ParamAverage`` with ``random_seed_offset``).

Sends are ``Isend`` from a ring of buffers (a buffer is reused only after its send completed, which for
such small messages happens at once; a message finding its buffer still in flight, behind a cut link, is
dropped); receives probe first, so a rank never waits here. Needs MPI with
``THREAD_MULTIPLE`` (what mpi4py asks for) for the watchdog's messages: the watchdog threads send and
receive while the main threads run collectives. Below it (``mpi_backend``) only the main thread uses the
channel, for stop notices.

A message: the number (int64: the collective's number or the signal's), the value (float64: seconds
waited), one byte of flags (1: inside a checkpoint window), the text (UTF-8, NUL-terminated).
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

_WAIT, _STOP = 1, 2
_MESSAGE_BYTES = 64
_TEXT = 17  # where the text starts: after the number, the value and the flags
_SAVING = 1
_RING = 32


class SideChannel:
    def __init__(self, comm: Any, mpi: Any) -> None:
        """``comm``: the job's communicator (duplicated here); ``mpi``: mpi4py's ``MPI`` module."""
        self._comm = comm.Dup()
        self._mpi = mpi
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self._buffers = [np.zeros(_MESSAGE_BYTES, np.uint8) for _ in range(_RING)]
        self._requests: list[Any] = [None] * _RING
        self._next = 0
        self._send_lock = threading.Lock()  # the watchdog thread and the main thread both send

    def report_wait(self, count: int, waited: float, what: str, saving: bool = False) -> None:
        self._send(0, _WAIT, count, waited, what, _SAVING if saving else 0)

    def collect_waits(self) -> list[tuple[int, int, float, str, bool]]:
        return [(rank, count, waited, what, bool(flags & _SAVING))
                for rank, count, waited, flags, what in self._receive_all(_WAIT)]

    def notify_stop(self, signal_number: int) -> None:
        """Tell every other rank that this rank got stop signal ``signal_number``."""
        for rank in range(self.size):
            if rank != self.rank:
                self._send(rank, _STOP, signal_number, 0.0, "")

    def stop_notices(self) -> list[tuple[int, int]]:
        """(rank, signal number) of the stop notices received since the last call."""
        return [(rank, number) for rank, number, _, _, _ in self._receive_all(_STOP)]

    def _send(self, dest: int, tag: int, number: int, value: float, text: str, flags: int = 0) -> None:
        with self._send_lock:
            self._send_locked(dest, tag, number, value, text, flags)

    def _send_locked(self, dest: int, tag: int, number: int, value: float, text: str, flags: int) -> None:
        slot = self._next
        if self._requests[slot] is not None and not self._requests[slot].Test():
            # 32 sends ago and still not out: the link to that rank is cut or far behind. Waiting here would
            # block the stall watchdog's thread, the one that must end the job then (seen with a cut link
            # during a long reduction); the message is dropped instead (a wait is reported again each look).
            return
        self._next = (slot + 1) % _RING
        buffer = self._buffers[slot]
        buffer[:16] = np.frombuffer(np.int64(number).tobytes() + np.float64(value).tobytes(), np.uint8)
        buffer[16] = flags
        encoded = text.encode("utf-8")[:_MESSAGE_BYTES - _TEXT - 1]
        buffer[_TEXT:_TEXT + len(encoded)] = np.frombuffer(encoded, np.uint8)
        buffer[_TEXT + len(encoded)] = 0
        self._requests[slot] = self._comm.Isend(buffer, dest, tag)

    def _receive_all(self, tag: int) -> list[tuple[int, int, float, int, str]]:
        """(source, number, value, flags, text) of every message with ``tag`` that has arrived."""
        # own buffers per call: rank 0's watchdog thread and its main thread may both receive
        received, inbox, status = [], np.zeros(_MESSAGE_BYTES, np.uint8), self._mpi.Status()
        while self._comm.Iprobe(self._mpi.ANY_SOURCE, tag, status):
            source = status.Get_source()
            self._comm.Recv(inbox, source, tag)
            number, value = int(inbox[:8].view(np.int64)[0]), float(inbox[8:16].view(np.float64)[0])
            text = bytes(inbox[_TEXT:]).split(b"\0", 1)[0].decode("utf-8", "replace")
            received.append((source, number, value, int(inbox[16]), text))
        return received
