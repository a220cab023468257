"""Checkpoints during training and exact resume: where a run continues, what a checkpoint holds, and the
step boundaries at which training saves or stops.

Besides the parameters and the optimizer state (whose update count keys dropout's random numbers, so
those need no saved state), a checkpoint written here holds (attribute / group names in quotes):
- "kind" (``epoch`` or ``mid-epoch``), "ranks", "scores_global", the learning-rate history
  ("learning_rate_history", JSON, used when there is no ``learning_rate_file``);
- mid-epoch: "learning_rate" (the one in use) and group "resume" with per rank the train steps done in
  the epoch ("steps"), the batches of the epoch's plan trained by then ("batches_done"), the score sums
  so far ("scores") and a fingerprint of the epoch's batch plan ("fingerprints": data order, lengths and
  batching, so a resume into a changed corpus or config is refused instead of silently training other
  data); the order's seed is part of the order;
- in param mode (``Strategy.keeps_rank_state``), the optimizer state of ranks 1.. ("ranks/<r>/optimizer")
  and, mid-epoch, their parameters ("ranks/<r>/params"); rank 0's are the file's main groups.

Rank 0 reads and writes the files; the per-rank parts travel by ``gather_object``/``scatter_object``.
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import log
from engine.config import Config
from engine.datasets import BatchOptions, Dataset
from engine.distributed.protocol import agree_on_failure, agree_on_stop
from engine.distributed.strategy import Strategy, StepPlan, StepRequests
from engine.errors import ConfigError, TrainingStopped
from engine.training import preemption
from engine.training.checkpoint import (CheckpointInfo, checkpoint_path, find_mid_epoch_checkpoints,
                                        find_newest_epoch, load_checkpoint, mid_epoch_path, read_extras,
                                        remove_superseded, save_checkpoint)
from engine.training.checkpoint_interval import CheckpointInterval, CheckpointSchedule
from engine.training.lr_control import EpochData, LearningRateControl


@dataclass
class EpochStart:
    """Where this rank continues an epoch."""

    step: int = 0  # train steps this rank has done in the epoch
    skip_batches: int = 0  # batches of the epoch's plan trained already (by all ranks)
    scores: np.ndarray = field(default_factory=lambda: np.zeros(3))  # [loss, error, frames] sums so far
    fingerprint: int | None = None  # of the plan the steps were taken from; None: nothing to check
    learning_rate: float | None = None  # the one the steps were taken with


@dataclass(frozen=True)
class ResumePoint:
    start_epoch: int
    path: str | None = None  # the checkpoint to continue from (None: start afresh, or from `load`)
    mid_epoch: bool = False


def find_resume_point(config: Config, comm: Any) -> ResumePoint:
    """``start_epoch`` "auto": after the newest checkpoint, where a mid-epoch one of a later epoch than the
    newest epoch checkpoint continues that epoch; an explicit ``start_epoch`` N loads ``<model>.<N-1>``.
    Rank 0 looks; every rank gets its answer."""
    start = config.typed("start_epoch")
    prefix = config.str("model")
    if start not in ("auto", None):
        epoch = config.int("start_epoch")
        if epoch < 1:
            raise ConfigError(f"Config key 'start_epoch' must be 'auto' or >= 1, got {epoch}.")
        if epoch > 1 and not prefix:
            raise ConfigError(f"start_epoch is {epoch}, but no 'model' prefix is set to load the previous "
                              "epoch's checkpoint from.")
        return ResumePoint(epoch, checkpoint_path(prefix, epoch - 1) if epoch > 1 else None)
    point = ResumePoint(1)
    if comm.rank == 0 and prefix:
        newest = find_newest_epoch(prefix) or 0
        mid = [(epoch, path) for epoch, _, path in find_mid_epoch_checkpoints(prefix) if epoch > newest]
        if mid:
            point = ResumePoint(mid[-1][0], mid[-1][1], mid_epoch=True)
        elif newest:
            point = ResumePoint(newest + 1, checkpoint_path(prefix, newest))
    return comm.broadcast_object(point, root=0)


def plan_fingerprint(dataset: Dataset, batching: BatchOptions) -> int:
    """crc32 of the epoch's data order, sequence lengths and batching options (the batch plan's inputs)."""
    crc = zlib.crc32(np.ascontiguousarray(dataset.order, np.int64).tobytes())
    crc = zlib.crc32(np.ascontiguousarray(dataset.epoch_seq_lengths(), np.int64).tobytes(), crc)
    return zlib.crc32(repr(batching).encode(), crc)


class Checkpointer:
    """Saves checkpoints (every rank calls; rank 0 writes) and continues a run from one."""

    def __init__(self, config: Config, strategy: Strategy, model: Any, updater: Any,
                 lr_control: LearningRateControl) -> None:
        self.prefix = config.str("model")
        self.strategy, self.comm = strategy, strategy.comm
        self.model, self.updater, self.lr_control = model, updater, lr_control
        interval = CheckpointInterval.parse(config.typed("checkpoint_interval"))
        if interval.enabled and not self.prefix and config.has("checkpoint_interval"):
            raise ConfigError(f"Config key 'checkpoint_interval' is {config.value('checkpoint_interval')!r}, "
                              "but no 'model' prefix is set to save checkpoints under.")
        self.schedule = CheckpointSchedule(interval)
        self.epoch = 0
        self.global_step = 0  # at the start of the current epoch
        self._loaded: tuple[dict, dict] | None = None  # rank 0: a checkpoint's extras, until restored
        self._resumed: EpochStart | None = None  # where the resumed epoch continues
        self._resumed_epoch = 0
        self._plan: tuple[Dataset, BatchOptions] | None = None  # of the current epoch, for its fingerprint
        self._loaded_step: int | None = None  # the step of the current epoch whose state was loaded

    # ----- continuing a run -----
    def load(self, point: ResumePoint) -> CheckpointInfo:
        """Rank 0: the checkpoint's parameters, optimizer state and learning-rate history."""
        info = load_checkpoint(point.path, self.model.named_variables(), self.updater.named_variables())
        self._loaded = read_extras(point.path)
        history = self._loaded[0].get("learning_rate_history")
        if history:
            self.lr_control.epoch_data = {int(epoch): EpochData(rate, scores)
                                          for epoch, (rate, scores) in json.loads(history).items()}
        where = f"in epoch {info.epoch} at global step {info.global_step}" if point.mid_epoch \
            else f"after epoch {info.epoch}"
        log.info(f"resuming {where} from {point.path}")
        return info

    def restore_rank_states(self, point: ResumePoint) -> int:
        """Every rank, after rank 0's state was broadcast: each rank's own parameters and optimizer state
        (param mode) and, mid-epoch, where it continues the epoch. Returns the global step at the start
        of ``point.start_epoch``."""
        parts = self._rank_parts(point) if self.comm.rank == 0 else None
        part = self.comm.scatter_object(parts, root=0) if self.comm.size > 1 else parts[0]
        self._loaded = None
        for group, variables in (("params", self.model.named_variables()),
                                 ("optimizer", self.updater.named_variables())):
            for name, value in part.get(group, {}).items():
                variables[name].assign(value)
        self._resumed, self._resumed_epoch = part.get("start"), point.start_epoch
        return part["global_step"]

    def _rank_parts(self, point: ResumePoint) -> list[dict]:
        size = self.comm.size
        if self._loaded is None:  # a fresh start (or `load`): nothing per rank
            return [{"global_step": 0}] * size
        attrs, groups = self._loaded
        global_step = int(attrs.get("global_step", 0))
        same_size = int(attrs.get("ranks", 1)) == size
        parts = [{"global_step": global_step} for _ in range(size)]
        if same_size and self.strategy.keeps_rank_state:
            for rank in range(1, size):
                parts[rank].update({group: groups.get(f"ranks/{rank}/{group}", {})
                                    for group in ("params", "optimizer")})
        elif self.strategy.keeps_rank_state or "ranks/1/optimizer" in groups:
            log.warning(f"{point.path} was saved by {attrs.get('ranks', 1)} ranks, this job has {size}: every "
                        "rank continues with rank 0's parameters and optimizer state.")
        if not point.mid_epoch:
            return parts
        resume = groups["resume"]
        steps, done, scores, prints = (resume[k] for k in ("steps", "batches_done", "scores", "fingerprints"))
        for part in parts:
            part["global_step"] = global_step - int(steps[0])
        rate = float(attrs.get("learning_rate", 0.0))
        if same_size:
            starts = [EpochStart(int(steps[r]), int(done[r]), scores[r].copy(), int(prints[r]), rate)
                      for r in range(size)]
        elif attrs.get("scores_global") and self.strategy.scores_are_global:  # one plan for all ranks
            shard_size = self.strategy.train_shard[1]
            starts = [EpochStart(int(done[0]) // shard_size, int(done[0]), scores[0].copy(), int(prints[0]),
                                 rate) for _ in range(size)]
        else:
            log.warning(f"{point.path} was saved in epoch {point.start_epoch} by {attrs.get('ranks')} ranks "
                        f"each with its own data; with {size} ranks the epoch starts again at its first batch.")
            starts = [EpochStart() for _ in range(size)]
        for part, start in zip(parts, starts):
            part["start"] = start
        return parts

    # ----- within an epoch -----
    def begin_epoch(self, epoch: int, global_step: int) -> None:
        self.epoch, self.global_step = epoch, global_step

    def epoch_start(self, dataset: Dataset, batching: BatchOptions) -> EpochStart:
        """Where this rank starts the epoch (the loop calls this after the epoch's order is fixed)."""
        self._plan = (dataset, batching)
        start = self._resumed if self._resumed_epoch == self.epoch else None
        self._resumed, self._loaded_step = None, None
        if start is None:
            return EpochStart()
        if start.learning_rate is not None and start.learning_rate != self.updater.learning_rate:
            log.warning(f"The mid-epoch checkpoint of epoch {self.epoch} was trained with learning rate "
                        f"{start.learning_rate:g}; the learning-rate control now gives {self.updater.learning_rate:g}"
                        " (was the learning-rate file edited?). Continuing with the new rate.")
        error = None
        if start.fingerprint is not None and start.fingerprint != plan_fingerprint(dataset, batching):
            error = ConfigError(
                f"The mid-epoch checkpoint of epoch {self.epoch} was taken {start.step} steps into a different "
                f"batch plan than this run makes (the corpus, its order, 'random_seed' or the batching keys "
                f"changed), so it cannot continue at its next batch. Restore the old settings, or delete "
                f"the mid-epoch checkpoints {self.prefix}.{self.epoch:03d}.step* to restart the epoch.")
        agree_on_failure(self.comm, error)
        log.info(f"train epoch {self.epoch}: continuing after step {start.step} ({start.skip_batches} batches "
                 "of the epoch's plan done)")
        self._loaded_step = start.step
        return start

    def requests(self, step: int) -> StepRequests:
        due = bool(self.prefix) and step != self._loaded_step and self.schedule.due(self.global_step + step, step)
        return StepRequests(checkpoint=due, stop_signal=preemption.requested_number())

    def at_step_boundary(self, plan: StepPlan, step: int, scores: np.ndarray) -> None:
        """Save the state after ``step`` steps; on a stop request, then end training."""
        path = None
        if self.prefix:
            path = mid_epoch_path(self.prefix, self.epoch, self.global_step + step)
            self._save(path, "mid-epoch", self.global_step + step, self._mid_epoch_part(step, scores))
        if plan.stop_requests:
            self._stop(plan.stop_requests, path, f"epoch {self.epoch}, step {step} of the epoch")

    def _mid_epoch_part(self, step: int, scores: np.ndarray) -> dict:
        return {"steps": step, "batches_done": step * self.strategy.train_shard[1], "scores": scores.copy(),
                "fingerprint": plan_fingerprint(*self._plan)}

    # ----- the end of an epoch -----
    def save_epoch(self, epoch: int, global_step: int) -> str | None:
        if not self.prefix:
            return None
        path = checkpoint_path(self.prefix, epoch)
        self.epoch = epoch
        self._save(path, "epoch", global_step, {})
        return path

    def stop_if_requested(self, epoch: int, global_step: int, saved: str | None) -> None:
        """Between epochs: all ranks learn whether one was asked to stop; if so, save (unless done) and
        end training."""
        stops = agree_on_stop(self.comm, preemption.requested_number())
        if stops:
            self._stop(stops, saved or self.save_epoch(epoch, global_step), f"the end of epoch {epoch}")

    # ----- saving -----
    def _save(self, path: str, kind: str, global_step: int, part: dict) -> None:
        if self.strategy.keeps_rank_state:
            part["optimizer"] = {n: v.numpy() for n, v in self.updater.named_variables().items()}
            if kind == "mid-epoch":
                part["params"] = {n: v.numpy() for n, v in self.model.named_variables().items()}
        parts = self.comm.gather_object(part, root=0) if self.comm.size > 1 else [part]
        error = None
        if self.comm.rank == 0:
            try:
                self._write(path, kind, global_step, parts)
            except Exception as exc:  # agreed below: every rank ends, rank 0 reports
                error = exc
        agree_on_failure(self.comm, error)
        self.schedule.saved()

    def _write(self, path: str, kind: str, global_step: int, parts: list[dict]) -> None:
        history = {str(epoch): [float(data.learning_rate), data.scores]
                   for epoch, data in self.lr_control.epoch_data.items()}
        attrs = {"kind": kind, "ranks": self.comm.size, "scores_global": self.strategy.scores_are_global,
                 "learning_rate_history": json.dumps(history), "learning_rate": self.updater.learning_rate}
        groups = {f"ranks/{rank}/{group}": part[group] for rank, part in enumerate(parts)
                  for group in ("params", "optimizer") if rank > 0 and group in part}
        if kind == "mid-epoch":
            groups["resume"] = {"steps": np.array([p["steps"] for p in parts], np.int64),
                                "batches_done": np.array([p["batches_done"] for p in parts], np.int64),
                                "scores": np.array([p["scores"] for p in parts], np.float64),
                                "fingerprints": np.array([p["fingerprint"] for p in parts], np.int64)}
        save_checkpoint(path, self.model.named_variables(), self.updater.named_variables(), self.epoch,
                        global_step, attrs=attrs, groups=groups)
        removed = remove_superseded(self.prefix, path)
        log.info(f"saved {kind} checkpoint {path}" + (f" (removed {len(removed)} older)" if removed else ""))

    def _stop(self, stops: tuple[tuple[int, int], ...], path: str | None, where: str) -> None:
        import signal

        who = "; ".join(f"{signal.Signals(number).name} received by rank {rank}" for rank, number in stops)
        saved = f"saved checkpoint {path} ({where})" if path else \
            "no checkpoint saved (no 'model' prefix), so a rerun starts afresh"
        line = f"stopping on request: {who}; {saved}; exiting with code 99: run the same command to resume."
        (log.warning if self.comm.rank == 0 else log.info)(line)
        raise TrainingStopped(line)
