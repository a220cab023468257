"""Exact resume: where a run continues, what a training checkpoint holds for that, and how its parts
are dealt out to the ranks. ``policy.py`` writes these checkpoints and acts at step boundaries.

Besides the parameters and the optimizer state (whose update count keys dropout's random numbers, so
those need no saved state), a checkpoint written here holds (attribute / group names in quotes):
- "kind" (``epoch`` or ``mid-epoch``), "ranks", "scores_global", "run_id" (``runs.py``), the
  learning-rate history ("learning_rate_history", JSON, used when the learning-rate file does not exist);
- mid-epoch: "learning_rate" (the one in use) and group "resume" with per rank the train steps done in
  the epoch ("steps"), the batches of the epoch's plan trained by then ("batches_done"), the score sums
  so far ("scores": a row of ``SCORE_NAMES`` per rank; older files lack the input frames) and a
  fingerprint of the epoch's batch plan ("fingerprints": data order, lengths and batching, so a resume
  into a changed corpus or config is refused instead of silently training other data); the order's seed
  is part of the order;
- in param mode (``Strategy.keeps_rank_state``), the optimizer state of ranks 1.. ("ranks/<r>/optimizer")
  and, mid-epoch, their parameters ("ranks/<r>/params"); rank 0's are the file's main groups. With a
  16-bit ``distributed_wire_format``, mid-epoch also the parameters of the last average ("param_sync_base",
  the same on every rank: the next average reduces the change from them). Without it (files from before,
  another number of ranks) every rank takes rank 0's parameters as that base.

Where a run continues (``choose_resume_point``): the newest checkpoint that can be used; a damaged one
(``reading.py``) is named in a warning and the one before it taken. Rank 0 decides, reads and
writes the files; the decision is broadcast, the per-rank parts travel by ``gather_object``/
``scatter_object``.
A checkpoint saved by another number of ranks continues with rank 0's parameters and optimizer state;
mid-epoch, at the same position when all ranks train one batch plan and report global scores (grad
mode, one process), else (param mode) at the start of that epoch.
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field, replace

import numpy as np

from engine.config.loader import Config
from engine.datasets import BatchOptions, Dataset
from engine.distributed.protocol import SCORE_NAMES
from engine.distributed.strategy import Strategy
from engine.runtime import log
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.reading import (CheckpointDamaged, StoredCheckpoint, missing_part,
                                                 read_checkpoint)
from engine.training.checkpoints.runs import MOVE_KEY, later_files, new_run_id, refuse_or_move
from engine.training.checkpoints.file_format import checkpoint_path, find_epochs, find_mid_epoch_checkpoints

RANK_GROUPS = ("params", "optimizer")  # what each rank keeps of its own in param mode
SYNC_BASE = "param_sync_base"  # param mode with a wire format, mid-epoch: the base of the next average


@dataclass
class EpochStart:
    """Where this rank continues an epoch."""

    step: int = 0  # train steps this rank has done in the epoch
    skip_batches: int = 0  # batches of the epoch's plan trained already (by all ranks)
    scores: np.ndarray = field(default_factory=lambda: np.zeros(len(SCORE_NAMES)))  # the sums so far
    fingerprint: int | None = None  # of the plan the steps were taken from; None: nothing to check
    learning_rate: float | None = None  # the one the steps were taken with


@dataclass(frozen=True)
class ResumePoint:
    start_epoch: int
    path: str | None = None  # the checkpoint to continue from (None: start afresh, or from `load`)
    mid_epoch: bool = False
    run_id: str = ""  # of the run this start continues or begins (runs.py)


def resume_candidates(prefix: str) -> list[ResumePoint]:
    """Every checkpoint of ``prefix`` as a point to continue from, the newest position first: the end of
    epoch N (``<model>.<NNN>``) comes after the steps of epoch N (``<model>.<NNN>.step<S>``), which come
    after the end of epoch N - 1. The first is where "auto" continues; the others are its fallbacks."""
    epochs = [((e, 0, 0), ResumePoint(e + 1, checkpoint_path(prefix, e))) for e in find_epochs(prefix)]
    mids = [((e - 1, 1, step), ResumePoint(e, path, mid_epoch=True))
            for e, step, path in find_mid_epoch_checkpoints(prefix)]
    return [point for _, point in sorted(epochs + mids, key=lambda item: item[0], reverse=True)]


def choose_resume_point(config: Config,
                        lr_file: str | None) -> tuple[ResumePoint, StoredCheckpoint | None]:
    """Rank 0: where training starts, with the checkpoint it continues from, read whole. ``start_epoch``
    "auto": the newest usable checkpoint (a damaged one is named in a warning and the one before it
    taken, within the run of the newest one); an explicit N: ``<model>.<N-1>``. A start that does not
    continue from the newest files deals with later ones as ``runs.py`` says."""
    start = config.typed("start_epoch")
    prefix = config.str("model")
    move = config.bool(MOVE_KEY)
    stored = None
    if start not in ("auto", None):
        epoch = config.int("start_epoch")
        if epoch < 1:
            raise ConfigError(f"Config key 'start_epoch' must be 'auto' or >= 1, got {epoch}.")
        if epoch > 1 and not prefix:
            raise ConfigError(f"start_epoch is {epoch}, but no 'model' prefix is set to load the previous "
                              "epoch's checkpoint from.")
        point = ResumePoint(epoch, checkpoint_path(prefix, epoch - 1) if epoch > 1 else None)
        if point.path:
            stored = _read_to_continue(point)
    else:
        point, stored = _newest_usable(prefix, move) if prefix else (ResumePoint(1), None)
    if stored is None or start not in ("auto", None):
        refuse_or_move(later_files(prefix, lr_file, point.start_epoch), prefix, move, point.path)
    return replace(point, run_id=(stored.run_id if stored else None) or new_run_id()), stored


def _read_to_continue(point: ResumePoint) -> StoredCheckpoint:
    if not os.path.isfile(point.path):
        raise ConfigError(f"Checkpoint '{point.path}' does not exist (start_epoch = {point.start_epoch}).")
    stored = read_checkpoint(point.path)
    if problem := missing_part(stored, point.mid_epoch):
        raise CheckpointDamaged(point.path, problem)
    return stored


def _newest_usable(prefix: str, move: bool) -> tuple[ResumePoint, StoredCheckpoint | None]:
    damaged: list[CheckpointDamaged] = []
    seen, run_id = False, None  # the run id of the newest checkpoint whose attributes could be read
    for point in resume_candidates(prefix):
        try:
            stored = read_checkpoint(point.path)  # a transient error or a foreign file ends the start
            if not seen:
                seen, run_id = True, stored.run_id
            elif stored.run_id and run_id and stored.run_id != run_id:  # no id: from before run ids
                log.warning(f"Checkpoint '{point.path}' belongs to another run (run id {stored.run_id}) than "
                            f"the newest one (run id {run_id}): not falling back to it.")
                continue
            if problem := missing_part(stored, point.mid_epoch):
                raise CheckpointDamaged(point.path, problem)
        except CheckpointDamaged as exc:
            damaged.append(exc)
            log.warning(f"{exc} Falling back to the checkpoint before it.")
            continue
        return point, stored
    if damaged and not move:
        raise ConfigError(f"No usable checkpoint under the model prefix '{prefix}': "
                          + "; ".join(f"'{d.path}': {d.reason}" for d in damaged)
                          + f". Delete or move these files to start afresh, or set {MOVE_KEY} = True to have "
                            "them moved aside.")
    return ResumePoint(1), None


def plan_fingerprint(dataset: Dataset, batching: BatchOptions) -> int:
    """crc32 of the epoch's data order, sequence lengths, chunking and batching options (the batch plan's
    inputs)."""
    crc = zlib.crc32(np.ascontiguousarray(dataset.order, np.int64).tobytes())
    crc = zlib.crc32(np.ascontiguousarray(dataset.epoch_seq_lengths(), np.int64).tobytes(), crc)
    return zlib.crc32(repr((batching, getattr(dataset, "chunking", None))).encode(), crc)


def rank_parts(attrs: dict, groups: dict, point: ResumePoint, strategy: Strategy) -> list[dict]:
    """Rank 0: what each rank takes from a loaded checkpoint (``StoredCheckpoint.extras``): its own
    parameters and optimizer state ("params", "optimizer"), "global_step" at the start of the epoch it
    continues, and mid-epoch its "start" in that epoch."""
    size = strategy.comm.size
    saved_by = int(attrs.get("ranks", 1))
    global_step = int(attrs.get("global_step", 0))
    parts = [{"global_step": global_step} for _ in range(size)]
    if saved_by == size and strategy.keeps_rank_state:
        for rank in range(1, size):
            parts[rank].update({group: groups.get(f"ranks/{rank}/{group}", {}) for group in RANK_GROUPS})
        if point.mid_epoch and groups.get(SYNC_BASE):
            for part in parts:
                part[SYNC_BASE] = groups[SYNC_BASE]
    elif saved_by != size and (strategy.keeps_rank_state or "ranks/1/optimizer" in groups):
        log.warning(f"{point.path} was saved by {saved_by} ranks, this job has {size}: every rank continues "
                    "with rank 0's parameters and optimizer state.")
    if point.mid_epoch:
        resume = groups["resume"]
        for part, start in zip(parts, _epoch_starts(attrs, resume, point, strategy)):
            part["global_step"], part["start"] = global_step - int(resume["steps"][0]), start
    return parts


def _epoch_starts(attrs: dict, resume: dict, point: ResumePoint, strategy: Strategy) -> list[EpochStart]:
    size, saved_by = strategy.comm.size, int(attrs.get("ranks", 1))
    steps, done, scores, prints = (resume[k] for k in ("steps", "batches_done", "scores", "fingerprints"))
    rate = float(attrs["learning_rate"])
    if saved_by == size:
        return [EpochStart(int(steps[r]), int(done[r]), _score_sums(scores[r]), int(prints[r]), rate)
                for r in range(size)]
    if attrs.get("scores_global") and strategy.scores_are_global:  # one batch plan for all ranks
        shard_size = strategy.train_shard[1]
        return [EpochStart(int(done[0]) // shard_size, int(done[0]), _score_sums(scores[0]), int(prints[0]),
                           rate) for _ in range(size)]
    log.warning(f"{point.path} was saved in epoch {point.start_epoch} by {saved_by} ranks that did not "
                f"train one batch plan together; with {size} ranks the epoch starts again at its first "
                "batch.")
    return [EpochStart() for _ in range(size)]


def _score_sums(saved: np.ndarray) -> np.ndarray:
    """A rank's saved score sums as a vector of ``SCORE_NAMES``. Checkpoints from before the input frames
    were counted hold [loss, error, count]; their input frames are taken to be the count, which they are
    for frame-wise losses (with ctc the epoch's frames/sec then counts labels for the steps before)."""
    saved = np.asarray(saved, np.float64)
    if len(saved) == len(SCORE_NAMES) - 1:
        return np.append(saved, saved[2])
    return saved.copy()
