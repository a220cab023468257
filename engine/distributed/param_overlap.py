"""Param mode's parameter average, and how much of its time training hid.

What is averaged. In float32 (no ``distributed_wire_format``) the parameters themselves, as RETURNN
does. With a 16-bit wire format the change since the last average: every rank keeps the parameters of
the last average (the base b, float32, identical on all ranks) and the ranks average d = params - b; the
new parameters and base are b + average(d), added in float32. Averaging the parameters themselves in
fp16 would round them to 11 significant bits at every average (bf16: 8), losing every update smaller
than about |w| * 2^-12; here only the change is rounded, relative to its own size. The base is set when
all ranks hold the same parameters (``set_base``: after the initial broadcast), and a mid-epoch
checkpoint stores it (``base_values``), so a resumed run continues from the same base.

Synchronous (RETURNN's semantics, the default): after the sync step every rank waits for the average
and continues from it, so no second of the reduction is hidden.

Overlapped (``distributed_param_sync_overlap``): at sync k each rank copies its parameters (the
snapshot s_k), starts their average in the background (of s_k - b with a wire format) and trains on.
The average is applied where the next one starts, and before a checkpoint, a stop or the end of the
epoch:

    params += average(s_k) - s_k     (wire format: b' = b + average(s_k - b); params += b' - s_k; b = b')

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
        # the snapshot's reduction, the snapshot, the variables it was taken of
        self._pending: tuple[ReductionHandle, list[np.ndarray], Sequence[Any]] | None = None
        self._average: Callable[[], None] | None = None
        self._compiled_for: tuple[int, ...] = ()
        # with a wire format: the parameters of the last average, float32, the same on every rank
        self._base: list[Any] | None = None

    @property
    def averages_changes(self) -> bool:
        """Whether the change since the last average is reduced (a 16-bit wire format), not the parameters."""
        return self.wire is not None

    def set_base(self, params: Sequence[Any]) -> None:
        """Every rank holds these same parameters now (after the initial broadcast): with a wire format,
        the next average reduces the change from them. A no-op in float32."""
        if self.averages_changes:
            self.restore_base([v.numpy() for v in params])

    def base_values(self) -> list[np.ndarray] | None:
        """The base of the next average (for a checkpoint; the same on every rank), or None in float32."""
        return None if self._base is None else [b.numpy() for b in self._base]

    def restore_base(self, values: Sequence[np.ndarray]) -> None:
        """The base of the next average, e.g. from a mid-epoch checkpoint (ignored in float32)."""
        if not self.averages_changes:
            return
        import tensorflow as tf

        values = [np.asarray(v, np.float32) for v in values]
        if self._base is None or [tuple(b.shape) for b in self._base] != [v.shape for v in values]:
            self._base = [tf.Variable(v, trainable=False, name="param_sync_base") for v in values]
            self._compiled_for = ()  # the compiled average reads the new variables
        else:
            for base, value in zip(self._base, values):
                base.assign(value)

    def _checked_base(self, params: Sequence[Any]) -> list[Any] | None:
        if not self.averages_changes:
            return None
        if self._base is None or len(self._base) != len(params):
            raise RuntimeError("ParamAverager: with a wire format the average reduces the change since the "
                               "last one; call set_base(params) once all ranks hold the same parameters.")
        return self._base

    def start(self, params: Sequence[Any]) -> None:
        """Start averaging a snapshot of the parameters (of its change from the base, with a wire format)
        in the background, after applying the average started before; ``finish`` applies it."""
        self.finish()
        base = self._checked_base(params)
        snapshot = [np.array(v.numpy()) for v in params]
        reduced = snapshot if base is None else [s - b.numpy() for s, b in zip(snapshot, base)]
        handle = self.comm.start_allreduce(reduced, "average", wire=self.wire)
        self._pending = (handle, snapshot, params)

    def finish(self) -> None:
        """Apply the average started in the background, if any (waiting for it when it runs still)."""
        if self._pending is None:
            return
        handle, snapshot, params = self._pending
        self._pending = None
        averaged = handle.wait()
        base = self._base if self.averages_changes else None
        for i, (variable, mean, own) in enumerate(zip(params, averaged, snapshot)):
            if base is not None:
                mean = base[i].numpy() + mean  # the new base: float32, the same on every rank
                base[i].assign(mean)
            variable.assign_add(mean - own)
        self.stats.add(sum(a.nbytes for a in snapshot), handle.reduce_seconds, handle.waited_seconds)

    def average_now(self, params: Sequence[Any]) -> None:
        """Every rank's parameters replaced by their mean (with a wire format: the base plus the mean
        change), before this call returns."""
        self.finish()
        base = self._checked_base(params)
        if self._compiled_for != tuple(map(id, params)):
            self._average = _compile_average(self.comm, list(params), base, self.wire, self.bucket_mb)
            self._compiled_for = tuple(map(id, params))
        start = self._clock()
        self._average()
        seconds = self._clock() - start
        self.stats.add(sum(v.shape.num_elements() * v.dtype.size for v in params), seconds, seconds)

    def take_stats(self) -> SyncStats:
        """The epoch's statistics; the next epoch starts new ones."""
        stats, self.stats = self.stats, SyncStats()
        return stats


def _compile_average(comm: Communicator, params: list, base: list | None, wire: str | None,
                     bucket_mb: float) -> Callable[[], None]:
    """The synchronous average as one ``tf.function``: of the parameters, or (``base`` given) of their
    change from the base, which then becomes base + the mean change, as do the parameters."""
    import tensorflow as tf

    # in buckets, the mpi backend copies the next bucket while its thread sends the one before
    buckets = buckets_for(params, bucket_mb) if bucket_mb else None
    timed_as = ("parameter average", PARAM_AVERAGE)

    @tf.function(autograph=False)  # plain Python control flow: converting it costs seconds per process
    def average() -> None:
        values = [v.read_value() for v in params]
        if base is not None:
            values = [value - b.read_value() for value, b in zip(values, base)]
        averaged = (comm.allreduce_tensor_buckets(values, buckets, "average", timed_as=timed_as, wire=wire)
                    if buckets else comm.allreduce_tensors(values, "average", timed_as=timed_as, wire=wire))
        for i, (var, value) in enumerate(zip(params, averaged)):
            if base is not None:
                value = base[i].read_value() + value
                base[i].assign(value)
            var.assign(value)

    return average
