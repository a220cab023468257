"""Ending the job when a collective waits too long: a rank stopped answering, or is far behind.

A ``Watchdog`` belongs to one communicator (``Communicator.stall_guard`` enters its guard around every
collective it runs from Python). Entering a guard only stores a deadline (no lock, no thread start),
so it costs about a microsecond per collective; a daemon thread checks the deadline a few times per
timeout and aborts the job through the communicator when it has passed.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from engine import process


class Watchdog:
    def __init__(self, abort: Callable[[str, int], object], timeout: float) -> None:
        self.timeout = float(timeout)
        self._abort = abort
        self._current: tuple[str, float] | None = None  # (what, deadline): one attribute, set atomically
        self._stopped = threading.Event()
        self._poll = min(1.0, self.timeout / 4)
        threading.Thread(target=self._run, name="stall-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        outer = self._current
        if outer is not None:
            what = f"{outer[0]} ({what})"
        self._current = (what, time.monotonic() + self.timeout)
        try:
            yield
        finally:
            self._current = outer

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._poll):
            current = self._current
            if current is not None and time.monotonic() > current[1]:
                self._abort(process.prefix_lines(
                    f"error: '{current[0]}' did not complete within {self.timeout:g} s "
                    "(distributed_stall_timeout): another rank stopped answering or is far behind. "
                    "Ending the MPI job."), 1)
