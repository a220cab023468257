"""The end-of-run summary on rank 0: what the run did, how fast, where the time went, what it gave.

    Run summary: 3 epochs in this run (epochs 4-6), 0:07:05 in all.
      epoch      time  frames/s  computing  collectives  data wait  train_score    dev_score
          4   0:01:40    1000.0      90.0%         5.0%       1.0%       2.0000       1.8000
          5   0:01:40    2000.0      90.0%         5.0%       1.0%       1.0000       1.5000
          6   0:03:20    3000.0      90.0%         5.0%       1.0%       0.6667       1.6000
        all   0:06:40    2000.0      90.0%         5.0%       1.0%
      best dev_score: 1.5000 in epoch 5 (dev_error 0.1500)
      model: out/model.006
      TensorBoard: out/tensorboard (tensorboard --logdir out/tensorboard)
      timeline: out/timeline.json (open it in https://ui.perfetto.dev or chrome://tracing)

The ``all`` row: total time, frames/s as the mean of the epochs' frames/s, and the time shares of all
epochs together. The best score is the lowest ``best_key`` over the history up to this run's last
epoch when one is given (a resumed run's earlier epochs included; later ones are not this run's: a
learning-rate file that another run took further), else over this run's epochs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from engine.report.clock import hms


@dataclass
class EpochRecord:
    """One trained epoch: wall time, train input frames, time in compute / collectives / waiting for data
    (seconds), and its scores as the learning-rate file names them (``train_score``, ``dev_score``, ...)."""

    epoch: int
    seconds: float
    frames: float
    compute_seconds: float
    collective_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def frames_per_sec(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole > 0 else "-"


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _best(history: Mapping[int, Mapping[str, float]], key: str) -> tuple[int, float] | None:
    candidates = [(scores[key], epoch) for epoch, scores in history.items() if key in scores]
    if not candidates:
        return None
    value, epoch = min(candidates)
    return epoch, value


def summary_text(records: Sequence[EpochRecord], *, total_seconds: float,
                 history: Mapping[int, Mapping[str, float]] | None = None, best_key: str = "dev_score",
                 model: str | None = None, tensorboard_dir: str | None = None,
                 timeline_file: str | None = None, max_rows: int = 20) -> str:
    """The summary (module docstring) of this run's ``records``; paths left None are not shown.
    More than ``max_rows`` epochs: the table shows the last ``max_rows``."""
    records = sorted(records, key=lambda r: r.epoch)
    if records:
        span = f"epoch {records[0].epoch}" if len(records) == 1 else \
            f"epochs {records[0].epoch}-{records[-1].epoch}"
        lines = [f"Run summary: {len(records)} epoch{'s' * (len(records) != 1)} in this run ({span}), "
                 f"{hms(total_seconds)} in all."]
    else:
        lines = [f"Run summary: no epoch trained in this run, {hms(total_seconds)} in all."]
    header = f"  {'epoch':>5}  {'time':>8}  {'frames/s':>8}  {'computing':>9}  {'collectives':>11}  " \
             f"{'data wait':>9}  {'train_score':>11}  {best_key:>11}"
    if records:
        lines.append(header)
        if len(records) > max_rows:
            lines.append(f"  ({len(records) - max_rows} earlier epochs not shown)")
        for r in records[-max_rows:]:
            lines.append(f"  {r.epoch:>5}  {hms(r.seconds):>8}  {r.frames_per_sec:>8.1f}  "
                         f"{_percent(r.compute_seconds, r.seconds):>9}  "
                         f"{_percent(r.collective_seconds, r.seconds):>11}  "
                         f"{_percent(r.data_wait_seconds, r.seconds):>9}  "
                         f"{_score(r.scores.get('train_score')):>11}  {_score(r.scores.get(best_key)):>11}")
        seconds = sum(r.seconds for r in records)
        mean_fps = sum(r.frames_per_sec for r in records) / len(records)
        lines.append(f"  {'all':>5}  {hms(seconds):>8}  {mean_fps:>8.1f}  "
                     f"{_percent(sum(r.compute_seconds for r in records), seconds):>9}  "
                     f"{_percent(sum(r.collective_seconds for r in records), seconds):>11}  "
                     f"{_percent(sum(r.data_wait_seconds for r in records), seconds):>9}")
    scores = history if history is not None else {r.epoch: r.scores for r in records}
    if records:
        scores = {epoch: values for epoch, values in scores.items() if epoch <= records[-1].epoch}
    best = _best(scores, best_key)
    if best is None:
        lines.append(f"  best {best_key}: none (no epoch has one)")
    else:
        epoch, value = best
        error_key = best_key.replace("score", "error")
        error = scores[epoch].get(error_key) if error_key != best_key else None
        extra = f" ({error_key} {error:.4f})" if error is not None else ""
        lines.append(f"  best {best_key}: {value:.4f} in epoch {epoch}{extra}")
    if model:
        lines.append(f"  model: {model}")
    if tensorboard_dir:
        lines.append(f"  TensorBoard: {tensorboard_dir} (tensorboard --logdir {tensorboard_dir})")
    if timeline_file:
        lines.append(f"  timeline: {timeline_file} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return "\n".join(lines)
