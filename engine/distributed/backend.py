"""The collective interface every backend implements (``local``, ``mpi``, ``horovod``).

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
from typing import TYPE_CHECKING, Any, ContextManager, NoReturn, Optional, Sequence, Tuple

import numpy as np

from engine.distributed.watchdog import StallLimits, Watchdog
from engine.distributed.wire import Wire

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


def tensor_bytes(tensors: Sequence[tf.Tensor]) -> int | None:
    """Bytes of the tensors when their shapes are known while tracing (gradients' are), else None."""
    if not all(t.shape.is_fully_defined() for t in tensors):
        return None
    return sum(t.shape.num_elements() * t.dtype.size for t in tensors)


class PendingReduction:
    """A reduction started by ``Communicator.start_allreduce``: ``wait()`` returns its results;
    ``seconds`` is how long the reduction itself ran (known once ``wait`` returned)."""

    def __init__(self, results: list[np.ndarray], seconds: float) -> None:
        self._results, self.seconds = results, seconds

    def wait(self) -> list[np.ndarray]:
        return self._results


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
                 watchdog_calls_mpi: bool = True) -> None:
        """``stall``: when to warn about and end a wait for other ranks (None: never); ``side_channel``:
        a ``side_channel.SideChannel`` (multi-rank backends), for the watchdog and stop notices.
        ``watchdog_calls_mpi`` False (MPI below THREAD_MULTIPLE): the watchdog's thread neither uses the
        side channel nor aborts through MPI; it watches this rank's own waits and ends the process."""
        self.side_channel = side_channel
        self.watchdog = None
        if stall is not None and stall.enabled:
            if watchdog_calls_mpi:
                self.watchdog = Watchdog(stall, self.abort, rank=self.rank, size=self.size,
                                         channel=side_channel)
            else:
                self.watchdog = Watchdog(stall, exit_without_mpi, rank=self.rank, size=self.size)

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
        tensor (None: not compressed). Other dtypes are never compressed."""

    def start_allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum", *,
                        wire: str | None = None) -> PendingReduction:
        """Start ``allreduce(arrays, op)`` and return at once where the backend can reduce in the background
        (the caller may go on computing, but must not change ``arrays`` until ``wait()`` returned). Every
        rank must start the same reductions in the same order. This base version reduces before it returns."""
        start = time.perf_counter()
        results = self.allreduce(arrays, op)
        return PendingReduction(results, time.perf_counter() - start)

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


def exit_without_mpi(message: str, exit_code: int = 1) -> NoReturn:
    """End this process without an MPI call (from a thread that must not make one): ``mpirun`` then ends
    the other ranks, as for any rank that exits with a non-zero code before ``MPI_Finalize``."""
    if message:
        print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(exit_code)
