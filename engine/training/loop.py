"""One pass over a dataset, following ``distributed-protocol.md`` step by step.

Train: signal -> compute (grad mode: the fused reduction is inside the step) -> param sync when due ->
report. Eval: every rank scores its shard, then one collective sums the scores. The signal tells every
rank whether all ranks still have data and whether any rank failed, so no rank waits in a collective
that another rank will never enter.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from engine import log
from engine.datasets import BatchPrefetcher, Dataset, generate_batches
from engine.distributed.backend import Communicator
from engine.distributed.protocol import ParamSyncSchedule, StepSignal, reduce_scores, step_signal
from engine.errors import DistributedError, EngineError
from engine.training.report import EpochReport
from engine.training.step import Steps


@dataclass
class BatchOptions:
    batch_size: int
    max_seqs: int = -1
    max_seq_length: int | dict = 0


@dataclass
class DataParallel:
    """How this process takes part in data-parallel training (one rank, local: size 1)."""

    comm: Communicator
    reduce_type: str = "grad"  # "grad" | "param"
    distribution: str = "shard"  # "shard" | "random_seed_offset"
    sync_schedule: ParamSyncSchedule | None = None

    @property
    def multi_rank(self) -> bool:
        return self.comm.size > 1

    @property
    def param_mode(self) -> bool:
        return self.multi_rank and self.reduce_type == "param"

    @property
    def shard(self) -> tuple[int, int]:
        """(rank, size) for batch sharding; random_seed_offset reads the whole dataset on every rank."""
        if self.multi_rank and self.distribution == "shard":
            return self.comm.rank, self.comm.size
        return 0, 1

    @property
    def signal_every_step(self) -> bool:
        """param + random_seed_offset needs the signal only where the ranks meet anyway: at syncs."""
        return not (self.param_mode and self.distribution == "random_seed_offset"
                    and not self.sync_schedule.is_time_based)


def agree_on_failure(comm: Communicator, error: BaseException | None) -> None:
    """All ranks learn whether any rank failed (one signal collective); raise on every rank if one did."""
    if comm.size == 1:
        if error is not None:
            raise error
        return
    raise_on_failure(comm, step_signal(comm, have_more_data=True, had_error=error is not None), error)


def raise_on_failure(comm: Communicator, signal: StepSignal, error: BaseException | None) -> None:
    """After a signal: if any rank failed, end every rank.

    The failing rank with the lowest index reports its own error; rank 0 (when it did not fail) names
    the failing rank; the others exit quietly, so an N-rank job prints one or two messages, not N."""
    if not signal.any_error:
        return
    failed = sorted(signal.failed_ranks)
    if error is not None and (not failed or comm.rank == failed[0]):
        if not isinstance(error, EngineError):
            raise error  # a bug: the failure handler prints the traceback and ends the job
        error.agreed = True
        raise error
    who = f"rank {', '.join(map(str, failed))}" if failed else "rank unknown"
    exc = DistributedError(f"Another rank failed ({who}); its error message is above or in its log file.")
    exc.agreed, exc.quiet = True, comm.rank != 0
    raise exc


def _next_batch(batches: Iterator):
    """The next batch, None at the end, or the exception the loader raised."""
    try:
        return next(batches, None), None
    except Exception as exc:  # reported through the step signal, so the other ranks stop too
        return None, exc


def train_epoch(steps: Steps, dataset: Dataset, epoch: int, opts: BatchOptions, dp: DataParallel) -> EpochReport:
    report = EpochReport(f"train epoch {epoch}")
    dataset.init_seq_order(epoch)
    report.expected_seqs = dataset.num_seqs // dp.shard[1]
    shard_rank, shard_size = dp.shard
    local_scores = np.zeros(3)
    with BatchPrefetcher(generate_batches(dataset, batch_size=opts.batch_size, max_seqs=opts.max_seqs,
                                          max_seq_length=opts.max_seq_length, shard_rank=shard_rank,
                                          shard_size=shard_size)) as prefetcher:
        batches = iter(prefetcher)
        step = 0
        while True:
            batch, error = _next_batch(batches)
            vote = dp.param_mode and dp.sync_schedule.wants_sync(step)
            signal = None
            if dp.multi_rank and (dp.signal_every_step or vote or batch is None or error is not None):
                signal = step_signal(dp.comm, have_more_data=batch is not None, had_error=error is not None,
                                     want_param_sync=vote)
                raise_on_failure(dp.comm, signal, error)
                if not signal.all_have_data:
                    break  # another rank (or this one) is out of data: the pending batch is dropped
            elif error is not None:
                raise error
            elif batch is None:
                break
            sync_due = dp.param_mode and dp.sync_schedule.due(step, signal)
            t0 = time.perf_counter()
            with report.computing():
                scores = steps.train(batch)
                if sync_due:
                    steps.sync_params()
            local_scores += scores
            report.step_done(batch.num_seqs, scores, time.perf_counter() - t0)
            step += 1
    if dp.param_mode:
        with report.computing():
            steps.sync_params()  # every rank holds the same parameters for dev eval and saving
        dp.sync_schedule.reset()
        if dp.distribution == "shard":
            local_scores = _sum_over_ranks(dp.comm, local_scores)
    report.scores.add(local_scores)
    report.finish()
    return report


def _sum_over_ranks(comm: Communicator, values: np.ndarray) -> np.ndarray:
    totals = reduce_scores(comm, dict(zip(("loss", "error", "frames"), map(float, values))))
    return np.array([totals["loss"], totals["error"], totals["frames"]])


def evaluate(steps: Steps, dataset: Dataset, epoch: int, name: str, opts: BatchOptions,
             comm: Communicator) -> EpochReport:
    """Score ``dataset`` sharded over all ranks; every rank gets the global scores."""
    report = EpochReport(f"epoch {epoch} '{name}' eval")
    dataset.init_seq_order(epoch)
    local_scores, error = np.zeros(3), None
    try:
        with BatchPrefetcher(generate_batches(dataset, batch_size=opts.batch_size, max_seqs=opts.max_seqs,
                                              shard_rank=comm.rank, shard_size=comm.size)) as prefetcher:
            for batch in prefetcher:
                t0 = time.perf_counter()
                with report.computing():
                    scores = steps.eval(batch)
                local_scores += scores
                report.step_done(batch.num_seqs, scores, time.perf_counter() - t0)
    except Exception as exc:  # agreed below, so no rank waits for the score reduction
        error = exc
    agree_on_failure(comm, error)
    report.scores.add(_sum_over_ranks(comm, local_scores) if comm.size > 1 else local_scores)
    report.finish()
    log.debug(f"{name}: {report.scores.frames:.0f} frames on {comm.size} rank(s)")
    return report
