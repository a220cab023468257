"""The ``mpi`` backend's communication thread: reductions that run while the caller goes on computing.

Why a thread of our own (as Horovod has): a ``tf.numpy_function`` that blocks in MPI occupies one of
TensorFlow's inter-op threads, and a rank on one core has only one, so nothing would compute meanwhile;
and Open MPI's TCP transport moves bytes only inside MPI calls, so a non-blocking ``MPI_Iallreduce``
started from the graph would not progress while Python is elsewhere. Here ``start`` copies the arrays
into fused, aligned buffers (``fusion.FusionBuffers``) and queues them; the thread reduces the queued
jobs one after another with the same segmented, in-place ``Allreduce`` as the blocking path, on a
duplicate of the communicator, so its calls never interleave with the main thread's collectives on
``COMM_WORLD``. mpi4py releases Python's lock inside MPI, so TensorFlow and Python go on meanwhile.

Every rank must start the same reductions in the same order (what stateful ``numpy_function`` calls in
a ``tf.function`` guarantee). An error in the thread is kept and raised by ``wait``; the thread goes on.
The thread's waits are announced to the stall watchdog like any collective (``collective``).
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, ContextManager, Sequence

import numpy as np

from engine.distributed.backend import ReductionHandle
from engine.distributed.fusion import SEGMENT_BYTES, FusionBuffers
from engine.distributed.ring import NUMPY_OPS, RING_SEGMENT_BYTES, Add, ring_allreduce
from engine.report import timeline
from engine.runtime.errors import DistributedError


class Reduction(ReductionHandle):
    """One queued reduction; ``wait`` returns its results (views of its fused buffers)."""

    def __init__(self, buffers: list[np.ndarray], results: list[np.ndarray], op: str, label: str,
                 watched_as: str | None, mpi_op: Any = None, add: Add | None = None) -> None:
        self.buffers, self.results, self.op, self.label = buffers, results, op, label
        self.watched_as = watched_as  # the stall watchdog's name for it
        self.started = self.finished = 0.0  # timeline.now() of the thread's start and end of the work
        self.waited_seconds = 0.0  # how long ``wait`` blocked the caller
        self.error: BaseException | None = None
        self.mpi_op = mpi_op  # a user-defined op (a wire format's sum) instead of ``op``'s own
        self.add = add  # its numpy form, for the ring
        self._done = threading.Event()

    @property
    def reduce_seconds(self) -> float:
        """How long the reduction itself took in the thread (0 until it is done)."""
        return max(0.0, self.finished - self.started)

    def hidden_seconds(self, until: float) -> float:
        """The part of the reduction that ran before ``until`` (a ``timeline.now()`` reading): the part
        hidden behind the caller's work when the caller started waiting at ``until``."""
        return max(0.0, min(self.finished, until) - self.started)

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> list[np.ndarray]:
        start = timeline.now()
        self._done.wait()
        self.waited_seconds += timeline.now() - start
        if self.error is not None:
            raise DistributedError(f"the {self.label} failed in the communication thread: "
                                   f"{type(self.error).__name__}: {self.error}") from self.error
        return self.results


class JointReduction(ReductionHandle):
    """Several queued reductions seen as one (arrays reduced with different MPI ops, e.g. a wire format's
    sum beside float32's): ``wait`` puts their results back in the caller's order, ``finish`` (if given)
    turns each result into what the caller gets."""

    def __init__(self, parts: Sequence[tuple[Sequence[int], Reduction]], count: int,
                 finish: Callable[[int, np.ndarray], np.ndarray] | None = None) -> None:
        self.parts, self.count, self.finish = list(parts), count, finish

    @property
    def reduce_seconds(self) -> float:  # type: ignore[override]
        return sum(job.reduce_seconds for _, job in self.parts)

    @property
    def waited_seconds(self) -> float:  # type: ignore[override]
        return sum(job.waited_seconds for _, job in self.parts)

    def hidden_seconds(self, until: float) -> float:
        return sum(job.hidden_seconds(until) for _, job in self.parts)

    def done(self) -> bool:
        return all(job.done() for _, job in self.parts)

    def wait(self) -> list[np.ndarray]:
        results: list[np.ndarray] = [None] * self.count  # type: ignore[list-item]
        for indices, job in self.parts:
            for i, result in zip(indices, job.wait()):
                results[i] = self.finish(i, result) if self.finish else result
        return results


class WatchedReduction(ReductionHandle):
    """A reduction the caller goes on beside, making collectives of its own meanwhile (param mode's
    overlapped average): the stall watchdog follows one wait at a time and counts collectives in the order
    they start, so the thread does not announce this one; the caller's ``wait`` is the watched wait,
    at the same point of every rank's sequence of collectives."""

    def __init__(self, inner: ReductionHandle, guard: Callable[[], ContextManager[None]]) -> None:
        self.inner, self.guard = inner, guard

    @property
    def reduce_seconds(self) -> float:  # type: ignore[override]
        return self.inner.reduce_seconds

    @property
    def waited_seconds(self) -> float:  # type: ignore[override]
        return self.inner.waited_seconds

    def done(self) -> bool:
        return self.inner.done()

    def wait(self) -> list[np.ndarray]:
        with self.guard():
            return self.inner.wait()


class ReductionThread:
    """A daemon thread that reduces queued arrays on ``comm`` (an mpi4py communicator of its own)."""

    def __init__(self, comm: Any, mpi_ops: dict[str, Any], in_place: Any,
                 collective: Callable[[str], ContextManager[None]] | None = None,
                 ring_from_bytes: int | None = None) -> None:
        """``ring_from_bytes``: segments of at least that many bytes go around ``ring.ring_allreduce``
        (None: none; the backend's ``ring.ring_threshold``)."""
        self._comm, self._mpi_ops, self._in_place = comm, mpi_ops, in_place
        self.ring_from_bytes = ring_from_bytes
        self._collective = collective or (lambda name: contextlib.nullcontext())
        self._fusion: dict[Any, FusionBuffers] = {}  # one pool per slot: a slot's buffers alternate
        self._queue: queue.Queue[Reduction | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="allreduce-thread", daemon=True)
        self._thread.start()

    def start(self, arrays: Sequence[np.ndarray], op: str, *, slot: Any = None,
              label: str = "allreduce", watched_as: str | None = "allreduce",
              mpi_op: Any = None, add: Add | None = None) -> Reduction:
        """Copy ``arrays`` (the caller may reuse them at once) and queue their reduction.

        ``watched_as``: the name under which the thread announces the reduction to the stall watchdog;
        None: not announced (the caller watches its own ``wait``, ``WatchedReduction``).

        ``slot``: reductions with the same slot share a buffer pool (bucket k of every step), so a
        step reuses the buffers of the step before the last one instead of allocating new ones.
        ``mpi_op`` and ``add`` (for the ring): a wire format's sum instead of ``op``'s own."""
        fusion = self._fusion.setdefault(slot, FusionBuffers())
        buffers, results = fusion.pack(arrays)
        job = Reduction(buffers, results, op, label, watched_as, mpi_op, add)
        self._queue.put(job)
        return job

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job.started = timeline.now()
            try:
                with self._collective(job.watched_as) if job.watched_as else contextlib.nullcontext():
                    self._reduce(job)
            except BaseException as exc:  # kept for ``wait``: the step fails with it instead of hanging
                job.error = exc
            job.finished = timeline.now()
            job._done.set()

    def _reduce(self, job: Reduction) -> None:
        mpi_op = job.mpi_op or self._mpi_ops[job.op]
        add = job.add or NUMPY_OPS[job.op]
        divisor = self._comm.Get_size() if job.op == "average" else 0
        for buf in job.buffers:
            ring_from = self.ring_from_bytes
            segment_bytes = SEGMENT_BYTES if ring_from is None else RING_SEGMENT_BYTES
            for segment in FusionBuffers.segments(buf, segment_bytes):
                if ring_from is not None and segment.nbytes >= ring_from:
                    ring_allreduce(self._comm, segment, add)
                else:
                    # Blocking: Open MPI spins (yielding) inside, which costs the compute thread some CPU on
                    # a shared core; polling MPI_Test with short sleeps instead measured no faster.
                    self._comm.Allreduce(self._in_place, segment, op=mpi_op)
                if divisor:
                    segment /= divisor  # the blocking path's rounding: sum, then one division
