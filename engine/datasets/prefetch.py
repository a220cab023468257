"""Computing sequences ahead of the training step, in a background thread.

A dataset that computes its sequences (``OggZipDataset``: decode the audio, extract the features) learns
from ``Dataset.will_read`` which sequences this process's batches will read, in order, and hands them to
a ``SequencePrefetcher``. Its thread computes them one after another, at most ``window`` sequences ahead
of the reader, so memory stays bounded by the window whatever the corpus size. The reader takes each
result once (``take``); a sequence the plan does not hold, or one it has already passed, is computed by
the caller as before. Results are the same arrays the direct path computes (the worker calls the same
function; only features without random draws are prefetched), in any reading order. When this epoch's
sequences are done, the worker computes the first ones of the next epoch (``then``), which the next
epoch's worker starts with (``done``), so an epoch's first step does not wait for its features either.

One thread, not a pool: librosa's feature functions hold the GIL for most of their time, so a second
thread gains nothing (measured: 100 sequences in 0.47 s on one thread, 0.49 s on two), and on a machine
whose cores run the ranks' steps a process pool only moves the same work elsewhere. What the thread buys
is that the work happens while the step waits on its collectives or its compute kernels, which release
the GIL.

An error of the worker (a file that cannot be decoded) is kept with its sequence and raised when the
reader takes that sequence: the same ``DataError`` object, naming the file, on the reader's thread.

``ENGINE_FEATURE_PREFETCH=0`` switches the worker off (for measuring the difference:
``benchmarks/bench_oggzip_data.py``).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable

import numpy as np

from engine.runtime import log

DEFAULT_WINDOW = 64  # sequences computed ahead of the reader (features: 64 * frames * dim * 4 bytes)


def prefetch_enabled() -> bool:
    return os.environ.get("ENGINE_FEATURE_PREFETCH", "1").strip().lower() not in ("0", "false", "no", "off")


class SequencePrefetcher:
    """Runs ``compute(idx)`` for ``indices`` (first occurrences, in order) in a background thread."""

    def __init__(self, compute: Callable[[int], Any], indices: Iterable[int], *, then: Iterable[int] = (),
                 done: dict[int, Any] | None = None, window: int = DEFAULT_WINDOW,
                 name: str = "sequence-prefetch") -> None:
        """``then``: computed after ``indices``, for the next reader (``close`` returns them; at most
        ``window``, so memory holds at most twice ``window`` results); ``done``: results computed before
        (by the previous reader's worker), not computed again."""
        self._compute = compute
        self._plan = list(dict.fromkeys(int(i) for i in indices))  # a sequence read again: once
        self._position = {idx: pos for pos, idx in enumerate(self._plan)}
        self.window = max(1, window)
        self._then = list(dict.fromkeys(int(i) for i in then))[:self.window]
        self._then_set = set(self._then)
        self._done = {idx: value for idx, value in (done or {}).items() if idx in self._position}
        self._ready: dict[int, tuple[bool, Any]] = {}  # idx -> (ok, array or the exception)
        self._extra: dict[int, Any] = {}  # results for ``then``
        self._next = 0  # plan position the worker computes next
        self._passed = 0  # plan positions before this one the reader has gone past
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                # ``then``'s results count once the plan is done (before, they are read ones, kept)
                while not self._stop and len(self._ready) + (
                        len(self._extra) if self._next >= len(self._plan) else 0) >= self.window:
                    self._cond.wait()
                while self._next >= len(self._plan) and self._next < len(self._plan) + len(self._then) \
                        and self._has(self._then[self._next - len(self._plan)]):
                    self._next += 1
                if self._stop or self._next >= len(self._plan) + len(self._then):
                    return
                planned = self._next < len(self._plan)
                idx = self._plan[self._next] if planned else self._then[self._next - len(self._plan)]
                done = self._done.pop(idx, None)
            try:
                result = (True, done if done is not None else self._compute(idx))
            except Exception as exc:  # raised on the reader's thread when it takes this sequence
                result = (False, exc)
            with self._cond:
                self._next += 1
                if not planned:
                    if result[0]:  # an error is met again, and raised, when the next reader reads it
                        self._extra[idx] = result[1]
                elif self._position[idx] >= self._passed:  # else the reader went past it meanwhile
                    self._ready[idx] = result
                self._cond.notify_all()

    def _has(self, idx: int) -> bool:
        """Computed already: kept for the next reader, or waiting to be taken (and then kept)."""
        return idx in self._extra or idx in self._ready

    def take(self, idx: int) -> np.ndarray | None:
        """The computed sequence ``idx`` (waiting for it if the worker is on its way), or None: not
        planned, already taken, or the prefetcher is closed; the caller computes it then."""
        pos = self._position.get(int(idx))
        if pos is None:
            return None
        with self._cond:
            if pos < self._passed and idx not in self._ready:
                return None
            if pos > self._passed:  # the reader skipped planned sequences: free their room
                for skipped in self._plan[self._passed:pos]:
                    self._ready.pop(skipped, None)
                self._passed = pos
                self._cond.notify_all()
            while idx not in self._ready and not self._stop and self._next <= pos:
                self._cond.wait()
            if idx not in self._ready:
                return None
            ok, value = self._ready.pop(idx)
            if ok and idx in self._then_set:  # read now, and needed again next: kept, not computed twice
                self._extra[idx] = value
            self._passed = max(self._passed, pos + 1)
            self._cond.notify_all()
        if not ok:
            raise value
        return value

    def close(self) -> dict[int, Any]:
        """Stop the worker; returns what it computed that was not taken (by index), for the next one."""
        with self._cond:
            self._stop = True
            left = {idx: value for idx, (ok, value) in self._ready.items() if ok}
            left.update(self._extra)
            self._ready.clear()
            self._extra.clear()
            self._done.clear()
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                log.warning(f"{self._thread.name}: the worker did not stop within 60 s (a read is hanging?).")
        return left


_warmed: set[str] = set()


def warm_up(compute: Callable[[], Any], key: str, name: str = "feature-warm-up") -> None:
    """Run ``compute`` once per ``key`` and process in a background thread, ignoring its outcome: librosa
    compiles its numba kernels on first use (about 3 s of CPU), which otherwise stalls the first step."""
    if key in _warmed:
        return
    _warmed.add(key)

    def run() -> None:
        try:
            compute()
        except Exception as exc:  # a real problem shows on real data, with its file's name
            log.debug(f"{name}: {type(exc).__name__}: {exc}")

    threading.Thread(target=run, name=name, daemon=True).start()


class BackgroundPass:
    """Runs ``jobs`` (calls without arguments) one after another in a background thread, until done or
    ``stop``: for work whose results the dataset keeps itself (the audio lengths an epoch's plan needs). A
    failing job is skipped: the dataset's own pass meets the same problem and raises it with its context."""

    def __init__(self, jobs: Iterable[Callable[[], Any]], name: str) -> None:
        self._jobs, self._stopped = list(jobs), False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        for job in self._jobs:
            if self._stopped:
                return
            try:
                job()
            except Exception:  # noqa: BLE001 -- the dataset's own pass raises it with the sequence's name
                pass

    def stop(self) -> None:
        self._stopped = True
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
