"""One pass over a dataset, following ``docs/distributed-protocol.md`` step by step.

Train: the strategy's signal (``before_step``: all ranks learn who still has data and whether a rank
failed, so no rank waits in a collective that another will never enter) -> the compiled step (the
gradient reduction, if any, is inside it) -> ``after_step`` (parameter averaging when due) -> report.
Eval: every rank scores its shard, then one collective sums the scores.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import numpy as np

from engine.datasets import BatchOptions, BatchPrefetcher, Dataset, generate_batches
from engine.distributed.backend import Communicator
from engine.distributed.protocol import SCORE_NAMES, agree_on_failure, reduce_scores, sum_score_vectors
from engine.distributed.strategy import NO_REQUESTS, Strategy
from engine.report import phases
from engine.report.timeline import EVAL, STEP
from engine.runtime import log
from engine.training.checkpoints.policy import Checkpointer
from engine.training.checkpoints.resume import EpochStart
from engine.training.epoch_end import no_step_error
from engine.training.monitor import RunMonitor
from engine.training.nonfinite import NONFINITE_LOSS, newest_checkpoint_text, nonfinite_error
from engine.training.report import EpochReport, Scores
from engine.training.running_state import average_running_state
from engine.training.step import Steps


def _next_batch(batches: Iterator):
    """The next batch, None at the end, or the exception the loader raised."""
    try:
        return next(batches, None), None
    except Exception as exc:  # reported through the step signal, so the other ranks stop too
        return None, exc


def train_epoch(steps: Steps, dataset: Dataset, epoch: int, batching: BatchOptions,
                strategy: Strategy, monitor: RunMonitor,
                checkpoints: Checkpointer | None = None) -> EpochReport:
    """``checkpoints``: where a resumed epoch continues, and the checkpoints and stops within it."""
    report = EpochReport(f"train epoch {epoch}")
    dataset.init_seq_order(epoch)
    shard_rank, shard_size = strategy.train_shard
    start = checkpoints.epoch_start(dataset, batching) if checkpoints is not None else EpochStart()
    local_scores, report.steps = start.scores.copy(), start.step
    planned = generate_batches(dataset, batching, shard_rank=shard_rank, shard_size=shard_size,
                               keys=steps.batch_keys, recurrent=steps.model.recurrent,
                               skip=start.skip_batches)
    report.expected_seqs = planned.num_seqs
    # sharded, the ranks end the epoch together, when the shard with the fewest batches is done
    monitor.epoch_started(epoch, planned.all_shards // shard_size, steps.updater.learning_rate)
    with BatchPrefetcher(planned) as prefetcher:
        batches = iter(prefetcher)
        step, deferred_checkpoint, nonfinite = start.step, False, None
        while True:
            batch, error = _next_batch(batches)
            requests = checkpoints.requests(step) if checkpoints is not None else NO_REQUESTS
            if step % steps.accum_steps:
                # inside a gradient accumulation: checkpoints and stops wait for the group's end, so a
                # checkpoint never holds a half-filled accumulator (a stop signal stays pending till then)
                deferred_checkpoint = deferred_checkpoint or requests.checkpoint
                requests = NO_REQUESTS
            elif deferred_checkpoint:
                requests, deferred_checkpoint = dataclasses.replace(requests, checkpoint=True), False
            if nonfinite is not None:  # param mode: the other ranks learn of it in this signal
                requests = dataclasses.replace(requests, nonfinite=nonfinite)
            plan = strategy.before_step(step, batch, error, requests)
            if plan is not None and plan.nonfinite:
                raise _nonfinite_error(plan.nonfinite, epoch, strategy, checkpoints)
            if plan is None:
                break  # some rank is out of data: every rank ends the epoch, the pending batch is dropped
            if plan.checkpoint or plan.stop_requests:  # the state after `step` steps; a stop raises here
                average_running_state(strategy.comm, steps.model)  # the one model every rank resumes with
                checkpoints.at_step_boundary(plan, step, local_scores)
            t0 = time.perf_counter()
            with report.computing(), phases.span("train step", STEP, step=step + 1, seqs=batch.num_seqs):
                if steps.accum_steps == 1:
                    scores = counted = steps.train(batch)
                else:  # counted: the group's reduced scores once it updated
                    scores, counted = steps.train_accumulating(batch)
                strategy.after_step(plan, steps.params)
            if counted is not None:
                local_scores += counted
            report.step_done(batch.num_seqs, scores, time.perf_counter() - t0)
            monitor.step_done(scores)
            step += 1
            fp16_range = strategy.comm.fp16_range  # fp16 on the wire: logs the first step scaled into range
            if fp16_range is not None:
                fp16_range.note_step(epoch, step, checkpoints.global_step + step if checkpoints else None)
            if steps.nonfinite:  # its update found an Inf/NaN (stop_on_nonfinite_train_score)
                if not strategy.keeps_rank_state:  # one reduced update: every rank found the same
                    raise _nonfinite_error([(0, step, steps.nonfinite)], epoch, strategy, checkpoints)
                nonfinite = (step, steps.nonfinite)
    if step == 0 and not start.skip_batches:  # no step in this run nor before a resume: nothing trained
        # (the ranks agreed on the epoch's end in the step signal, so every rank raises alike)
        raise no_step_error(epoch, planned.all_shards, shard_size, dataset.num_seqs, strategy.comm.rank)
    with report.computing():
        dropped, leftover = steps.drop_partial_group() if steps.accum_steps > 1 else (0, None)
        if leftover is not None and steps.stop_on_nonfinite and not np.isfinite(leftover).all():
            # no update, but the epoch's scores would not be finite (reduced: every rank sees the same)
            raise _nonfinite_error([(0, step, NONFINITE_LOSS)], epoch, strategy, checkpoints)
        if leftover is not None:
            local_scores += leftover
            log.info(f"accum_grad_multiple_step: the epoch's last {dropped} batch(es) of this rank form an "
                     "incomplete group and make no update (as in RETURNN); their scores count")
        report.scores.add(strategy.end_epoch(steps.params, local_scores))
        average_running_state(strategy.comm, steps.model)  # one model on every rank for dev and saving
    if strategy.comm.fp16_range is not None:
        strategy.comm.fp16_range.log_epoch(epoch)
    monitor.epoch_trained()
    report.finish()
    return report


def _nonfinite_error(found, epoch: int, strategy: Strategy, checkpoints: Checkpointer | None):
    """The error that ends training on every rank (rank 0 names the newest checkpoint; ``nonfinite.py``)."""
    rank, prefix = strategy.comm.rank, checkpoints.prefix if checkpoints is not None else None
    newest = checkpoints.newest_checkpoint() if checkpoints is not None and rank == 0 else None
    return nonfinite_error(found, epoch, epoch_global_step=checkpoints.global_step if checkpoints else None,
                           checkpoint=newest_checkpoint_text(prefix, newest),
                           several_ranks=strategy.keeps_rank_state, rank=rank)


def evaluate(steps: Steps, dataset: Dataset, epoch: int, name: str, batching: BatchOptions,
             comm: Communicator) -> EpochReport:
    """Score ``dataset`` sharded over all ranks; every rank gets the global scores."""
    report = EpochReport(f"epoch {epoch} '{name}' eval")
    start = phases.now()
    dataset.init_seq_order(epoch)
    local_scores, error = np.zeros(len(SCORE_NAMES)), None
    layer_sums = {name: np.zeros(3) for name in steps.other_score_layers}
    try:
        planned = generate_batches(dataset, batching, shard_rank=comm.rank, shard_size=comm.size,
                                   shard_by="frames", keys=steps.batch_keys, recurrent=steps.model.recurrent)
        # batch_norm's running statistics move with each batch, as in RETURNN, and are put back after the pass
        with BatchPrefetcher(planned) as prefetcher, steps.kept_running_state():
            for batch in prefetcher:
                t0 = time.perf_counter()
                with report.computing():
                    scores, layers = steps.eval_layers(batch)
                local_scores += scores
                for name, sums in layers.items():
                    layer_sums[name] += sums
                report.step_done(batch.num_seqs, scores, time.perf_counter() - t0)
    except Exception as exc:  # agreed below, so no rank waits for the score reduction
        error = exc
    agree_on_failure(comm, error)
    report.scores.add(sum_score_vectors(comm, local_scores) if comm.size > 1 else local_scores)
    if layer_sums:  # every rank has the same layers (one network)
        named = {f"{name}/{part}": value for name, sums in layer_sums.items()
                 for part, value in zip(("loss", "error", "count"), sums)}
        totals = reduce_scores(comm, named) if comm.size > 1 else named
        parts = ("loss", "error", "count")
        report.layer_scores = {name: Scores(*(totals[f"{name}/{part}"] for part in parts))
                               for name in layer_sums}
    report.finish()
    phases.record(f"eval {name}", EVAL, start, phases.now(), epoch=epoch, seqs=report.seqs)
    log.debug(f"{name}: {report.scores.frames:.0f} input frames on {comm.size} rank(s)")
    return report
