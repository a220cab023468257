"""Ending the whole job when one rank fails, instead of leaving the others waiting in a collective.

- An exception nobody caught (main thread, or any thread in a multi-rank job): the failing rank prints
  it once (one paragraph for an ``EngineError``, the traceback otherwise) and aborts the MPI job.
- ``fail(exc)``: the same, for a top level that catches errors itself (``rnn.py``).
- A rank killed outright (SIGKILL, out of memory): ``mpirun`` notices and ends the job on its own.
- A rank that stopped answering: ``Watchdog`` aborts when a guarded collective is not done within
  ``distributed_stall_timeout`` seconds.

An ``EngineError`` with ``agreed = True`` is known to every rank already (it came through the step
signal or a collective check), so every rank exits on its own and nothing needs aborting.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from typing import Iterator, NoReturn

from engine.distributed.backend import Communicator
from engine.errors import EngineError


class _State:
    comm: Communicator | None = None


_state = _State()


def install_failure_handler(comm: Communicator, stall_timeout: float | None = None) -> None:
    """Route uncaught exceptions to ``fail`` and, with a stall timeout, guard ``comm``'s collectives."""
    _state.comm = comm
    sys.excepthook = _excepthook
    if comm.size > 1:  # a crashed loader thread would otherwise leave this rank, and all others, waiting
        threading.excepthook = lambda args: _excepthook(args.exc_type, args.exc_value, args.exc_traceback)
    if comm.watchdog is not None:
        comm.watchdog.stop()
    comm.watchdog = Watchdog(comm, stall_timeout) if stall_timeout else None


def format_error(exc: BaseException, show_traceback: bool | None = None) -> str:
    """``[rank K] prog: error: <message>`` for an EngineError, else the traceback; every line prefixed."""
    comm = _state.comm
    prefix = f"[rank {comm.rank}] " if comm is not None and comm.size > 1 else ""
    if show_traceback is None:
        show_traceback = not isinstance(exc, EngineError)
    if show_traceback:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    else:
        text = f"{os.path.basename(sys.argv[0]) or 'python'}: error: {exc}"
    return "\n".join(prefix + line for line in text.splitlines())


def fail(exc: BaseException, show_traceback: bool | None = None) -> NoReturn:
    """Print ``exc`` once (unless it is ``quiet``), then end this rank, or the whole job if the other
    ranks do not know about the failure (not ``agreed``)."""
    exit_code = getattr(exc, "exit_code", 1)
    message = "" if getattr(exc, "quiet", False) else format_error(exc, show_traceback)
    comm = _state.comm
    if comm is not None and comm.size > 1 and not getattr(exc, "agreed", False):
        comm.abort(message, exit_code)
    if message:
        print(message, file=sys.stderr, flush=True)
    sys.exit(exit_code)


def _excepthook(exc_type, exc, tb) -> None:
    if issubclass(exc_type, KeyboardInterrupt) or exc is None:
        sys.__excepthook__(exc_type, exc, tb)
        return
    if exc.__traceback__ is None:
        exc = exc.with_traceback(tb)
    try:
        fail(exc)
    except SystemExit:  # single process or agreed error: Python exits with status 1 after the hook
        pass


class Watchdog:
    """A daemon thread that aborts the job when a guarded block runs past ``timeout`` seconds.

    Entering a guard only stores a deadline (no locks, no thread start), so it costs about a
    microsecond per collective; the thread checks the deadline a few times per timeout.
    """

    def __init__(self, comm: Communicator, timeout: float) -> None:
        self.comm, self.timeout = comm, float(timeout)
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
                what = current[0]
                self.comm.abort(
                    f"[rank {self.comm.rank}] error: '{what}' did not complete within {self.timeout:g} s "
                    "(distributed_stall_timeout): another rank stopped answering or is far behind. "
                    "Ending the MPI job.", exit_code=1)
