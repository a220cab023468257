"""What an epoch reports: steps, scores, frames per second and the share of time spent computing.

computing time = wall time of the step executions (the collective inside the step included) plus
parameter syncs, divided by the wall time since the epoch's data loading started. Below about 90% the
run waits for data or for other ranks. The time in collectives (gradient allreduce, parameter average,
step signal: waiting there for slower ranks included) and waiting for data come from ``engine.report.phases``.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from engine.report import phases
from engine.report.clock import hms
from engine.runtime import log


@dataclass
class Scores:
    """Sums, so that ranks and steps combine by adding (the order of ``SCORE_NAMES``). ``count`` divides
    the loss and error sums (frames for a frame-wise loss, target labels for ctc, as in RETURNN);
    ``frames`` are the input frames, which every rate and frame count reports."""

    loss_sum: float = 0.0
    error_sum: float = 0.0
    count: float = 0.0
    frames: float = 0.0

    def add(self, values: np.ndarray) -> None:
        self.loss_sum += float(values[0])
        self.error_sum += float(values[1])
        self.count += float(values[2])
        self.frames += float(values[3])

    def as_array(self) -> np.ndarray:
        return np.array([self.loss_sum, self.error_sum, self.count, self.frames], dtype=np.float64)

    @property
    def score(self) -> float:
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def error(self) -> float:
        return self.error_sum / self.count if self.count else float("nan")


def layer_lines(name: str, layer_scores: dict[str, Scores]) -> list[str]:
    """RETURNN's scores of the loss layers besides the main one: ``dev: score_<layer> ...
    error_<layer> ...``."""
    return [f"{name}: score_{layer} {scores.score:.6f} error_{layer} {scores.error:.6f}"
            for layer, scores in layer_scores.items()]


class EpochReport:
    """Times one pass over a dataset and prints the progress lines for it."""

    def __init__(self, name: str, expected_seqs: int | None = None) -> None:
        self.name = name  # "train epoch 3" or "epoch 3 'dev' eval"
        self.expected_seqs = expected_seqs
        self.start = time.perf_counter()
        self.finished_after: float | None = None  # the wall time, once finished
        self._phases_at_start = phases.totals()
        self.collective_seconds = 0.0  # set by finish()
        self.data_wait_seconds = 0.0
        self.compute_seconds = 0.0
        self.steps = 0
        self.seqs = 0
        self.scores = Scores()
        self.layer_scores: dict[str, Scores] = {}  # an eval pass: the loss layers besides the main one

    @contextmanager
    def computing(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.compute_seconds += time.perf_counter() - t0

    @property
    def elapsed(self) -> float:
        """Seconds since the start; after ``finish``, the pass's wall time."""
        if self.finished_after is not None:
            return self.finished_after
        return time.perf_counter() - self.start

    def percent(self, seconds: float) -> float:
        """``seconds`` as a share of the elapsed time, in percent."""
        return 100.0 * seconds / max(self.elapsed, 1e-9)

    @property
    def computing_percent(self) -> float:
        return self.percent(self.compute_seconds)

    def step_done(self, num_seqs: int, step_scores: np.ndarray, step_seconds: float) -> None:
        self.steps += 1
        self.seqs += num_seqs
        if log.verbosity() < log.TRACE:
            return
        count = max(float(step_scores[2]), 1.0)
        parts = [f"{self.name}, step {self.steps}", f"score {step_scores[0] / count:.4f}",
                 f"error {step_scores[1] / count:.4f}", f"{step_seconds:.3f} sec/step",
                 f"elapsed {hms(self.elapsed)}"]
        if self.expected_seqs:
            done = min(self.seqs / self.expected_seqs, 1.0)
            if done > 0:
                parts.append(f"exp. remaining {hms(self.elapsed * (1 - done) / done)}")
            parts.append(f"complete {100 * done:.1f}%")
        log.trace(", ".join(parts))

    def finish(self) -> None:
        """The epoch line of distributed-protocol.md, then input frames per second and where the time went."""
        self.finished_after = elapsed = self.elapsed
        self.collective_seconds, self.data_wait_seconds = phases.collective_and_wait_seconds(
            self._phases_at_start, phases.totals())
        log.info(f"{self.name}, finished after {self.steps} steps, {hms(elapsed)} elapsed "
                 f"({self.computing_percent:.1f}% computing time)")
        log.info(f"{self.name}: {self.scores.frames / max(elapsed, 1e-9):.1f} frames/sec "
                 f"({self.scores.frames:.0f} frames, {self.compute_seconds:.2f}s computing); "
                 f"{self.percent(self.collective_seconds):.1f}% in collectives, "
                 f"{self.percent(self.data_wait_seconds):.1f}% waiting for data")
