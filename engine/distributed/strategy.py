"""How this process takes part in training: one strategy object per reduce mode, built once.

The epoch loop and the compiled train step call the same hooks whatever the mode, and never ask which
mode runs:

    plan = strategy.before_step(step, batch, error, requests)  # None: every rank ends the epoch here
    grads, scores = strategy.reduce_gradients(grads, scores)   # inside the step's tf.function
    strategy.after_step(plan, params)                      # param mode: average when due
    scores = strategy.end_epoch(params, local_scores)      # identical parameters, reported scores

- ``SingleProcess``: no communication (``use_horovod`` off).
- ``GradAllreduce``: every step signals, then reduces the gradients (with the step's score sums) in
  one fused collective, or in buckets while the backward pass runs (``distributed_bucket_mb``,
  ``buckets.py``); every rank applies the same update. ``horovod_grad_normalization`` decides
  what the reduced gradient is (see ``settings.GRAD_NORMALIZATIONS``).
- ``ParamAverage``: every rank updates alone; the parameters are averaged when ``ParamSyncSchedule``
  says so and at the end of every epoch (with a 16-bit ``distributed_wire_format``, their change since
  the last average is: ``param_overlap.py``). With ``shard`` the ranks signal every step (they end the
  epoch together); with ``random_seed_offset`` they meet only at the averaging, where each rank calls
  the signal and the average when its own schedule says so (a rank out of data calls the signal too,
  so every rank makes the same sequence of collective calls) and train scores stay per rank.

``requests`` (``StepRequests``) carry this rank's wish for a checkpoint (its interval is due), the stop
signal it received and, in param mode, whether its last step met an Inf/NaN (then every rank ends
training at that signal: ``stop_on_nonfinite_train_score``; with ``random_seed_offset`` that rank calls
the signal at once, as for a stop); the plan says what all ranks agreed on. With a per-step signal they
agree at once. With ``random_seed_offset`` a checkpoint waits for the next average; a rank with a stop signal
tells the others over the side channel (``Communicator.notify_stop``) and calls the signal at once, and
each rank that hears of it does the same at its next step, so every rank stops within one step.

Importing this module imports neither mpi4py nor TensorFlow.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from engine.distributed.backend import Communicator
from engine.distributed.buckets import buckets_for
from engine.distributed.protocol import (StepSignal, exit_code_of, raise_on_failure, step_signal,
                                         sum_score_vectors)
from engine.distributed.param_overlap import ParamAverager
from engine.distributed.settings import RANDOM_SEED_OFFSET, DataParallelSettings
from engine.report.timeline import ALLREDUCE
from engine.runtime import log


@dataclass(frozen=True)
class StepRequests:
    """What this rank asks for at a step boundary."""

    checkpoint: bool = False  # its checkpoint interval is due
    stop_signal: int = 0  # the number of the stop signal it received (SIGUSR1, ...); 0: none
    # param mode: (step of the epoch, what was found) when its last step met an Inf/NaN (the ranks must
    # learn of it to stop together; in grad mode every rank found the same in the reduced values)
    nonfinite: tuple[int, int] | None = None


NO_REQUESTS = StepRequests()


@dataclass(frozen=True)
class StepPlan:
    """What the ranks agreed on for one step."""

    sync_params: bool = False  # average the parameters after this step
    checkpoint: bool = False  # every rank saves a checkpoint before this step
    # (rank, signal): save, then stop before this step, also when a rank is out of data (it saves its
    # position at the end; a resumed run then ends the epoch where an uninterrupted one would)
    stop_requests: tuple[tuple[int, int], ...] = ()
    # (rank, step of the epoch, what was found) of the ranks whose last step met an Inf/NaN: every rank
    # ends training (stop_on_nonfinite_train_score), nothing else of the plan happens
    nonfinite: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def agreed(cls, signal: StepSignal, sync_params: bool = False) -> StepPlan:
        # no average at a stop: the ranks' own parameters are saved, as at any other step boundary
        return cls(sync_params=sync_params and not signal.stop_requests, checkpoint=signal.checkpoint,
                   stop_requests=signal.stop_requests)


class Strategy:
    """The single-process strategy; the base of the data-parallel ones."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.train_shard: tuple[int, int] = (0, 1)  # (rank, size) for sharding the train batches
        self.random_seed_offset = 0  # added to the train dataset's ordering seed
        self.lr_scale = 1.0  # the learning rate is multiplied by this (horovod_scale_lr)
        # True: the step differentiates the loss sum, not the frame average (reduce_gradients divides)
        self.differentiates_loss_sum = False
        # with the loss sum: this rank's share of the model's regularisers, so that they count once in all
        self.regularizer_share = 1.0
        # True: the ranks' parameters and optimizer states differ, so a checkpoint holds every rank's
        self.keeps_rank_state = False
        # True: the score sums the loop accumulates are already the global ones (else end_epoch adds them)
        self.scores_are_global = True

    def describe(self) -> str:
        return "single process"

    def before_step(self, step: int, batch: Any | None, error: BaseException | None,
                    requests: StepRequests = NO_REQUESTS) -> StepPlan | None:
        """Called with the next batch (None: this rank has no more data) or the loader's error."""
        if error is not None:
            raise error
        if batch is None:
            return None
        stops = ((self.comm.rank, requests.stop_signal),) if requests.stop_signal else ()
        return StepPlan(checkpoint=requests.checkpoint, stop_requests=stops)

    def reduce_gradients(self, grads: list, scores: Any) -> tuple[list, Any]:
        """Inside the train step's ``tf.function``: the gradients to apply and the step's score sums."""
        return grads, scores

    def reduce_extra_gradients(self, grads: list, reduced_scores: Any) -> list:
        """A second set of per-rank gradient terms of the same step (``maximize_grad_norm``), reduced and
        normalised like the gradients; ``reduced_scores``: what ``reduce_gradients`` returned."""
        return grads

    def after_step(self, plan: StepPlan, params: Sequence[Any]) -> None:
        pass

    def end_epoch(self, params: Sequence[Any], local_scores: np.ndarray) -> np.ndarray:
        """The epoch's [loss sum, error sum, count, input frames] to report."""
        return local_scores

    def parameters_agreed(self, params: Sequence[Any]) -> None:
        """Every rank holds these same parameters now (after the initial broadcast, before any rank's own
        state from a checkpoint): param mode with a wire format averages the change from them next."""

    def sync_base(self) -> list[np.ndarray] | None:
        """What a mid-epoch checkpoint keeps of the parameter average's state besides the parameters: the
        base of the next average (param mode with a wire format; the same on every rank), else None."""
        return None

    def restore_sync_base(self, values: Sequence[np.ndarray]) -> None:
        """Continue from a checkpoint's ``sync_base``."""


class GradAllreduce(Strategy):
    def __init__(self, comm: Communicator, *, normalization: str = "sum", scale_lr: bool = False,
                 wire_format: str | None = None, bucket_mb: float = 0.0) -> None:
        super().__init__(comm)
        self.normalization = normalization
        self.wire_format = wire_format  # distributed_wire_format: the gradients' dtype on the wire
        self.bucket_mb = bucket_mb
        self.train_shard = (comm.rank, comm.size)
        self.lr_scale = float(comm.size) if scale_lr else 1.0
        self.differentiates_loss_sum = normalization == "global_frames"
        self.regularizer_share = 1.0 if comm.rank == 0 or not self.differentiates_loss_sum else 0.0

    def describe(self) -> str:
        return f"reduce type grad ({self.normalization} of the ranks' gradients{_on_wire(self.wire_format)})"

    def before_step(self, step: int, batch: Any | None, error: BaseException | None,
                    requests: StepRequests = NO_REQUESTS) -> StepPlan | None:
        signal = step_signal(self.comm, have_more_data=batch is not None, had_error=exit_code_of(error),
                             want_checkpoint=requests.checkpoint, stop_signal=requests.stop_signal)
        raise_on_failure(self.comm, signal, error)
        return StepPlan.agreed(signal) if signal.all_have_data or signal.stop_requests else None

    def reduce_gradients(self, grads: list, scores: Any) -> tuple[list, Any]:
        # The score sums ride along with the gradients (in the first bucket: they exist since the forward
        # pass), so every rank reports the global scores; they stay float32 on the wire.
        tensors = list(grads) + [scores]
        wire = self.grads_wire(len(grads), with_scores=True)
        timed_as = ("gradient allreduce", ALLREDUCE)
        if self.bucket_mb > 0:
            buckets = buckets_for(grads, self.bucket_mb)
            buckets = [buckets[0] + [len(grads)]] + buckets[1:] if buckets else [[len(grads)]]
            reduced = self.comm.allreduce_tensor_buckets(tensors, buckets, "sum", timed_as=timed_as,
                                                         wire=wire)
        else:
            reduced = self.comm.allreduce_tensors(tensors, "sum", timed_as=timed_as, wire=wire)
        grads, scores = reduced[:-1], reduced[-1]
        return self._normalize(grads, scores), scores

    def reduce_extra_gradients(self, grads: list, reduced_scores: Any) -> list:
        summed = self.comm.allreduce_tensors(list(grads), "sum", wire=self.grads_wire(len(grads)))
        return self._normalize(summed, reduced_scores)

    def grads_wire(self, count: int, with_scores: bool = False) -> list | None:
        """``allreduce_tensors``'s wire argument for ``count`` gradients (and the score sums after them,
        which stay float32: they are counts and loss sums, not gradients)."""
        if self.wire_format is None:
            return None
        return [self.wire_format] * count + [None] * with_scores

    def _normalize(self, summed: list, reduced_scores: Any) -> list:
        if self.normalization == "average":
            return [g / float(self.comm.size) for g in summed]
        if self.normalization == "global_frames":
            import tensorflow as tf

            frames = tf.maximum(reduced_scores[2], 1.0)  # all ranks' count (frames, ctc: labels)
            return [g / frames for g in summed]
        return list(summed)


class ParamSyncSchedule:
    """When param mode averages: after local steps with ``step % N == N - 1``, or every T seconds."""

    def __init__(self, step_interval: int = 1, time_diff: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.step_interval = step_interval
        self.time_diff = time_diff
        self._clock = clock
        self._last_sync = clock()

    def wants_sync(self, step: int) -> bool:
        """This rank's own view: the step count, or its clock since the last average."""
        if self.time_diff is not None:
            return self._clock() - self._last_sync >= self.time_diff
        return step % self.step_interval == self.step_interval - 1

    def restart(self) -> None:
        self._last_sync = self._clock()


class ParamAverage(Strategy):
    def __init__(self, comm: Communicator, *, distribution: str, schedule: ParamSyncSchedule,
                 scale_lr: bool = False, overlap: bool = False, wire_format: str | None = None,
                 bucket_mb: float = 0.0) -> None:
        super().__init__(comm)
        self.averager = ParamAverager(comm, overlap=overlap, wire=wire_format, bucket_mb=bucket_mb)
        self._at_epoch_end = False
        self.distribution = distribution
        self.wire_format = wire_format  # distributed_wire_format: the parameters' dtype on the wire
        self.schedule = schedule
        self.lr_scale = float(comm.size) if scale_lr else 1.0
        if distribution == "shard":
            self.train_shard = (comm.rank, comm.size)
        else:
            self.random_seed_offset = comm.rank * RANDOM_SEED_OFFSET
        self.signal_every_step = distribution == "shard"
        self.keeps_rank_state = True
        self.scores_are_global = False
        self._stop_known = False  # random_seed_offset: this rank sent or received a stop notice

    def describe(self) -> str:
        every = (f"every {self.schedule.time_diff:g} s" if self.schedule.time_diff is not None
                 else f"every {self.schedule.step_interval} steps")
        overlapped = ", overlapped with the following steps" if self.averager.overlap else ""
        return (f"reduce type param (parameters averaged {every}{overlapped} and at the end of each epoch"
                f"{_on_wire(self.wire_format)})")

    def before_step(self, step: int, batch: Any | None, error: BaseException | None,
                    requests: StepRequests = NO_REQUESTS) -> StepPlan | None:
        vote = self.schedule.wants_sync(step)
        if not self.signal_every_step and not self._stop_known:
            if requests.stop_signal:
                self.comm.notify_stop(requests.stop_signal)
            self._stop_known = bool(requests.stop_signal) or bool(self.comm.stop_notices())
        if not (self.signal_every_step or vote or batch is None or error is not None or self._stop_known
                or requests.nonfinite):
            return StepPlan()
        signal = step_signal(self.comm, have_more_data=batch is not None, had_error=exit_code_of(error),
                             want_param_sync=vote, want_checkpoint=requests.checkpoint,
                             stop_signal=requests.stop_signal, nonfinite=requests.nonfinite)
        raise_on_failure(self.comm, signal, error)
        if signal.nonfinite:  # also at the end of the data: training ends before anything else
            return StepPlan(nonfinite=signal.nonfinite)
        if not signal.all_have_data and not signal.stop_requests:
            return None
        # Any rank's vote makes everyone average: with a per-step signal that turns differing clocks
        # into one decision; without one, every rank that reaches this point has voted itself.
        if signal.param_sync:
            self.schedule.restart()
        plan = StepPlan.agreed(signal, sync_params=signal.param_sync)
        if plan.checkpoint or plan.stop_requests:
            self.averager.finish()  # a checkpoint holds the parameters with the average started before
        return plan

    def after_step(self, plan: StepPlan, params: Sequence[Any]) -> None:
        if plan.sync_params:
            self.average_parameters(params)

    def end_epoch(self, params: Sequence[Any], local_scores: np.ndarray) -> np.ndarray:
        self._at_epoch_end = True
        try:
            self.average_parameters(params)  # every rank holds the same parameters for dev eval and saving
        finally:
            self._at_epoch_end = False
        self.schedule.restart()
        log.info(f"param mode, this epoch: {self.averager.take_stats().describe()}")
        if self.distribution != "shard":
            return local_scores  # every rank saw the whole corpus in its own order: scores stay per rank
        return sum_score_vectors(self.comm, local_scores)

    def parameters_agreed(self, params: Sequence[Any]) -> None:
        self.averager.set_base(params)

    def sync_base(self) -> list[np.ndarray] | None:
        return self.averager.base_values()

    def restore_sync_base(self, values: Sequence[np.ndarray]) -> None:
        self.averager.restore_base(values)

    def average_parameters(self, params: Sequence[Any]) -> None:
        """Average the variables over the ranks in one fused collective: at once at the end of an epoch,
        else overlapped with the following steps when configured (``param_overlap.py``)."""
        if self.averager.overlap and not self._at_epoch_end:
            self.averager.start(params)
        else:
            self.averager.average_now(params)


def build_strategy(settings: DataParallelSettings, comm: Communicator) -> Strategy:
    # one rank: every mode is plain training, except global_frames, which divides by the batch's frames
    single = comm.size == 1 and not (settings.reduce_type == "grad" and settings.grad_normalization
                                     == "global_frames")
    if not settings.enabled or single:
        if settings.wire_format is not None:
            log.info(f"distributed_wire_format = {settings.wire_format!r} has no effect: this is a single "
                     "process (nothing is reduced), so values stay float32")
        return Strategy(comm)
    if settings.reduce_type == "grad":
        return GradAllreduce(comm, normalization=settings.grad_normalization, scale_lr=settings.scale_lr,
                             wire_format=settings.wire_format, bucket_mb=settings.bucket_mb)
    schedule = ParamSyncSchedule(settings.param_sync_step, settings.param_sync_time_diff)
    return ParamAverage(comm, distribution=settings.dataset_distribution, schedule=schedule,
                        scale_lr=settings.scale_lr, overlap=settings.param_sync_overlap,
                        wire_format=settings.wire_format, bucket_mb=settings.bucket_mb)


def _on_wire(wire_format: str | None) -> str:
    return "" if wire_format is None else f", {wire_format} on the wire"
