"""Stop requests from the scheduler: SIGUSR1, SIGUSR2 and SIGTERM are recorded, not acted on.

SLURM's ``--signal`` and SGE's ``-notify`` warn a job with one of these signals before they kill it. The
handlers installed here only note which signal came first and when; the training loop asks
``requested()`` at each step boundary, where all ranks agree to save a checkpoint and end with
``RESUMABLE_EXIT_CODE``. Nothing else happens in the handler (no I/O, no locks, no allocation beyond a
tuple), so a signal that lands in the middle of a write or a collective cannot corrupt anything.

A SIGTERM after a stop request still kills: a user who sends SIGTERM again (``kill`` twice, ``scancel``
twice), or a scheduler whose kill comes while the process still has not stopped after its warning
signal, wants the process gone now, and it ends with SIGTERM's default action. Only a SIGTERM that
comes ``REPEAT_GRACE_SECONDS`` or more after the first request counts: a scheduler often delivers one
stop twice within milliseconds (SLURM signals every process of the job while a launcher or
``supervise`` also forwards the signal it got), and that must not cost the checkpoint. Repeated
SIGUSR1/SIGUSR2 are ignored.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Iterator

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
REPEAT_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class StopRequest:
    signal: str  # "SIGUSR1", "SIGUSR2" or "SIGTERM"
    time: float  # time.time() when the first stop signal arrived
    monotonic: float


_request: StopRequest | None = None
_previous: dict[int, object] = {}  # signal -> handler before install(); empty when not installed


def _handle(signum: int, frame) -> None:
    global _request
    if _request is None:
        _request = StopRequest(signal.Signals(signum).name, time.time(), time.monotonic())
    elif signum == signal.SIGTERM and time.monotonic() - _request.monotonic >= REPEAT_GRACE_SECONDS:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install() -> None:
    """Record SIGUSR1, SIGUSR2 and SIGTERM from now on (main thread only; a second call is a no-op)."""
    if _previous:
        return
    for signum in STOP_SIGNALS:
        _previous[signum] = signal.signal(signum, _handle)


def uninstall() -> None:
    """Put back the handlers that were there before ``install()`` and forget any request."""
    global _request
    for signum, handler in _previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    _previous.clear()
    _request = None


def requested() -> str | None:
    """The name of the first stop signal received since ``install()`` (``"SIGUSR1"``...), or None."""
    return _request.signal if _request is not None else None


def request() -> StopRequest | None:
    """The first stop request with its time, or None."""
    return _request


def requested_number() -> int:
    """The number of the first stop signal received since ``install()``, or 0."""
    return signal.Signals[_request.signal].value if _request is not None else 0


@contextlib.contextmanager
def installed() -> Iterator[None]:
    install()
    try:
        yield
    finally:
        uninstall()
