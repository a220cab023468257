"""What a training run shows besides the epoch lines: progress, TensorBoard curves, the step timeline of
every rank and the end-of-run summary (``docs/monitoring.md``).

The trainer makes one ``RunMonitor`` and calls it at a few points; it drives the components of
``engine.report`` and ``engine.report.timeline``:

    monitor = RunMonitor(config, comm, lr_control)     # every rank: reads and checks the keys
    with monitor.running(resume_step, epochs):          # timeline on; at the end: merged, summary
        monitor.epoch_started(epoch, planned_steps, learning_rate)   # the progress bar or lines
        monitor.step_done(step_scores)                   # progress, TensorBoard train/*
        monitor.epoch_trained()                          # the bar goes, the epoch lines come
        monitor.epoch_done(epoch, report, scores)        # TensorBoard epoch/*, the summary's row

Progress, TensorBoard and the summary are rank 0's; the timeline is every rank's: at the end every
rank stops recording, the ranks meet, and rank 0 merges the parts into the one file. With
``store_tf_profile``, TensorFlow's profiler records each epoch's steps on every rank
(``engine/report/tf_profile.py``). When the run fails, every rank only stops recording: the parts
stay (``tools/merge_timeline.py`` merges them), and the progress bar goes so that the error message is
readable.
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

import numpy as np

from engine.config.loader import Config
from engine.distributed.backend import Communicator
from engine.distributed.protocol import SCORE_NAMES
from engine.report import timeline
from engine.report.progress import Progress, interval_from_config
from engine.report.summary import EpochRecord, summary_text
from engine.report.tensorboard import TensorBoardWriter, settings_from_config
from engine.report.tf_profile import EpochProfiler
from engine.runtime import log
from engine.runtime.errors import EngineError
from engine.training.checkpoints.file_format import checkpoint_path, find_newest_epoch
from engine.training.report import EpochReport
from engine.training.update.lr_control import LearningRateControl


class RunMonitor:
    def __init__(self, config: Config, comm: Communicator, lr_control: LearningRateControl) -> None:
        self.comm = comm
        self.lr_control = lr_control
        self.is_main = comm.rank == 0
        self.model_prefix = config.str("model")
        self.timeline_file = timeline.path_from(config.str(timeline.CONFIG_KEY))
        if self.timeline_file:
            timeline.expect_recording()  # the steps are traced before the run starts
        self.progress_interval = interval_from_config(config)
        self.tensorboard_settings = settings_from_config(config)
        self.tensorboard: TensorBoardWriter | None = None
        self.profiler = EpochProfiler.from_config(config, comm.rank, comm.size)
        self.progress: Progress | None = None
        self.records: list[EpochRecord] = []
        self.global_step = 0
        self.learning_rate = 0.0
        self._epoch_scores = np.zeros(len(SCORE_NAMES))  # the sums of the epoch so far
        self._steps_in_epoch = 0
        self._last_step_end = 0.0

    @contextlib.contextmanager
    def running(self, resume_step: int, epochs: range) -> Iterator[None]:
        """The run, resumed after global step ``resume_step`` (0: a fresh run), training ``epochs``;
        nothing is shown or recorded when ``epochs`` is empty (the model is trained already)."""
        if not epochs:
            yield
            return
        started = time.perf_counter()
        self.global_step = resume_step
        if self.timeline_file:
            timeline.start(self.timeline_file, self.comm.rank, self.comm.size)
        if self.is_main and self.tensorboard_settings is not None:
            log_dir, interval = self.tensorboard_settings
            self.tensorboard = TensorBoardWriter(log_dir, step_interval=interval, resume_step=resume_step,
                                                 resume_epoch=epochs.start - 1)
        try:
            yield
        except BaseException:
            self._close()
            timeline.stop()
            raise
        self._close()
        self._merge_timeline()
        if self.is_main:
            log.info(self._summary(time.perf_counter() - started))

    # ----- calls from the epoch loop -----
    def epoch_started(self, epoch: int, planned_steps: int, learning_rate: float) -> None:
        self.learning_rate = learning_rate
        self._epoch_scores[:] = 0.0
        self._steps_in_epoch = 0
        self._last_step_end = time.perf_counter()
        if self.is_main:
            self.progress = Progress(f"train epoch {epoch}", planned_steps, interval=self.progress_interval)
        if self.profiler is not None:
            self.profiler.start(epoch)

    def step_done(self, scores: np.ndarray) -> None:
        """After each step, with its [loss sum, error sum, count, input frames] (the reduced ones where the
        strategy reduces them): scores divide by the count, rates count the input frames."""
        self.global_step += 1
        if not self.is_main:
            return
        self._steps_in_epoch += 1
        self._epoch_scores += scores
        loss_sum, _, count, frames = self._epoch_scores
        if self.progress is not None:
            self.progress.update(self._steps_in_epoch, frames, loss_sum / count if count else None)
        now = time.perf_counter()
        if self.tensorboard is not None and self.tensorboard.wants_step(self.global_step):
            step_count = max(float(scores[2]), 1.0)
            self.tensorboard.step(self.global_step, score=scores[0] / step_count,
                                  error=scores[1] / step_count, learning_rate=self.learning_rate,
                                  frames_per_sec=scores[3] / max(now - self._last_step_end, 1e-9))
        self._last_step_end = now

    def epoch_trained(self) -> None:
        """The epoch's steps are done: the bar goes before the epoch lines are printed."""
        if self.profiler is not None:
            self.profiler.stop()
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    # ----- a call from the trainer -----
    def epoch_done(self, epoch: int, report: EpochReport, scores: dict[str, float]) -> None:
        """The epoch is scored (train and dev) and saved: its curves and its row of the summary."""
        if not self.is_main:
            return
        record = EpochRecord(epoch, report.elapsed, report.scores.frames, report.compute_seconds,
                             report.collective_seconds, report.data_wait_seconds, dict(scores))
        self.records.append(record)
        if self.tensorboard is not None:
            self.tensorboard.epoch(epoch, scores, learning_rate=self.learning_rate,
                                   frames_per_sec=record.frames_per_sec,
                                   computing_percent=report.computing_percent,
                                   collective_percent=report.percent(report.collective_seconds),
                                   data_wait_percent=report.percent(report.data_wait_seconds))

    # ----- the end -----
    def _close(self) -> None:
        self.epoch_trained()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def _merge_timeline(self) -> None:
        if not self.timeline_file:
            return
        timeline.stop()
        self.comm.barrier()  # every rank's part is complete
        if not self.is_main:
            return
        try:
            merged = timeline.merge(self.timeline_file, self.comm.size)
        except (EngineError, OSError) as exc:
            log.warning(f"The timeline could not be merged ({exc}); the ranks' part files stay, merge them "
                        f"with tools/merge_timeline.py {self.timeline_file}.")
            return
        if merged.missing_ranks:
            log.warning(f"Timeline {self.timeline_file}: no part file of rank(s) "
                        f"{', '.join(map(str, merged.missing_ranks))}; their spans are missing.")
        log.debug(f"timeline: {merged.events} spans of {len(merged.ranks)} rank(s) in {self.timeline_file}")

    def _summary(self, total_seconds: float) -> str:
        last = max((record.epoch for record in self.records), default=None)
        history = {epoch: data.scores for epoch, data in self.lr_control.epoch_data.items()
                   if data.scores and (last is None or epoch <= last)}  # later ones are another run's
        best_key = self.lr_control.score(max(history))[0] if history else None
        newest = find_newest_epoch(self.model_prefix) if self.model_prefix else None
        return summary_text(
            self.records, total_seconds=total_seconds, history=history, best_key=best_key or "dev_score",
            model=checkpoint_path(self.model_prefix, newest) if newest is not None else None,
            tensorboard_dir=self.tensorboard_settings[0] if self.tensorboard_settings else None,
            timeline_file=self.timeline_file)
