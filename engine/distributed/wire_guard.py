"""fp16 on the wire without overflow: every reduction's values are scaled by a power of two before the
cast to fp16 and unscaled in float32 after the cast back; the factor comes from the largest magnitude
over all ranks, exchanged first (issue 28).

The problem. fp16's largest value is 65504. A float32 value past it becomes inf in the cast, and values
that fit can still sum past it: the ranks' values are summed in fp16, each addition rounded to it.
Gradients of RETURNN's loss *sums* (``horovod_grad_normalization = 'global_frames'``, and soon the
default) grow with a batch's frames, so such sums happen; float32 holds them, the wire did not.

The factor. It plays the part of Horovod's ``prescale_factor`` / ``postscale_factor``
(``hvd.allreduce``), with one difference: Horovod scales inside its op, after ``Compression.fp16`` has
cast, so a value past 65504 is already inf when its prescale sees it; here the scaling is in float32,
before the cast. For each tensor every rank takes the largest magnitude of its values (NaN counts as
inf), and one allreduce with MAX of these few floats (4 bytes a tensor) gives every rank the same peak
P of each tensor, bit for bit: a maximum rounds nothing, in whatever order MPI combines the ranks. The
factor is 2^e with the largest integer e such that P * 2^e <= H(n) = 65504 / (n (1 + 2^-11)^n) for n
ranks. Then no rank's value and no partial sum can round past 65504: with u = 2^-11, a cast or an
addition in round-to-nearest gives at most (1 + u) times its exact magnitude, so by induction over the
additions (in any order: MPI's, the ring's, Horovod's) a sum of k of the scaled values stays within
k P 2^e (1 + u)^k <= 65504, which fp16 holds. The largest value of a tensor lands in the top octave that
allows (for 2 ranks: 16360 to 32720; one octave lower per doubling of the ranks), so its small values
keep as many bits as fp16's range gives them: for 2 ranks all 11 down to about 2^-28 of the tensor's
largest value, none below about 2^-39 of it, where the unscaled wire kept 11 bits only from 2^-14 and
lost everything below 2^-25, whatever the tensor's size. A power of two is exact in float32 both ways,
and fp16 rounds alike at every power of two: the guard changes no bit of a sum whose values and partial
sums were normal fp16 numbers unscaled and stay so scaled. It changes the sums that overflowed (now
finite), those that fell below fp16's normal range (now with more bits), and, in a tensor scaled down,
values that drop below the normal range by the scaling (about 2^-28 of its largest and less).

Why exchange the peaks first, and not keep a dynamic scale as mixed-precision loss scaling does (halve
it and skip the update on an overflow, double it after K good steps): no update is ever skipped (a
skipped update drops a batch, and every growth attempt that overflows drops another); there is no state,
so a resumed run takes the same factors as the uninterrupted one without a checkpoint field; and the
decision is made before the reduction from exactly reduced values that every rank holds the same, also
per bucket while the backward pass still runs. The price is one tiny allreduce and a pass over the
values per reduction (per bucket); measured in docs/performance.md ("The fp16 range guard").

Non-finite values. A peak that is inf or NaN (some rank's own float32 value is non-finite) gives the
factor 1: the values travel as without the guard, the sum is non-finite on every rank, and the step's
check (``stop_on_nonfinite_train_score``, training/nonfinite.py) ends training with its message. With
finite peaks the fp16 sum is finite; after the unscale a value is non-finite only where float32's own
sum overflows (past 3.4e38). So a mere fp16 range overflow cannot happen any more, and an Inf or NaN
after the reduction is a genuine one, found by the same check on every rank.

bf16 has float32's exponent range (its largest value is 3.39e38), so a bf16 sum overflows where the
float32 sum would: the guard is for fp16 only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from engine.runtime import log

if TYPE_CHECKING:
    import tensorflow as tf

FP16_MAX = 65504.0
UNIT_ROUNDOFF = 2.0 ** -11  # fp16's: a rounding to nearest changes a normal value by at most this share
# the factors stay normal float32 numbers: 2^-126 .. 2^127
MIN_EXPONENT, MAX_EXPONENT = -126, 127


def headroom(size: int) -> float:
    """H(n): the largest magnitude a rank may send so that no partial sum of ``size`` ranks' fp16 values
    rounds past fp16's largest value (the bound in the module docstring)."""
    return FP16_MAX / (size * (1.0 + UNIT_ROUNDOFF) ** size)


def exponents_for(peaks: np.ndarray, size: int) -> np.ndarray:
    """Per peak, e of the factor 2^e (int64): the largest with peak * 2^e <= headroom(size), within
    [MIN_EXPONENT, MAX_EXPONENT]; 0 for a peak of 0 (nothing to scale) or a non-finite one."""
    peaks = np.asarray(peaks, np.float64).reshape(-1)
    exponents = np.zeros(peaks.shape, np.int64)
    scaled = np.isfinite(peaks) & (peaks > 0)
    if not scaled.any():
        return exponents
    limit, p = headroom(size), peaks[scaled]
    # limit / p = m 2^k with 0.5 <= m < 1, so floor(log2(limit / p)) = k - 1, exactly for the rounded
    # quotient; rounding can lift a quotient just below a power of two onto it, never the other way, and
    # float64 holds p 2^e exactly, so one test corrects it
    e = np.frexp(limit / p)[1].astype(np.int64) - 1
    e -= np.ldexp(p, e) > limit
    exponents[scaled] = np.clip(e, MIN_EXPONENT, MAX_EXPONENT)
    return exponents


def factors_for(peaks: np.ndarray, size: int) -> np.ndarray:
    """The factors 2^e (float32, exact) of ``exponents_for``."""
    return np.ldexp(np.float32(1.0), exponents_for(peaks, size)).astype(np.float32)


def peaks_of(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """This rank's largest magnitude of each array (float32; NaN as inf, an empty array 0)."""
    peaks = np.zeros(len(arrays), np.float32)
    for i, a in enumerate(arrays):
        if a.size:  # the largest and the smallest value: no temporary copy, as in peaks_in_graph
            peak = np.maximum(np.max(a), -np.min(a))  # numpy's max, min and maximum pass a NaN on
            peaks[i] = np.inf if np.isnan(peak) else peak
    return peaks


def peaks_in_graph(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """``peaks_of`` for tensors, as one float32 vector (inside a ``tf.function`` too). The largest and the
    smallest value, not the largest of ``abs``: two reads of the values and no temporary copy."""
    import tensorflow as tf

    peaks = tf.stack([tf.maximum(tf.reduce_max(t), -tf.reduce_min(t)) for t in tensors])
    # TensorFlow's max and min pass a NaN on; an empty tensor's max is -inf
    return tf.maximum(tf.where(tf.math.is_nan(peaks), np.float32(np.inf), peaks), np.float32(0.0))


@dataclass
class Scaling:
    """What the factors did since it was last taken: the reductions with a factor below 1 (their values
    could have summed past fp16's range unscaled), and the largest of their peaks with its factor."""

    scaled_down: int = 0
    peak: float = 0.0
    exponent: int = 0


class RangeGuard:
    """One communicator's fp16 factors (``factors``, given the exchanged peaks), and the log of them: the
    first reduction scaled below 1 is logged once, naming its step (``note_step``); each epoch's end
    counts the steps that needed it (``log_epoch``)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._new = Scaling()  # since the last note_step
        self._steps = 0  # steps of this epoch with a reduction scaled below 1
        self._logged = False

    def factors(self, peaks: np.ndarray) -> np.ndarray:
        """The factors for the exchanged peaks (the same on every rank), noting those below 1."""
        exponents = exponents_for(peaks, self.size)
        if (exponents < 0).any():
            self._new.scaled_down += 1
            i = int(np.argmin(exponents))
            if float(peaks[i]) > self._new.peak:
                self._new.peak, self._new.exponent = float(peaks[i]), int(exponents[i])
        return np.ldexp(np.float32(1.0), exponents).astype(np.float32)

    def take(self) -> Scaling:
        """What the factors did since the last call."""
        new, self._new = self._new, Scaling()
        return new

    def note_step(self, epoch: int, step: int, global_step: int | None = None) -> None:
        """After train step ``step`` (counted from 1) of ``epoch``, its reductions and averages done:
        counts the step when a factor was below 1, and logs the first such step of the run.
        ``global_step``: the global step of ``step`` (None: unknown)."""
        globally = f" (global step {global_step})" if global_step is not None else ""
        self._steps += self._note(f"train epoch {epoch}, step {step}{globally}")

    def log_epoch(self, epoch: int) -> None:
        """At the end of train ``epoch`` (after its closing average, if any): how many of its steps needed
        a factor below 1, when any did."""
        closing = self._note(f"the closing parameter average of train epoch {epoch}")
        if self._steps or closing:
            also = " and its closing parameter average" if closing else ""
            log.info(f"distributed_wire_format = 'fp16', train epoch {epoch}: {self._steps} step(s){also} "
                     "scaled the values they reduced below 1 to fit fp16's range (nothing overflowed)")
        self._steps = 0

    def _note(self, at: str) -> bool:
        """Whether a factor was below 1 since the last note; the first time in the run, says so in the log
        naming ``at``."""
        new = self.take()
        if not new.scaled_down:
            return False
        if not self._logged:
            self._logged = True
            log.info(f"distributed_wire_format = 'fp16': in {at} the values to reduce reached {new.peak:.4g} "
                     f"(the largest magnitude over the {self.size} ranks); {self.size} values of that size "
                     f"can sum past fp16's largest ({FP16_MAX:.0f}), so every rank scaled them by "
                     f"2^{new.exponent} before the cast to fp16 and back in float32 after the reduction: "
                     "nothing overflowed. Logged once; each epoch's end counts such steps.")
        return True
