"""Ending the whole job when one rank fails, instead of leaving the others waiting in a collective.

- An exception nobody caught (main thread, or any thread in a multi-rank job): the failing rank prints
  it once (one paragraph for an ``EngineError``, the traceback otherwise) and aborts the MPI job.
- ``fail(exc)``: the same, for a top level that catches errors itself (``rnn.py``).
- A rank killed outright (SIGKILL, out of memory): ``mpirun`` notices and ends the job on its own.
- A rank that stopped answering: the communicator's ``Watchdog`` (``watchdog.py``) names it and aborts
  the job when the others have waited ``distributed_stall_timeout`` seconds for it (on by default).
- An abort that cannot reach ``mpirun`` (the network to its host is cut): a watcher process kills the rank
  ``backend.ABORT_GRACE`` seconds after it called MPI_Abort (``backend.exit_after``).

An ``EngineError`` with ``agreed = True`` is known to every rank already (it came through the step
signal or a collective check), so every rank exits on its own and nothing needs aborting.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import NoReturn

from engine.runtime import process
from engine.runtime.errors import QUIET_RANK_EXIT_DELAY, EngineError


def install_failure_handler() -> None:
    """Route uncaught exceptions (of any thread, in a multi-rank job) to ``fail``."""
    sys.excepthook = _excepthook
    if process.size() > 1:  # a crashed loader thread would otherwise leave this rank, and all others, waiting
        threading.excepthook = lambda args: _excepthook(args.exc_type, args.exc_value, args.exc_traceback)


def format_error(exc: BaseException, show_traceback: bool | None = None) -> str:
    """``[rank K] prog: error: <message>`` for an EngineError, else the traceback; every line prefixed."""
    if show_traceback is None:
        show_traceback = not isinstance(exc, EngineError)
    if show_traceback:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    else:
        text = f"{os.path.basename(sys.argv[0]) or 'python'}: error: {exc}"
    return process.prefix_lines(text)


def fail(exc: BaseException, show_traceback: bool | None = None) -> NoReturn:
    """Print ``exc`` once (unless it is ``quiet``), then end this rank, or the whole job if the other
    ranks do not know about the failure (not ``agreed``)."""
    exit_code = getattr(exc, "exit_code", 1)
    message = "" if getattr(exc, "quiet", False) else format_error(exc, show_traceback)
    comm = process.communicator()
    if comm is not None and comm.size > 1 and not getattr(exc, "agreed", False):
        comm.abort(message, exit_code)
    if message:
        print(message, file=sys.stderr, flush=True)
    elif comm is not None and comm.size > 1:
        time.sleep(QUIET_RANK_EXIT_DELAY)
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
