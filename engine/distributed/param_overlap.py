"""Param mode's parameter average, and how much of its time training hid.

Synchronous (RETURNN's semantics, the default): after the sync step every rank waits for the average
and continues from it, so no second of the reduction is hidden.

Overlapped (``distributed_param_sync_overlap``): at sync k each rank copies its parameters (the
snapshot s_k), starts their average in the background and trains on. The average is applied where the
next one starts, and before a checkpoint, a stop or the end of the epoch:

    params += average(s_k) - s_k

so every rank keeps its own progress since the snapshot on top of the average, as in overlapped local
SGD (Wang et al., 2020). On a slow link the reduction then runs behind a whole sync interval of
computation. The end of an epoch still ends with a synchronous average, so dev scores and checkpoints
see identical parameters on all ranks, as without overlap.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from engine.distributed.backend import Communicator, ReductionHandle
from engine.distributed.buckets import buckets_for
from engine.report.timeline import PARAM_AVERAGE


@dataclass
class SyncStats:
    """The averages of one epoch: their bytes, how long each reduction ran and how long training waited."""

    nbytes: int = 0
    reduce_seconds: list[float] = field(default_factory=list)
    waited_seconds: list[float] = field(default_factory=list)

    def add(self, nbytes: int, reduce_seconds: float, waited_seconds: float) -> None:
        self.nbytes = nbytes
        self.reduce_seconds.append(reduce_seconds)
        self.waited_seconds.append(min(waited_seconds, reduce_seconds))

    @property
    def hidden_share(self) -> float:
        """The share of the reductions' time that training went on meanwhile (0 when synchronous)."""
        total = sum(self.reduce_seconds)
        return 1.0 - sum(self.waited_seconds) / total if total > 0 else 0.0

    def describe(self) -> str:
        if not self.reduce_seconds:
            return "no parameter averages"
        return (f"{len(self.reduce_seconds)} parameter averages of {self.nbytes / 1e6:.1f} MB, "
                f"{statistics.median(self.reduce_seconds):.3f} s each (median), "
                f"{100 * self.hidden_share:.0f}% of their time hidden behind training")


class ParamAverager:
    """Averages the parameters over the ranks, at once or overlapped with the following steps."""

    def __init__(self, comm: Communicator, *, overlap: bool = False, wire: str | None = None,
                 bucket_mb: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.comm = comm
        self.overlap = overlap
        self.wire = wire
        self.bucket_mb = bucket_mb
        self.stats = SyncStats()
        self._clock = clock
        self._pending: tuple[ReductionHandle, list[np.ndarray], Sequence[Any]] | None = None
        self._average: Callable[[], None] | None = None
        self._compiled_for: tuple[int, ...] = ()

    def start(self, params: Sequence[Any]) -> None:
        """Start averaging a snapshot of the parameters in the background (after applying the average
        started before); ``finish`` applies it."""
        self.finish()
        snapshot = [np.array(v.numpy()) for v in params]
        handle = self.comm.start_allreduce(snapshot, "average", wire=self.wire)
        self._pending = (handle, snapshot, params)

    def finish(self) -> None:
        """Apply the average started in the background, if any (waiting for it when it runs still)."""
        if self._pending is None:
            return
        handle, snapshot, params = self._pending
        self._pending = None
        averaged = handle.wait()
        for variable, mean, own in zip(params, averaged, snapshot):
            variable.assign_add(mean - own)
        self.stats.add(sum(a.nbytes for a in snapshot), handle.reduce_seconds, handle.waited_seconds)

    def average_now(self, params: Sequence[Any]) -> None:
        """Every rank's parameters replaced by their mean, before this call returns."""
        self.finish()
        if self._compiled_for != tuple(map(id, params)):
            self._average = _compile_average(self.comm, list(params), self.wire, self.bucket_mb)
            self._compiled_for = tuple(map(id, params))
        start = self._clock()
        self._average()
        seconds = self._clock() - start
        self.stats.add(sum(v.shape.num_elements() * v.dtype.size for v in params), seconds, seconds)

    def take_stats(self) -> SyncStats:
        """The epoch's statistics; the next epoch starts new ones."""
        stats, self.stats = self.stats, SyncStats()
        return stats


def _compile_average(comm: Communicator, params: list, wire: str | None,
                     bucket_mb: float) -> Callable[[], None]:
    import tensorflow as tf

    # in buckets, the mpi backend copies the next bucket while its thread sends the one before
    buckets = buckets_for(params, bucket_mb) if bucket_mb else None
    timed_as = ("parameter average", PARAM_AVERAGE)

    @tf.function
    def average() -> None:
        values = [v.read_value() for v in params]
        averaged = (comm.allreduce_tensor_buckets(values, buckets, "average", timed_as=timed_as, wire=wire)
                    if buckets else comm.allreduce_tensors(values, "average", timed_as=timed_as, wire=wire))
        for var, value in zip(params, averaged):
            var.assign(value)

    return average
