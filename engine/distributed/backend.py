"""The collective interface every backend implements (``local``, ``mpi``, ``horovod``, ``tf``).

The training step talks only to a ``Communicator``; which library moves the bytes is decided once, in
``select.create_communicator``. All ranks must call the same collectives in the same order with the
same shapes and dtypes, as with MPI and Horovod themselves.
"""
from __future__ import annotations

import abc
import contextlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, ContextManager, NoReturn, Optional, Sequence, Tuple

import numpy as np

from engine.distributed.deadline import kill_after
from engine.distributed.watchdog import StallLimits, Watchdog
from engine.distributed.wire import Wire, wire_per_tensor
from engine.distributed.wire_guard import RangeGuard

if TYPE_CHECKING:
    import tensorflow as tf

OPS = ("sum", "average", "min", "max")

# ``allreduce_tensors(..., timed_as=(name, category))``: time the collective as a phase
# (``engine.report.phases``)
TimedAs = Optional[Tuple[str, str]]


def check_reduction(op: str, dtypes: Sequence[np.dtype] = ()) -> None:
    """Reject unknown ops, non-numeric dtypes, and averages of integers (no exact integer average)."""
    if op not in OPS:
        raise ValueError(f"allreduce: unknown op {op!r}; expected one of {', '.join(OPS)}")
    for dtype in set(map(np.dtype, dtypes)):
        if dtype.kind not in "fiu" or dtype.itemsize > 8:  # no MPI reduction for bool or long double
            raise ValueError(f"allreduce: dtype {dtype} is not supported; use a float, int or uint dtype")
        if op == "average" and dtype.kind != "f":
            raise ValueError(f"allreduce: op 'average' needs floating-point values, got {dtype}; "
                             "sum them and divide where the rounding you want is clear")


def tensor_bytes(tensors: Sequence[tf.Tensor], wire: Wire = None, op: str = "sum") -> int | None:
    """Bytes of the tensors on the wire when their shapes are known while tracing (gradients' are), else
    None: 2 a value for the float32 tensors that ``wire`` compresses."""
    if not all(t.shape.is_fully_defined() for t in tensors):
        return None
    fmt, marked = wire_per_tensor(wire, len(tensors), op)
    return sum(t.shape.num_elements() * (2 if fmt and m and t.dtype.name == "float32" else t.dtype.size)
               for t, m in zip(tensors, marked))


class Communicator(abc.ABC):
    """One process's view of the job: who am I, how many are we, and the collectives.

    ``allreduce`` works on numpy arrays and returns new arrays (they may share one buffer);
    ``allreduce_tensors`` works on ``tf.Tensor`` values and can be called inside a ``tf.function``.
    Both reduce all arrays of one dtype in one fused collective.
    """

    name: str = "?"
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    # The CPU affinity of each rank on this host, by local rank (empty: unknown); ``tf_threads`` reads it.
    local_cpus: tuple[frozenset[int], ...] = ()

    def __init__(self, stall: StallLimits | None = None, side_channel: Any = None, *,
                 watchdog_calls_mpi: bool = True,
                 bytes_moved: Callable[[], int | None] | None = None) -> None:
        """``stall``: when to warn about and end a wait for other ranks (None: never); ``side_channel``:
        a ``side_channel.SideChannel`` (multi-rank backends), for the watchdog and stop notices.
        ``watchdog_calls_mpi`` False (MPI below THREAD_MULTIPLE): the watchdog's thread neither uses the
        side channel nor aborts through MPI; it watches this rank's own waits and ends the process.
        ``bytes_moved``: the bytes the collectives' connections have moved (``link_progress.LinkCounter``,
        between hosts): a wait on a link that still moves them (a slow one) is no stall. None: a wait
        counts from its start (one host, where the ranks talk through shared memory; or the collectives'
        connections cannot be told from the process's other traffic)."""
        self.side_channel = side_channel
        self.watchdog = None
        # fp16 on the wire: the factors that keep each reduction in fp16's range (wire_guard.py). None
        # turns the guard off; only benchmarks do that, to measure what it costs.
        self.fp16_range: RangeGuard | None = RangeGuard(self.size)
        if stall is not None and stall.enabled:
            if watchdog_calls_mpi:
                self.watchdog = Watchdog(stall, self.abort, rank=self.rank, size=self.size,
                                         channel=side_channel, bytes_moved=bytes_moved)
            else:
                self.watchdog = Watchdog(stall, exit_without_mpi, rank=self.rank, size=self.size,
                                         bytes_moved=bytes_moved)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def stall_guard(self, what: str) -> ContextManager[None]:
        """Names the collectives in the block ("step signal") for the stall watchdog's messages, and ends
        the job when the block waits too long (``watchdog.py``)."""
        return self.watchdog.guard(what) if self.watchdog is not None else contextlib.nullcontext()

    def checkpoint_window(self) -> ContextManager[None]:
        """Around saving a checkpoint, on every rank: the ranks wait there for rank 0 to write it, so their
        waits end the job only after ``distributed_checkpoint_timeout`` (``watchdog.py``)."""
        return self.watchdog.checkpoint_window() if self.watchdog is not None else contextlib.nullcontext()

    def _collective(self, name: str) -> ContextManager[None]:
        """Around one collective call of a backend: counted and announced to the stall watchdog."""
        return self.watchdog.collective(name) if self.watchdog is not None else contextlib.nullcontext()

    def notify_stop(self, signal_number: int) -> None:
        """Tell every other rank, without waiting, that this rank received a stop signal."""
        if self.side_channel is not None:
            self.side_channel.notify_stop(signal_number)

    def stop_notices(self) -> list[tuple[int, int]]:
        """(rank, signal number) of the other ranks' stop notices received since the last call."""
        return self.side_channel.stop_notices() if self.side_channel is not None else []

    @abc.abstractmethod
    def allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum") -> list[np.ndarray]:
        """Element-wise ``op`` ("sum", "average", "min", "max") of each array over all ranks."""

    @abc.abstractmethod
    def allreduce_tensors(self, tensors: Sequence[tf.Tensor], op: str = "sum", *,
                          timed_as: TimedAs = None, wire: Wire = None) -> list[tf.Tensor]:
        """Like ``allreduce`` for tensors; usable inside ``tf.function``. ``timed_as`` = (name, category):
        the collective is timed as that phase (``engine.report.phases``), with its wire bytes and tensor
        count. ``wire`` "fp16" | "bf16" (op "sum" or "average"): float32 tensors are cast to that dtype,
        summed in it and cast back, then divided for an average (``wire.py``); a list gives one entry per
        tensor (None: not compressed). Other dtypes are never compressed. fp16 values are scaled into its
        range first, by a power of two per tensor from all ranks' values, and unscaled after the cast
        back (``wire_guard.py``; one more small allreduce per call)."""

    def start_allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum", *,
                        wire: Optional[str] = None) -> ReductionHandle:
        """Start reducing ``arrays`` now, wait later: ``handle.wait()`` returns what ``allreduce`` would.

        The arrays are copied before this returns, so the caller may change them at once. Backends with a
        communication thread (``mpi``) reduce while the caller goes on; the others reduce here and the
        handle is done at once. Every rank must start the same reductions in the same order, and call no
        other collective of the same arrays before ``wait``. ``handle.reduce_seconds`` is the reduction's
        own time, ``handle.waited_seconds`` the time ``wait`` blocked (the part not hidden behind work).
        ``wire``: the reduction's wire format (``allreduce_tensors``).

        Caveat for a caller that makes other collectives while a reduction is pending (param mode's
        overlap with the next steps): the ``mpi`` backend's thread announces its waits to the stall
        watchdog, which tracks one wait at a time (``Watchdog.enter``/``leave``) and numbers the
        collectives in the order they start; waits of two threads at once can leave it a stale wait or
        numbers that differ between ranks. Give the watchdog a slot per thread before relying on it there.
        Needs ``MPI_THREAD_MULTIPLE`` then as well (two threads inside MPI at once)."""
        check_reduction(op, [np.asarray(a).dtype for a in arrays])
        start = time.monotonic()
        results = self.allreduce([np.array(a) for a in arrays], op, **_wire_kwargs(wire))
        return DoneReduction(results, time.monotonic() - start)

    def allreduce_tensor_buckets(self, tensors: Sequence[tf.Tensor], buckets: Sequence[Sequence[int]],
                                 op: str = "sum", *, timed_as: TimedAs = None,
                                 wire: Optional[str] = None) -> list[tf.Tensor]:
        """``allreduce_tensors`` in buckets (lists of indices of ``tensors``, ``buckets.assign_buckets``),
        each reduced as soon as its own tensors exist, while the rest of the graph still computes; the
        results come back in the order of ``tensors``. Every index must be in exactly one bucket. This
        default reduces bucket by bucket with ``allreduce_tensors``; ``mpi`` and ``horovod`` overlap."""
        check_buckets(len(tensors), buckets)
        results: list[Any] = [None] * len(tensors)
        for bucket in buckets:
            reduced = self.allreduce_tensors([tensors[i] for i in bucket], op, timed_as=timed_as,
                                             **_wire_kwargs(wire))
            for i, result in zip(bucket, reduced):
                results[i] = result
        return results

    @abc.abstractmethod
    def broadcast_variables(self, variables: Sequence[tf.Variable], root: int = 0) -> None:
        """Assign ``root``'s values to the variables on every rank."""

    @abc.abstractmethod
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """``root``'s (picklable) object, on every rank."""

    @abc.abstractmethod
    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's object, indexed by rank, on every rank."""

    @abc.abstractmethod
    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Every rank's object, indexed by rank, on ``root``; None on the other ranks."""

    @abc.abstractmethod
    def scatter_object(self, objects: Sequence[Any] | None, root: int = 0) -> Any:
        """``objects[r]`` of ``root`` (one per rank; ignored elsewhere), on rank r."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return when every rank has entered the barrier."""

    @abc.abstractmethod
    def abort(self, message: str, exit_code: int = 1) -> NoReturn:
        """Print ``message`` (when not empty) and end every process of the job with ``exit_code``."""


class ReductionHandle(abc.ABC):
    """A reduction started by ``Communicator.start_allreduce``."""

    waited_seconds: float = 0.0  # how long ``wait`` blocked its caller
    reduce_seconds: float = 0.0  # how long the reduction itself took (once done)

    @abc.abstractmethod
    def done(self) -> bool:
        """Whether ``wait`` would return at once."""

    @abc.abstractmethod
    def wait(self) -> list[np.ndarray]:
        """The reduced arrays (raises the reduction's error, e.g. ``DistributedError``)."""


class DoneReduction(ReductionHandle):
    """A reduction that ran when it was started (backends without a communication thread)."""

    def __init__(self, results: list[np.ndarray], seconds: float) -> None:
        self.results, self.reduce_seconds = results, seconds

    def done(self) -> bool:
        return True

    def wait(self) -> list[np.ndarray]:
        return self.results


def check_buckets(count: int, buckets: Sequence[Sequence[int]]) -> None:
    """Every index of ``count`` tensors in exactly one bucket, no bucket empty."""
    flat = sorted(i for bucket in buckets for i in bucket)
    if flat != list(range(count)) or not all(buckets):
        raise ValueError(f"allreduce buckets {list(map(list, buckets))} do not cover the {count} tensors "
                         "exactly once")


def _wire_kwargs(wire: Optional[str]) -> dict[str, str]:
    """``wire=`` only where one is asked for, so backends without the keyword keep working."""
    return {"wire": wire} if wire is not None else {}


# How long a rank that called MPI_Abort may stay alive before it exits by itself (see ``exit_after``).
ABORT_GRACE = 10.0


def exit_after(seconds: float, exit_code: int, rank: int) -> None:
    """End this process if it still lives ``seconds`` from now: called right before MPI_Abort.

    Open MPI's abort goes through the local daemon to ``mpirun``, which ends the ranks; with the network to
    ``mpirun``'s host cut, nothing comes back, and MPI_Abort waits for ever (seen on two simulated hosts,
    where the far rank lived on until its daemon's keepalive ended it, 53 s after the cut, although a
    thread of its own was to exit it after 10 s: MPI_Abort can keep Python's lock). A watcher process
    does it (``deadline.py``), with SIGKILL (exit 137) instead of ``exit_code``."""
    _ABORT_WATCHERS.append(kill_after(seconds, f"[rank {rank}] MPI_Abort did not end this rank within "
                                               f"{seconds:g} s (the network to mpirun's host is probably "
                                               f"down); killing it (the abort's code was {exit_code}).\n"))


_ABORT_WATCHERS: list = []  # held until this process ends: the watcher's pipe must stay open till then


def exit_without_mpi(message: str, exit_code: int = 1) -> NoReturn:
    """End this process without an MPI call (from a thread that must not make one): ``mpirun`` then ends
    the other ranks, as for any rank that exits with a non-zero code before ``MPI_Finalize``."""
    if message:
        print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(exit_code)
