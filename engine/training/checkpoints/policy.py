"""Saving checkpoints during training and acting at step boundaries: a mid-epoch checkpoint when
``checkpoint_interval`` says so, a stop on request (SIGUSR1, SIGUSR2, SIGTERM: ``stop_requests.py``) after
saving, and continuing a run from a checkpoint. What a checkpoint holds for that: ``resume.py``.

Every rank calls the methods that save or load (they gather or scatter the ranks' parts); rank 0
reads and writes the files, and after a successful save removes the older mid-epoch checkpoints and the
temp files of killed saves.
"""
from __future__ import annotations

import json
import signal
from typing import Any

import numpy as np

from engine.config.loader import Config
from engine.datasets import BatchOptions, Dataset
from engine.distributed.protocol import agree_on_failure, agree_on_stop
from engine.distributed.strategy import StepPlan, StepRequests, Strategy
from engine.runtime import log
from engine.runtime.errors import ConfigError, NonFiniteTrainScore, TrainingStopped
from engine.training.checkpoints.reading import StoredCheckpoint
from engine.training.checkpoints import stop_requests
from engine.training.checkpoints.file_format import (CheckpointInfo, assign_checkpoint, checkpoint_path,
                                                     current_values, mid_epoch_path, remove_superseded,
                                                     save_checkpoint)
from engine.training.checkpoints.interval import CheckpointInterval, CheckpointSchedule
from engine.training.checkpoints.resume import (RANK_GROUPS, SYNC_BASE, EpochStart, ResumePoint,
                                                plan_fingerprint, rank_parts, resume_candidates)
from engine.training.nonfinite import ADVICE, newest_checkpoint_text
from engine.training.update.lr_control import EpochData, LearningRateControl


def _finite(value: Any) -> bool:
    """No Inf or NaN in a floating-point array (other arrays are finite): Inf or NaN anywhere makes the sum
    Inf or NaN, and a float64 sum of float32 (or narrower) values cannot overflow; unlike ``isfinite``, it
    allocates nothing (fresh memory is slow on some virtual machines)."""
    array = np.asarray(value)
    if array.dtype.kind != "f" and array.dtype.name != "bfloat16":
        return True
    if array.dtype.itemsize > 4:
        return bool(np.isfinite(array).all())
    with np.errstate(invalid="ignore"):  # Inf - Inf
        return bool(np.isfinite(array.sum(dtype=np.float64)))


class Checkpointer:
    """Saves checkpoints (every rank calls; rank 0 writes) and continues a run from one."""

    def __init__(self, config: Config, strategy: Strategy, model: Any, updater: Any,
                 lr_control: LearningRateControl) -> None:
        self.prefix = config.str("model")
        self.refuse_nonfinite = config.bool("stop_on_nonfinite_train_score")  # never save an Inf/NaN
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
        self.run_id = ""  # stored in every checkpoint (runs.py); set with the resume point

    # ----- continuing a run -----
    def load(self, point: ResumePoint, stored: StoredCheckpoint) -> CheckpointInfo:
        """Rank 0: the checkpoint's parameters, optimizer state and learning-rate history (the trained
        epochs'; the learning-rate file, loaded afterwards where it exists, wins)."""
        info = assign_checkpoint(stored, self.model.named_variables(), self.updater.named_variables())
        self._loaded = stored.extras()
        history = json.loads(self._loaded[0].get("learning_rate_history", "{}"))
        self.lr_control.epoch_data.update({int(epoch): EpochData(rate, scores)
                                           for epoch, (rate, scores) in history.items() if scores})
        where = f"in epoch {info.epoch} at global step {info.global_step}" if point.mid_epoch \
            else f"after epoch {info.epoch}"
        log.info(f"resuming {where} from {point.path}")
        return info

    def restore_rank_states(self, point: ResumePoint) -> int:
        """Every rank, after rank 0's state was broadcast: each rank's own parameters and optimizer state
        (param mode) and, mid-epoch, where it continues the epoch. Returns the global step at the start
        of ``point.start_epoch``."""
        parts = None
        if self.comm.rank == 0:
            fresh = [{"global_step": 0}] * self.comm.size  # a fresh start (or `load`): nothing per rank
            parts = fresh if self._loaded is None else rank_parts(*self._loaded, point, self.strategy)
        part = self.comm.scatter_object(parts, root=0) if self.comm.size > 1 else parts[0]
        self._loaded = None
        for group, variables in zip(RANK_GROUPS, (self.model.named_variables(),
                                                  self.updater.named_variables())):
            for name, value in part.get(group, {}).items():
                variables[name].assign(value)
        if part.get(SYNC_BASE):  # param mode with a wire format: the base of the next average
            names = list(self.model.named_trainable_variables())
            self._check_sync_base(point, names, part[SYNC_BASE])
            self.strategy.restore_sync_base([part[SYNC_BASE][name] for name in names])
        self._resumed, self._resumed_epoch = part.get("start"), point.start_epoch
        self.run_id = point.run_id
        return part["global_step"]

    def _check_sync_base(self, point: ResumePoint, names: list[str], base: dict) -> None:
        """The base of the next average must cover exactly this model's trainable parameters: a base with
        other names (a layer's ``trainable`` changed since the checkpoint) would average against a wrong
        or missing start. Every rank got the same base and has the same model, so each raises alike."""
        missing, extra = sorted(set(names) - set(base)), sorted(set(base) - set(names))
        if not missing and not extra:
            return
        parts = ([f"lacks {', '.join(missing)}, which this model trains"] if missing else []) + \
            ([f"has {', '.join(extra)}, which this model does not train"] if extra else [])
        error = ConfigError(
            f"Cannot continue from the mid-epoch checkpoint '{point.path}': its base of the next parameter "
            f"average ('{SYNC_BASE}', param mode with distributed_wire_format) {' and '.join(parts)}. The "
            "set of trainable parameters changed since it was saved (a layer's 'trainable'?): restore the "
            "config it was saved with, or continue from the end of the epoch before (move the mid-epoch "
            "checkpoints aside).")
        error.agreed, error.quiet = True, self.comm.rank != 0
        raise error

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
        rate = self.updater.learning_rate
        if start.learning_rate is not None and start.learning_rate != rate:
            log.warning(f"The mid-epoch checkpoint of epoch {self.epoch} was trained with learning rate "
                        f"{start.learning_rate:g}; the learning-rate control now gives {rate:g} (was the "
                        "learning-rate file edited?). Continuing with the new rate.")
        error = None
        if start.fingerprint is not None and start.fingerprint != plan_fingerprint(dataset, batching):
            error = ConfigError(
                f"The mid-epoch checkpoint of epoch {self.epoch} was taken {start.step} steps into a "
                "different batch plan than this run makes (the corpus, its order, 'random_seed' or the "
                "batching keys changed), so it cannot continue at its next batch. Restore the old settings, "
                f"or delete the mid-epoch checkpoints {self.prefix}.{self.epoch:03d}.step* to restart the "
                "epoch.")
        agree_on_failure(self.comm, error)
        log.info(f"train epoch {self.epoch}: continuing after step {start.step} ({start.skip_batches} "
                 "batches of the epoch's plan done)")
        self._loaded_step = start.step
        return start

    def requests(self, step: int) -> StepRequests:
        due = bool(self.prefix) and step != self._loaded_step  # not again for the state just loaded
        due = due and self.schedule.due(self.global_step + step, step)
        return StepRequests(checkpoint=due, stop_signal=stop_requests.requested_number())

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
        stops = agree_on_stop(self.comm, stop_requests.requested_number())
        if stops:
            self._stop(stops, saved or self.save_epoch(epoch, global_step), f"the end of epoch {epoch}")

    # ----- saving -----
    def _save(self, path: str, kind: str, global_step: int, part: dict) -> None:
        if self.strategy.keeps_rank_state:
            part["optimizer"] = current_values(self.updater.named_variables())
            if kind == "mid-epoch":
                part["params"] = current_values(self.model.named_variables())
        # Every rank comes here at the same agreed point and waits below for rank 0 to write, which on slow
        # storage may take longer than distributed_stall_timeout: the checkpoint window's own limit applies.
        with self.comm.checkpoint_window():
            parts = self.comm.gather_object(part, root=0) if self.comm.size > 1 else [part]
            error = None
            if self.comm.rank == 0:
                try:
                    self._write(path, kind, global_step, parts)
                except Exception as exc:  # agreed below: every rank ends, rank 0 reports
                    error = exc
            self.comm.barrier()  # the others wait for the write here, without spinning a core as MPI would
            agree_on_failure(self.comm, error)
        self.schedule.saved()

    def newest_checkpoint(self) -> str | None:
        """The checkpoint a rerun with ``start_epoch = "auto"`` would continue from (rank 0's files)."""
        if not self.prefix:
            return None
        candidates = resume_candidates(self.prefix)
        return candidates[0].path if candidates else None

    def _check_finite(self, path: str, parts: list[dict]) -> None:
        """With stop_on_nonfinite_train_score: refuse to write a checkpoint that holds an Inf or NaN (the
        parameters or optimizer state of any rank; an update's overflow, an average's)."""
        values = current_values({**self.model.named_variables(), **self.updater.named_variables()})
        bad = [name for name, value in values.items() if not _finite(value)]
        bad += [f"{name} (rank {rank})" for rank, part in enumerate(parts) for group in RANK_GROUPS
                for name, value in part.get(group, {}).items() if not _finite(value)]
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise NonFiniteTrainScore(
                f"stop_on_nonfinite_train_score: not saving checkpoint '{path}': {shown} hold Inf or NaN "
                f"(in train epoch {self.epoch}). Training stops; the checkpoints saved before are untouched. "
                f"{newest_checkpoint_text(self.prefix, self.newest_checkpoint())} {ADVICE}")

    def _write(self, path: str, kind: str, global_step: int, parts: list[dict]) -> None:
        if self.refuse_nonfinite:
            self._check_finite(path, parts)
        history = {str(epoch): [float(data.learning_rate), data.scores]
                   for epoch, data in self.lr_control.epoch_data.items()}
        attrs = {"kind": kind, "ranks": self.comm.size, "scores_global": self.strategy.scores_are_global,
                 "run_id": self.run_id,
                 "learning_rate_history": json.dumps(history), "learning_rate": self.updater.learning_rate}
        groups = {f"ranks/{rank}/{group}": part[group] for rank, part in enumerate(parts)
                  for group in RANK_GROUPS if rank > 0 and group in part}
        base = self.strategy.sync_base() if kind == "mid-epoch" else None  # at an epoch's end: the params
        if base is not None:
            groups[SYNC_BASE] = dict(zip(self.model.named_trainable_variables(), base))
        if kind == "mid-epoch":
            groups["resume"] = {"steps": np.array([p["steps"] for p in parts], np.int64),
                                "batches_done": np.array([p["batches_done"] for p in parts], np.int64),
                                "scores": np.array([p["scores"] for p in parts], np.float64),
                                "fingerprints": np.array([p["fingerprint"] for p in parts], np.int64)}
        save_checkpoint(path, self.model.named_variables(), self.updater.named_variables(), self.epoch,
                        global_step, attrs=attrs, groups=groups)
        removed = remove_superseded(self.prefix, path)
        what = "saved model to" if kind == "epoch" else f"saved {kind} checkpoint"  # RETURNN-like epoch line
        log.info(f"{what} {path}" + (f" (removed {len(removed)} older)" if removed else ""))

    def _stop(self, stops: tuple[tuple[int, int], ...], path: str | None, where: str) -> None:
        who = "; ".join(f"{signal.Signals(number).name} received by rank {rank}" for rank, number in stops)
        saved = f"saved checkpoint {path} ({where})" if path else \
            "no checkpoint saved (no 'model' prefix), so a rerun starts afresh"
        line = f"stopping on request: {who}; {saved}; exiting with code 99: run the same command to resume."
        (log.warning if self.comm.rank == 0 else log.info)(line)
        raise TrainingStopped(line)
