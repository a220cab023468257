"""``cleanup_old_models``: delete old checkpoints after each epoch, by RETURNN's rules.

``cleanup_old_models = True`` or a dict with ``keep_last_n`` [2], ``keep_best_n`` [4] and ``keep`` (a list
of epochs; by default a pattern that depends on the newest epoch: multiples of 4, 20, 40 or
80 * 2^k, and 5, 10, 20, ... doubling). Among the checkpoints ``<model>.<NNN>`` of epochs 1 ..
``num_epochs`` that exist, these are kept: the ``keep`` epochs, the last ``keep_last_n``, and for every
score key of the learning-rate history (``dev_score``, ``dev_error``, ``train_score``, ...; keys with
the same value in all kept epochs do not count) the ``keep_best_n`` lowest (an epoch without that score
counts as the worst). Nothing is deleted while there are no more checkpoints than ``keep_last_n`` or
``keep_best_n``. The newest checkpoint is always kept (``keep_last_n`` >= 1), and so is the best one by
the score the learning-rate control uses, also with ``keep_best_n = 0`` (where RETURNN would delete it).

Only rank 0 calls this, and it removes only files named exactly ``<model>.<NNN>``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from engine.runtime import log
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.file_format import checkpoint_path
from engine.training.update.lr_control import LearningRateControl

OPTIONS = ("keep_last_n", "keep_best_n", "keep")


@dataclass(frozen=True)
class CleanupPolicy:
    keep_last_n: int = 2
    keep_best_n: int = 4
    keep: frozenset[int] | None = None  # None: RETURNN's default pattern

    @classmethod
    def from_config(cls, config: Any) -> "CleanupPolicy | None":
        """None when cleanup is off (``False``, None, or an empty dict, as in RETURNN)."""
        value = config.typed("cleanup_old_models")
        if not value:
            return None
        if value is True:
            return cls()
        if not isinstance(value, dict):
            raise ConfigError("Config key 'cleanup_old_models' must be True or a dict with "
                              f"{', '.join(OPTIONS)}, got {value!r}.")
        unknown = sorted(set(value) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"Config key 'cleanup_old_models': unknown option(s) {unknown}; known: "
                              f"{', '.join(OPTIONS)}.")
        last, best = value.get("keep_last_n", 2), value.get("keep_best_n", 4)
        if not _is_int(last) or last < 1 or not _is_int(best) or best < 0:
            raise ConfigError("Config key 'cleanup_old_models': keep_last_n must be >= 1 and "
                              f"keep_best_n >= 0, got {last!r} and {best!r}.")
        keep = value.get("keep")
        if keep is not None and (not isinstance(keep, (list, tuple, set, frozenset, range))
                                 or not all(_is_int(e) for e in keep)):
            raise ConfigError("Config key 'cleanup_old_models': keep must be a list of epochs, "
                              f"got {keep!r}.")
        return cls(last, best, None if keep is None else frozenset(keep))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def default_keep_pattern(newest: int) -> set[int]:
    """RETURNN's epochs to keep for good, given the newest stored epoch."""
    if newest <= 10:
        every, doubling = 4, 5
    elif newest <= 50:
        every, doubling = 20, 5
    elif newest <= 100:
        every, doubling = 40, 10
    else:
        # 80 * next power of 2 >= 1 + newest // 240
        every, doubling = 80 * 2 ** (newest // 240).bit_length(), 20
    kept = set(range(every, newest + 1, every))
    epoch = doubling
    while epoch <= newest:
        kept.add(epoch)
        epoch *= 2
    return kept


def epochs_to_delete(epochs: Iterable[int], control: LearningRateControl, policy: CleanupPolicy) -> list[int]:
    """Which of the stored ``epochs`` to delete, given the learning-rate history's scores."""
    epochs = sorted(epochs)
    if not epochs or max(policy.keep_last_n, policy.keep_best_n) >= len(epochs):
        return []
    keep = set(default_keep_pattern(epochs[-1]) if policy.keep is None else policy.keep)
    keep.update(epochs[-policy.keep_last_n:])
    scores = {e: control.epoch_data[e].scores if e in control.epoch_data else {} for e in epochs}
    keys = sorted({key for data in control.epoch_data.values() for key in data.scores})
    for key in keys:
        values = [s[key] for s in scores.values() if key in s]
        if not values or min(values) == max(values):
            continue  # no stored epoch has it, or it does not tell them apart
        ranked = sorted((scores[e].get(key, max(values)), e) for e in epochs)
        keep.update(e for _, e in ranked[:policy.keep_best_n])
    scored = [(value, -e, e) for e in epochs if (value := control.score(e)[1]) is not None]
    if scored:
        keep.add(min(scored)[2])  # the best by the control's score, newest among equals
    return [e for e in epochs if e not in keep]


def cleanup_old_models(model_prefix: str, num_epochs: int, control: LearningRateControl,
                       policy: CleanupPolicy) -> list[str]:
    """Delete the checkpoints ``epochs_to_delete`` names; returns the deleted paths."""
    stored = [e for e in range(1, num_epochs + 1) if os.path.isfile(checkpoint_path(model_prefix, e))]
    delete = epochs_to_delete(stored, control, policy)
    if not delete:
        return []
    log.info(f"cleanup_old_models: checkpoints of epochs {stored}; deleting those of epochs {delete}.")
    deleted = []
    for epoch in delete:
        path = checkpoint_path(model_prefix, epoch)
        try:
            os.remove(path)
            deleted.append(path)
        except OSError as exc:  # e.g. removed by hand meanwhile: training goes on
            log.warning(f"cleanup_old_models: could not delete '{path}': {exc}.")
    return deleted
