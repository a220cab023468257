"""Learning-rate control: the rate for each epoch from the config and the scores of past epochs, by
RETURNN's rules (``returnn/learning_rate_control.py``).

``learning_rate_control``:
- ``constant``: ``learning_rate`` (or the last rate used) every epoch.
- ``newbob`` / ``newbob_rel``: once the two previous epochs have scores, their relative change
  (new - old) / |new| (``newbob_relative_error_div_by_old``: / |old|) decides: above
  ``newbob_relative_error_threshold`` (-0.01: less than 1% better) the last rate is decayed, else grown.
- ``newbob_abs``: the same with the absolute change new - old and ``newbob_error_threshold``.
- ``newbob_multi_epoch``: every ``newbob_multi_update_interval`` epochs (default
  ``newbob_multi_num_epochs``; epochs 1, 1 + N, 1 + 2N, ...), the mean of the relative changes between the
  last ``newbob_multi_num_epochs`` + 1 epochs decides: decay above ``newbob_relative_error_threshold``,
  grow below ``newbob_relative_error_grow_threshold`` (default: the same threshold); in between, and
  between update epochs, the most recent rate carries on.
Decaying multiplies by ``newbob_learning_rate_decay`` and never goes below ``min_learning_rate``;
growing multiplies by ``newbob_learning_rate_growth`` (1.0: no change).
For all of them: ``learning_rate_control_relative_error_relative_lr`` divides a relative change by
(the most recent rate / ``learning_rate``); ``learning_rate_control_min_num_epochs_per_new_lr`` N > 1
keeps a rate until the last N epochs all used it. The score compared is chosen as RETURNN's
``get_error_key`` does: ``learning_rate_control_error_measure`` (a key or a list of keys, each also
with ``_output``), else ``dev_score``, other ``dev_*`` scores, ``train_score``, else the first key.
RETURNN names its scores per loss layer (``dev_score_<layer>``, ``dev_error_<layer>``); this engine
reports the main loss layer's as ``dev_score`` and ``dev_error``: ``resolve_layer_keys`` reads a measure
naming that layer as those keys, and refuses one naming another loss layer, whose score is not reported.
``learning_rates`` (a list for epochs 1, 2, ... or a dict epoch -> rate) fixes the rates of those
epochs, overriding the control.

The history lives in ``learning_rate_file`` [``<model>.learning_rates``] (``lr_history.py``); ``save``
writes it atomically, and who saves (rank 0) is the caller's decision.
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

from engine.runtime import log
from engine.runtime.atomic_file import write_text_atomically
from engine.runtime.errors import ConfigError
from engine.training.update.lr_history import (EpochData, format_history, learning_rate_file, parse_history,
                                               read_history_file)

__all__ = ["LearningRateControl", "EpochData", "KINDS", "parse_history"]  # the file format: lr_history.py

# RETURNN's key of one loss layer's score or error on one dataset: dev_score_output, dev_other_error_ctc
_LAYER_KEY = re.compile(r"(?P<dataset>.+?)_(?P<kind>score|error)_(?P<layer>.+)")

KINDS = {
    "constant": "constant",
    "newbob": "newbob_rel",
    "newbob_rel": "newbob_rel",
    "newbob_relative": "newbob_rel",
    "newbob_abs": "newbob_abs",
    "newbob_multi_epoch": "newbob_multi_epoch",
}


class LearningRateControl:
    """The learning-rate history (``epoch_data``) and the rule that extends it epoch by epoch."""

    def __init__(
        self,
        kind: str = "constant",
        *,
        default_learning_rate: float = 1.0,
        learning_rates: list[float] | dict[int, float] | None = None,
        decay: float = 0.5,
        growth: float = 1.0,
        relative_error_threshold: float = -0.01,
        grow_threshold: float | None = None,
        error_threshold: float = -0.01,
        relative_error_div_by_old: bool = False,
        relative_error_relative_lr: bool = False,
        min_epochs_per_new_rate: int = 0,
        multi_num_epochs: int = 5,
        multi_update_interval: int | None = None,
        min_learning_rate: float = 0.0,
        error_measure: str | list[str] | None = None,
        filename: str | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ConfigError(
                f"Config key 'learning_rate_control': unknown value {kind!r}; known: {', '.join(KINDS)}."
            )
        self.kind = KINDS[kind]
        self.default_learning_rate = float(default_learning_rate)
        self.decay, self.growth = float(decay), float(growth)
        self.relative_error_threshold = float(relative_error_threshold)
        self.grow_threshold = (self.relative_error_threshold if grow_threshold is None
                               else float(grow_threshold))
        self.error_threshold = float(error_threshold)
        self.relative_error_div_by_old = relative_error_div_by_old
        self.relative_error_relative_lr = relative_error_relative_lr
        self.min_epochs_per_new_rate = min_epochs_per_new_rate
        self.multi_num_epochs = multi_num_epochs
        self.multi_update_interval = (multi_num_epochs if multi_update_interval is None
                                      else multi_update_interval)
        self.min_learning_rate = float(min_learning_rate)
        self.error_measure = error_measure
        self.filename = filename
        self._check()
        self.fixed = _fixed_rates(learning_rates)
        self.epoch_data: dict[int, EpochData] = {}
        self._apply_fixed()

    def _check(self) -> None:
        for key, value in (("newbob_multi_num_epochs", self.multi_num_epochs),
                           ("newbob_multi_update_interval", self.multi_update_interval)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"Config key '{key}' must be an integer >= 1, got {value!r}.")
        if self.kind == "newbob_multi_epoch" and self.grow_threshold > self.relative_error_threshold:
            raise ConfigError(
                f"newbob_relative_error_grow_threshold ({self.grow_threshold}) is above "
                f"newbob_relative_error_threshold ({self.relative_error_threshold}): a change between them "
                "would both decay and grow the learning rate.")
        measure = self.error_measure
        if not (measure is None or isinstance(measure, str)
                or (isinstance(measure, list) and measure and all(isinstance(k, str) for k in measure))):
            raise ConfigError(f"Config key 'learning_rate_control_error_measure' must be a score name or a "
                              f"list of them, got {measure!r}.")

    @classmethod
    def from_config(cls, config) -> "LearningRateControl":
        """Reads the keys in the module docstring; does not load the file (call ``load`` on resume)."""
        return cls(
            config.str("learning_rate_control"),
            default_learning_rate=config.float("learning_rate"),
            learning_rates=config.typed("learning_rates"),
            decay=config.float("newbob_learning_rate_decay"),
            growth=config.float("newbob_learning_rate_growth"),
            relative_error_threshold=config.float("newbob_relative_error_threshold"),
            grow_threshold=config.float("newbob_relative_error_grow_threshold"),
            error_threshold=config.float("newbob_error_threshold"),
            relative_error_div_by_old=config.bool("newbob_relative_error_div_by_old"),
            relative_error_relative_lr=config.bool("learning_rate_control_relative_error_relative_lr"),
            min_epochs_per_new_rate=config.int("learning_rate_control_min_num_epochs_per_new_lr"),
            multi_num_epochs=config.int("newbob_multi_num_epochs"),
            multi_update_interval=config.int("newbob_multi_update_interval"),
            min_learning_rate=config.float("min_learning_rate"),
            error_measure=config.typed("learning_rate_control_error_measure"),
            filename=learning_rate_file(config),
        )

    def _apply_fixed(self) -> None:
        """Config ``learning_rates`` win, except for epochs the history shows as trained (with scores)."""
        for epoch, rate in self.fixed.items():
            data = self.epoch_data.get(epoch)
            if data is None:
                self.epoch_data[epoch] = EpochData(rate)
            elif not data.scores:
                data.learning_rate = rate

    # ----- decisions -----
    def learning_rate_for_epoch(self, epoch: int) -> float:
        """The rate for ``epoch``: from the history if known, else decided now and recorded."""
        if epoch < 1:
            raise ValueError(f"epochs count from 1, got {epoch}")
        if epoch not in self.epoch_data:
            self.epoch_data[epoch] = EpochData(self._new_rate(epoch))
        return self.epoch_data[epoch].learning_rate

    def _earlier_epochs(self, epoch: int, count: int | None = None) -> list[int]:
        """The (last ``count``) epochs before ``epoch`` that the history has, in order."""
        earlier = sorted(e for e in self.epoch_data if e < epoch)
        return earlier if count is None else earlier[-count:]

    def _recent_rate(self, epoch: int, *, including: bool = False) -> float:
        """The rate of the latest epoch before (or at) ``epoch``; ``learning_rate`` when there is none."""
        earlier = [e for e in self.epoch_data if e < epoch or (including and e == epoch)]
        return self.epoch_data[max(earlier)].learning_rate if earlier else self.default_learning_rate

    def _new_rate(self, epoch: int) -> float:
        if self.min_epochs_per_new_rate > 1:
            rates = [self.epoch_data[e].learning_rate
                     for e in self._earlier_epochs(epoch, self.min_epochs_per_new_rate)]
            if len(set(rates)) >= 2 or 0 < len(rates) < self.min_epochs_per_new_rate:
                return rates[-1]  # the current rate has not run for long enough yet
        if self.kind == "newbob_multi_epoch":
            return self._multi_epoch_rate(epoch)
        earlier = self._earlier_epochs(epoch, 2)
        if not earlier:
            return self.default_learning_rate
        rate = self.epoch_data[earlier[-1]].learning_rate
        if self.kind == "constant" or len(earlier) < 2:
            return rate
        old, new = earlier
        change = (self.relative_error(old, new) if self.kind == "newbob_rel"
                  else self._absolute_error(old, new))
        if change is None:
            return rate
        threshold = self.relative_error_threshold if self.kind == "newbob_rel" else self.error_threshold
        return self._changed(rate, change, epoch, decay=change > threshold, grow=not change > threshold)

    def _multi_epoch_rate(self, epoch: int) -> float:
        rate = self._recent_rate(epoch)
        if self.multi_update_interval > 1 and epoch % self.multi_update_interval != 1:
            return rate
        epochs = self._earlier_epochs(epoch, self.multi_num_epochs + 1)
        if len(epochs) < 2:
            return rate
        changes = [self.relative_error(a, b) for a, b in zip(epochs, epochs[1:])]
        if any(c is None for c in changes):
            return rate
        mean = math.fsum(changes) / len(changes)
        return self._changed(rate, mean, epoch, decay=mean > self.relative_error_threshold,
                             grow=mean < self.grow_threshold)

    def _changed(self, rate: float, change: float, epoch: int, *, decay: bool, grow: bool) -> float:
        new_rate = (max(rate * self.decay, self.min_learning_rate) if decay
                    else rate * self.growth if grow else rate)
        if new_rate != rate:
            log.info(f"Learning-rate control ({self.kind}): score change {change:.4g}; learning rate "
                     f"{rate:g} -> {new_rate:g} for epoch {epoch}.")
        return new_rate

    def _absolute_error(self, old_epoch: int, new_epoch: int) -> float | None:
        (old_key, old), (new_key, new) = self.score(old_epoch), self.score(new_epoch)
        return None if old is None or new is None or old_key != new_key else new - old

    def relative_error(self, old_epoch: int, new_epoch: int) -> float | None:
        """RETURNN's ``calc_relative_error``; None when an epoch has no score or the keys differ."""
        (old_key, old), (new_key, new) = self.score(old_epoch), self.score(new_epoch)
        if old is None or new is None or old_key != new_key:
            return None
        diff, base = new - old, abs(old if self.relative_error_div_by_old else new)
        change = diff / base if base != 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
        if self.relative_error_relative_lr:
            rate = self._recent_rate(new_epoch, including=True)
            if rate > 0:
                change /= rate / self.default_learning_rate  # a lower rate is expected to improve less
        return change

    def resolve_layer_keys(self, loss_layers: Sequence[str]) -> None:
        """Read ``learning_rate_control_error_measure``'s per-layer keys for a model whose loss layers are
        ``loss_layers``, the main one first (the one whose score and error are reported). RETURNN's
        ``dev_error_<main>`` becomes ``dev_error``, the same number (the fallback of ``get_error_key``
        would take ``dev_score`` instead); the dev scores of another loss layer are reported as RETURNN
        names them (``dev_error_<layer>``: ``loop.evaluate``); its train scores are not, so such a key is
        refused: newbob would compare another number than RETURNN does."""
        if self.error_measure is None or not loss_layers:
            return
        measures = [self.error_measure] if isinstance(self.error_measure, str) else self.error_measure
        resolved = []
        for key in measures:
            match = _LAYER_KEY.fullmatch(key)
            if match and match["layer"] == loss_layers[0]:
                key = f"{match['dataset']}_{match['kind']}"
            elif match and match["layer"] in loss_layers and match["dataset"] != "dev":
                raise ConfigError(
                    f"Config key 'learning_rate_control_error_measure' names {key!r}, the "
                    f"{match['kind']} of loss layer {match['layer']!r} on {match['dataset']!r}. This engine "
                    f"reports the {match['dataset']} scores of the main loss layer {loss_layers[0]!r} only "
                    f"(and each loss layer's dev scores), so the learning-rate control would compare "
                    f"another number than RETURNN does. Use 'dev_{match['kind']}_{match['layer']}', or "
                    f"'{match['dataset']}_{match['kind']}_{loss_layers[0]}'.")
            resolved.append(key)
        self.error_measure = resolved[0] if isinstance(self.error_measure, str) else resolved

    def score(self, epoch: int) -> tuple[str | None, float | None]:
        """(key, value) of the score that drives the control for ``epoch``; (None, None) if it has none."""
        scores = self.epoch_data[epoch].scores if epoch in self.epoch_data else {}
        key = _error_key(scores, self.error_measure)
        return (key, scores[key]) if key is not None else (None, None)

    def set_epoch_scores(self, epoch: int, scores: dict[str, float]) -> None:
        """Record an epoch's scores, e.g. ``{"train_score": .., "dev_score": .., "dev_error": ..}``."""
        self.learning_rate_for_epoch(epoch)
        self.epoch_data[epoch].scores.update({str(k): float(v) for k, v in scores.items()})

    # ----- the history file -----
    def save(self, path: str | None = None) -> None:
        """Write the history atomically: a crash leaves the old file or the new one, never half of one."""
        path = path or self.filename
        if path:
            write_text_atomically(path, format_history(self.epoch_data))

    def load(self, path: str | None = None) -> None:
        """Replace the history by the file's (then re-apply ``learning_rates`` to untrained epochs)."""
        path = path or self.filename
        if not path:
            raise ConfigError(
                "Learning-rate control: no 'learning_rate_file' is set, so there is nothing to load."
            )
        self.epoch_data = read_history_file(path)
        self._apply_fixed()


def _error_key(scores: dict[str, float], measure: str | list[str] | None) -> str | None:
    """RETURNN's ``get_error_key`` for an epoch's scores."""
    if not scores:
        return None
    if set(scores) == {"old_format_score"}:
        return "old_format_score"
    measures = [measure] if isinstance(measure, str) else list(measure or [])
    wanted = [k for m in measures for k in (m, m + "_output")] + ["dev_score", "dev_score_output"]
    for key in wanted:
        if key in scores:
            return key
    ordered = sorted(scores)
    for accept in (lambda k: k == "dev_score_output/output" or k.startswith("dev_score_output/output_"),
                   lambda k: k.startswith("dev_score_output/"), lambda k: k.startswith("dev_")):
        for key in ordered:
            if accept(key):
                return key
    for key in ("train_score", "train_score_output"):
        if key in scores:
            return key
    return ordered[0]


def _fixed_rates(value: Any) -> dict[int, float]:
    if value is None:
        return {}
    if isinstance(value, (list, tuple)):
        value = {i + 1: v for i, v in enumerate(value)}
    if not isinstance(value, dict) or not all(
        isinstance(e, int) and e >= 1 and isinstance(r, (int, float)) and not isinstance(r, bool)
        for e, r in value.items()
    ):
        raise ConfigError(
            f"Config key 'learning_rates' must be a list of rates for epochs 1, 2, ... or a dict "
            f"epoch -> rate, got {value!r}."
        )
    return {e: float(r) for e, r in value.items()}
