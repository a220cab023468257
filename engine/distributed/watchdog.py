"""Stall detection: a rank that stopped answering ends the job with a message naming it, never a hang.

A ``Watchdog`` belongs to one communicator. The backend enters ``collective(name)`` around every collective
it runs (``enter``/``leave`` for the Horovod reductions inside a ``tf.function``); protocol code wraps its
collectives in ``guard(what)`` to name them ("step signal"). Each rank counts the collectives it enters;
entering one only stores a tuple (well under a microsecond).

Every rank's watchdog thread looks a few times per second. A rank other than 0 that has waited in
collective #k for more than one look tells rank 0 so, "rank r waits at #k (name) for s seconds", with one
tiny non-blocking message per look over a ``WaitChannel`` (``side_channel.py``); nothing is sent while
collectives finish quickly. Rank 0's watchdog thread collects these reports and knows its own main
thread's state. When some rank has waited at #k for ``warning`` seconds (``distributed_stall_warning``) it
logs one warning naming the ranks that are not waiting there; after ``timeout`` seconds
(``distributed_stall_timeout``) it ends the job with one message naming them and the collective. It names
rank 0 itself when the others wait for it, since it is a thread of its own. A rank 0 frozen as a whole
(stopped, or stuck in a call that holds Python's lock) cannot report; every other rank therefore also
ends the job itself after waiting ``timeout + grace`` in one guard. A single process (no channel) only has
that local deadline, at ``timeout``.

Checkpoint windows: while rank 0 writes a checkpoint, the other ranks wait for it in a collective (the
gather of their parts, then the agreement on whether the save failed), which a large checkpoint on slow
storage can keep waiting longer than ``timeout``. Every rank runs the save code at the same agreed step
boundary and marks it with ``checkpoint_window()``, so each rank knows by itself that it is in a window:
its waits inside it carry ``saving`` (told to rank 0 with each report), rank 0 knows that it is writing,
and such waits end the job only after ``limits.checkpoint`` (``distributed_checkpoint_timeout``) instead
of ``timeout``: on rank 0 when the waiting ranks wait inside the window and rank 0, where it is the one
they wait for, is writing; on the other ranks for their own waits inside it (plus the grace).

Slow links: between hosts (``bytes_moved``, ``link_progress.py``) a wait counts as stalled only from the last
look at which the collectives' own connections moved data (never the process's other TCP traffic), on
every rank and in every report, so a large reduction over a slow link is never ended while it moves, and a
cut link (nothing moves) is ended as before. Without a byte count (one host, a transport the kernel's TCP
does not carry, or connections that cannot be told apart) waits count from their start.

Without a channel in a multi-rank job (``local_only``: MPI was initialised below ``THREAD_MULTIPLE``, so the
watchdog thread must not call MPI), nothing is reported and nobody names missing ranks: every rank warns
and ends the job by itself after its own wait, naming the collective, and ends through ``abort`` which
then must not call MPI either (``mpi_backend.exit_without_mpi``).
"""
from __future__ import annotations

import atexit
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, NamedTuple, Protocol

from engine.runtime import log, process

# Why a watchdog without a channel in a multi-rank job cannot name ranks (see the module docstring).
LOCAL_ONLY_WHY = "MPI runs below THREAD_MULTIPLE, so the watchdog thread does not call MPI"


@dataclass(frozen=True)
class StallLimits:
    """Seconds a rank may wait in a collective before the warning, and before the job ends; ``checkpoint``:
    before the job ends while a checkpoint is saved (a checkpoint window). None: never."""

    warning: float | None = None
    timeout: float | None = None
    checkpoint: float | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.warning or self.timeout or self.checkpoint)

    @property
    def grace(self) -> float:
        """How much later than rank 0's watchdog the other ranks end the job on their own."""
        return self.grace_for(self.timeout)

    @staticmethod
    def grace_for(timeout: float | None) -> float:
        return 10.0 + 0.1 * (timeout or 0.0)

    def timeout_for(self, saving: bool) -> float | None:
        """The wait that ends the job: ``checkpoint`` inside a checkpoint window, else ``timeout``."""
        return self.checkpoint if saving else self.timeout

    @staticmethod
    def key(saving: bool) -> str:
        """The config key of ``timeout_for(saving)``, for messages."""
        return "distributed_checkpoint_timeout" if saving else "distributed_stall_timeout"


class WaitChannel(Protocol):
    def report_wait(self, count: int, waited: float, what: str, saving: bool) -> None:
        """Tell rank 0 that this rank has waited ``waited`` seconds in collective ``count`` (inside a
        checkpoint window: ``saving``)."""

    def collect_waits(self) -> list[tuple[int, int, float, str, bool]]:
        """On rank 0: the (rank, count, waited, what, saving) reports received since the last call."""


class _Wait(NamedTuple):
    what: str
    entered: float  # monotonic
    count: int  # the collective's number; the previous collective's for a guard around none
    saving: bool = False  # entered inside a checkpoint window


class Watchdog:
    def __init__(self, limits: StallLimits, abort: Callable[[str, int], object], *, rank: int = 0,
                 size: int = 1, channel: WaitChannel | None = None,
                 clock: Callable[[], float] = time.monotonic, start: bool = True,
                 bytes_moved: Callable[[], int | None] | None = None) -> None:
        self.limits = limits
        # Network progress (link_progress.py): a wait counts as stalled only since the last look at which
        # this process moved more than the side channel's own chatter (64-byte reports, one a look from
        # each waiting rank, with MPI's headers), so a slow link that carries a large reduction is no hang.
        self._bytes_moved = bytes_moved
        self.progress_bytes = 16384 + 256 * size
        # the wait last sampled, its byte count, when bytes last moved, and when it was sampled
        self._moved: tuple[_Wait | None, int | None, float, float] = (None, None, 0.0, float("-inf"))
        self.rank, self.size = rank, size
        self._abort = abort
        self._channel = channel
        self._clock = clock
        self._monitor = channel is not None and rank == 0 and size > 1
        self._graced = channel is not None and rank != 0  # ends after rank 0 would have
        self.local_only = channel is None and size > 1
        self._count = 0
        self._current: _Wait | None = None  # set and read atomically (one attribute)
        self._saving = False  # inside a checkpoint window (one attribute, read by the watchdog thread)
        self._warned_locally: _Wait | None = None  # local_only: the wait already warned about
        # rank 0: rank -> (count, waited, what, saving, when received) of its newest report
        self._reports: dict[int, tuple[int, float, str, bool, float]] = {}
        self._warned_at = 0  # the collective already warned about
        self._stopped = threading.Event()
        self.poll = min([1.0] + [t / 4 for t in (limits.warning, limits.timeout, limits.checkpoint) if t])
        self._thread: threading.Thread | None = None
        if start and limits.enabled:
            self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)
            self._thread.start()
            atexit.register(self.stop)  # before MPI is finalised (atexit runs the newest first)

    # ----- the main thread's side -----
    def guard(self, what: str) -> ContextManager[None]:
        """A block that waits for the other ranks; names the collectives inside it."""
        return _Scope(self, what, counted=False)

    def collective(self, name: str) -> ContextManager[None]:
        """One collective call: counted, and guarded under its name."""
        return _Scope(self, name, counted=True)

    @contextlib.contextmanager
    def checkpoint_window(self) -> Iterator[None]:
        """Around saving a checkpoint, on every rank: waits inside end the job after ``limits.checkpoint``.
        The block itself is no wait: rank 0 writing in it is working, not waiting for anyone."""
        outer, self._saving = self._saving, True
        try:
            yield
        finally:
            self._saving = outer

    def enter(self, name: str, counted: bool = True) -> _Wait | None:
        """Start waiting in a collective (counted) or a named block; returns what ``leave`` needs."""
        if counted:
            self._count += 1
        outer = self._current
        if outer is None:
            self._current = _Wait(name, self._clock(), self._count, self._saving)
        else:
            count = self._count if counted else outer.count
            self._current = _Wait(f"{outer.what} ({name})", outer.entered, count, outer.saving)
        return outer

    def leave(self, outer: _Wait | None = None) -> None:
        self._current = outer

    def stop(self) -> None:
        """End the watchdog thread, and wait for it: it must not be inside an MPI call when MPI ends."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    # ----- the watchdog thread -----
    def _run(self) -> None:
        while not self._stopped.wait(self.poll):
            self.check()

    def stalled(self, now: float, current: _Wait | None) -> float:
        """How long ``current`` has waited without network progress (without ``bytes_moved``: how long it
        has waited). Samples the byte count once a look, from the first look of a long wait on."""
        if current is None:
            return 0.0
        waited = now - current.entered
        if self._bytes_moved is None or waited < self.poll:
            return waited
        wait, before, moved_at, sampled_at = self._moved
        if wait is not current:
            if now - sampled_at <= 1.5 * self.poll:
                # The look before sampled another wait, such as the collective inside the guard that is
                # the wait now: the link was watched without a gap, and its history holds.
                moved_at = max(moved_at, current.entered)
            else:  # the first look of this wait: the count is its baseline
                before, moved_at = None, current.entered
        count = self._bytes_moved()
        if count is not None and before is not None and count - before > self.progress_bytes:
            moved_at = now
        self._moved = (current, count if count is not None else before, moved_at, now)
        return now - moved_at

    def check(self) -> None:
        """One look: report a long wait to rank 0, or (rank 0) warn or end the job."""
        now = self._clock()
        current = self._current
        waited = self.stalled(now, current)
        if self._monitor:
            if self._check_ranks(now, current, waited):
                return  # a rank is missing: named there, not by the local deadline below
        elif current is not None and self._channel is not None and now - current.entered >= self.poll:
            self._channel.report_wait(current.count, waited, current.what, current.saving)
        if current is None:
            return
        timeout = self.limits.timeout_for(current.saving)
        deadline = timeout + self.limits.grace_for(timeout) if timeout and self._graced else timeout
        if deadline and waited > deadline:
            self._end(self._deadline_message(current, deadline))
        elif self.local_only:
            self._warn_locally(current, waited)

    def _check_ranks(self, now: float, own: _Wait | None, own_waited: float = 0.0) -> bool:
        """Rank 0: warn about, or end the job for, ranks that are not waiting where the others have waited
        longest. False when no rank waits, or every rank waits in the same collective."""
        for rank, count, waited, what, saving in self._channel.collect_waits():
            self._reports[rank] = (count, waited, what, saving, now)
        waits = {rank: (count, waited + now - seen, what, saving)
                 for rank, (count, waited, what, saving, seen) in self._reports.items()
                 if now - seen <= 3 * self.poll}  # older: no longer waiting
        if own is not None:
            waits[0] = (own.count, own_waited, own.what, own.saving)
        if not waits:
            return False
        front = max(wait[0] for wait in waits.values())
        waiting = sorted(r for r, wait in waits.items() if wait[0] == front)
        # Rank 0 is not missing from a collective it has entered already: a report of a rank that waited
        # there for it can still be here for a few looks after both left it (seen right after a long
        # checkpoint write, whose window then is over), and must not count as a wait for rank 0.
        passed = {0} if self._count >= front else set()
        missing = [r for r in range(self.size) if r not in waiting and r not in passed]
        if not missing:
            return False
        longest = max(waits[r][1] for r in waiting)
        what = waits[waiting[0]][2]
        # Waiting for a checkpoint to be written: the ranks wait inside the window, and rank 0, when they
        # wait for it, is writing (not still training a step before the save, which gets no extension).
        saving = all(waits[r][3] for r in waiting) and (0 not in missing or self._saving)
        timeout, key = self.limits.timeout_for(saving), self.limits.key(saving)
        if timeout and longest >= timeout:
            why = (f"{_verb(missing, 'it', 'they')} stopped answering or {_verb(missing, 'is', 'are')} far "
                   "behind")
            if saving:
                why = ("a checkpoint is being saved, and its write is stuck or slower than that (raise "
                       f"{key} for large checkpoints on slow storage), or {_ranks(missing)} stopped "
                       "answering")
            self._end(f"error: {_ranks(missing)} did not reach collective #{front} '{what}' within "
                      f"{timeout:g} s ({key}), where {_ranks(waiting)} {_verb(waiting, 'waits', 'wait')}: "
                      f"{why}. Ending the MPI job.")
        elif self.limits.warning and longest >= self.limits.warning and self._warned_at != front:
            self._warned_at = front
            end = f"{timeout:g} s" if timeout else "None (never)"
            log.warning(f"stall: {_ranks(missing)} {_verb(missing, 'has', 'have')} not reached collective "
                        f"#{front} '{what}' after {longest:.0f} s; {_ranks(waiting)} "
                        f"{_verb(waiting, 'waits', 'wait')} there (distributed_stall_warning). The job ends "
                        f"after {key} = {end}{' (a checkpoint is being saved)' if saving else ''}.")
        return True

    def _warn_locally(self, current: _Wait, waited: float) -> None:
        """``local_only``: the warning of ``distributed_stall_warning``, for this rank's own wait."""
        if not self.limits.warning or waited < self.limits.warning or self._warned_locally == current:
            return
        self._warned_locally = current
        timeout = self.limits.timeout_for(current.saving)
        end = f"{timeout:g} s" if timeout else "None (never)"
        log.warning(f"stall: rank {self.rank} waits in collective #{current.count} '{current.what}' for "
                    f"{waited:.0f} s (distributed_stall_warning); the ranks not there yet cannot be named "
                    f"({LOCAL_ONLY_WHY}). The job ends after {self.limits.key(current.saving)} = {end}.")

    def _deadline_message(self, wait: _Wait, deadline: float) -> str:
        timeout, key = self.limits.timeout_for(wait.saving), self.limits.key(wait.saving)
        if self._graced:
            return (f"error: '{wait.what}' did not complete within {deadline:g} s "
                    f"({key} + {self.limits.grace_for(timeout):g} s), and rank 0, which names stalled "
                    "ranks, did not end the job: rank 0 itself is probably not answering. Ending the MPI "
                    "job.")
        if self._monitor and self._bytes_moved is not None:
            return (f"error: '{wait.what}' did not complete within {timeout:g} s ({key}) although every "
                    "rank entered it, and nothing moved over the network in that time: the link between "
                    "the hosts is down, a rank is stuck inside it, or the ranks called different "
                    "collectives. Ending the MPI job.")
        if self._monitor:
            return (f"error: '{wait.what}' did not complete within {timeout:g} s "
                    f"({key}) although every rank entered it: a rank is stuck inside it, "
                    "or the ranks called different collectives. Ending the MPI job.")
        if self.local_only:
            return (f"error: collective #{wait.count} '{wait.what}' did not complete within {timeout:g} s "
                    f"({key}); the ranks that did not arrive cannot be named ({LOCAL_ONLY_WHY}). Ending the "
                    "MPI job.")
        return (f"error: '{wait.what}' did not complete within {timeout:g} s ({key}). Ending the job.")

    def _end(self, message: str) -> None:
        self._stopped.set()
        self._abort(process.prefix_lines(message), 1)


class _Scope:
    """``with``-block of ``guard``/``collective``: a plain class, 3x cheaper than a generator context."""

    __slots__ = ("_dog", "_name", "_counted", "_outer")

    def __init__(self, dog: Watchdog, name: str, counted: bool) -> None:
        self._dog, self._name, self._counted = dog, name, counted

    def __enter__(self) -> None:
        self._outer = self._dog.enter(self._name, self._counted)

    def __exit__(self, *exc_info: object) -> None:
        self._dog.leave(self._outer)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _verb(ranks: list[int], one: str, many: str) -> str:
    return one if len(ranks) == 1 else many
