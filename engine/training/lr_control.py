"""Learning-rate control: the rate for each epoch from the config and the scores of past epochs.

``learning_rate_control``:
- ``constant``: ``learning_rate`` (or the last rate used) every epoch.
- ``newbob`` / ``newbob_rel``: after epochs e-2 and e-1 have scores, decay the rate of e-1 by
  ``newbob_learning_rate_decay`` when the relative change of the score, (new - old) / |new|, is above
  ``newbob_relative_error_threshold`` (default -0.01: less than 1% improvement); never below
  ``min_learning_rate``.
- ``newbob_abs``: the same with the absolute change new - old and ``newbob_error_threshold`` (-0.01).
The score compared is ``learning_rate_control_error_measure`` if set, else ``dev_score``, else another
``dev_*`` score, else ``train_score``. ``learning_rates`` (a list for epochs 1, 2, ... or a dict
epoch -> rate) fixes the rates of those epochs, overriding the control.

The per-epoch history (rate and scores) is kept in ``learning_rate_file``, in RETURNN's format::

    {
        1: EpochData(learningRate=0.001, error={
            'dev_error': 0.25,
            'dev_score': 0.7,
        }),
    }

``save`` writes it atomically (temp file + rename); who saves (rank 0) is the caller's decision.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Any

from engine import log
from engine.atomic_file import write_text_atomically
from engine.errors import ConfigError

KINDS = {
    "constant": "constant",
    "newbob": "newbob_rel",
    "newbob_rel": "newbob_rel",
    "newbob_relative": "newbob_rel",
    "newbob_abs": "newbob_abs",
}


@dataclass
class EpochData:
    learning_rate: float
    scores: dict[str, float] = field(default_factory=dict)


class LearningRateControl:
    """The learning-rate history (``epoch_data``) and the rule that extends it epoch by epoch."""

    def __init__(
        self,
        kind: str = "constant",
        *,
        default_learning_rate: float = 1.0,
        learning_rates: list[float] | dict[int, float] | None = None,
        decay: float = 0.5,
        relative_error_threshold: float = -0.01,
        error_threshold: float = -0.01,
        min_learning_rate: float = 0.0,
        error_measure: str | None = None,
        filename: str | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ConfigError(
                f"Config key 'learning_rate_control': unknown value {kind!r}; known: {', '.join(KINDS)}."
            )
        self.kind = KINDS[kind]
        self.default_learning_rate = float(default_learning_rate)
        self.decay = float(decay)
        self.relative_error_threshold = float(relative_error_threshold)
        self.error_threshold = float(error_threshold)
        self.min_learning_rate = float(min_learning_rate)
        self.error_measure = error_measure
        self.filename = filename
        self.fixed = _fixed_rates(learning_rates)
        self.epoch_data: dict[int, EpochData] = {}
        self._apply_fixed()

    @classmethod
    def from_config(cls, config) -> "LearningRateControl":
        """Reads the keys in the module docstring; does not load the file (call ``load`` on resume)."""
        return cls(
            config.str("learning_rate_control"),
            default_learning_rate=config.float("learning_rate"),
            learning_rates=config.typed("learning_rates"),
            decay=config.float("newbob_learning_rate_decay"),
            relative_error_threshold=config.float("newbob_relative_error_threshold"),
            error_threshold=config.float("newbob_error_threshold"),
            min_learning_rate=config.float("min_learning_rate"),
            error_measure=config.str("learning_rate_control_error_measure"),
            filename=config.str("learning_rate_file"),
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
            self.epoch_data[epoch] = EpochData(self._decide(epoch))
        return self.epoch_data[epoch].learning_rate

    def _previous(self, epoch: int) -> int | None:
        earlier = [e for e in self.epoch_data if e < epoch]
        return max(earlier) if earlier else None

    def _decide(self, epoch: int) -> float:
        last = self._previous(epoch)
        if last is None:
            return self.default_learning_rate
        rate = self.epoch_data[last].learning_rate
        last2 = self._previous(last)
        if self.kind == "constant" or last2 is None:
            return rate
        old_key, old = self.score(last2)
        new_key, new = self.score(last)
        if old is None or new is None or old_key != new_key:
            return rate
        diff = new - old
        if self.kind == "newbob_abs":
            change, threshold = diff, self.error_threshold
        else:
            change = diff / abs(new) if new != 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
            threshold = self.relative_error_threshold
        if change > threshold:
            new_rate = max(rate * self.decay, self.min_learning_rate)
            log.info(
                f"Learning-rate control ({self.kind}): {new_key} changed by {change:.4g} > {threshold:g} "
                f"from epoch {last2} to {last}; learning rate {rate:g} -> {new_rate:g} for epoch {epoch}."
            )
            return new_rate
        return rate

    def score(self, epoch: int) -> tuple[str | None, float | None]:
        """(key, value) of the score that drives the control for ``epoch``; (None, None) if it has none."""
        scores = self.epoch_data[epoch].scores if epoch in self.epoch_data else {}
        if not scores:
            return None, None
        dev_keys = sorted(k for k in scores if k.startswith("dev_"))
        for key in (self.error_measure, "dev_score", *dev_keys, "train_score", min(scores)):
            if key in scores:
                return key, scores[key]
        return None, None

    def set_epoch_scores(self, epoch: int, scores: dict[str, float]) -> None:
        """Record an epoch's scores, e.g. ``{"train_score": .., "dev_score": .., "dev_error": ..}``."""
        self.learning_rate_for_epoch(epoch)
        self.epoch_data[epoch].scores.update({str(k): float(v) for k, v in scores.items()})

    # ----- the history file -----
    def save(self, path: str | None = None) -> None:
        """Write the history atomically: a crash leaves the old file or the new one, never half of one."""
        path = path or self.filename
        if not path:
            return
        lines = ["{"]
        for epoch in sorted(self.epoch_data):
            data = self.epoch_data[epoch]
            lines.append(f"    {epoch}: EpochData(learningRate={data.learning_rate!r}, error={{")
            lines += [f"        {key!r}: {value!r}," for key, value in sorted(data.scores.items())]
            lines.append("    }),")
        lines.append("}")
        write_text_atomically(path, "\n".join(lines) + "\n")

    def load(self, path: str | None = None) -> None:
        """Replace the history by the file's (then re-apply ``learning_rates`` to untrained epochs)."""
        path = path or self.filename
        if not path:
            raise ConfigError(
                "Learning-rate control: no 'learning_rate_file' is set, so there is nothing to load."
            )
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Learning-rate file '{path}' cannot be read: {exc}.") from None
        self.epoch_data = parse_history(text, path)
        self._apply_fixed()


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


_NAMES = {"inf": math.inf, "nan": math.nan}
_NUMPY_FLOATS = ("float16", "float32", "float64", "longdouble")


def parse_history(text: str, path: str) -> dict[int, EpochData]:
    """Parse the history format safely (no ``eval``); errors name the file and line."""

    def fail(node: ast.AST | None, what: str) -> ConfigError:
        where = f" at line {node.lineno}" if node is not None and hasattr(node, "lineno") else ""
        return ConfigError(
            f"Learning-rate file '{path}' is not a valid history{where}: {what}. Expected "
            f"{{epoch: EpochData(learningRate=<float>, error={{<name>: <float>, ...}}), ...}}."
        )

    def number(node: ast.AST) -> float:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
        ):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = number(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Name) and node.id in _NAMES:
            return _NAMES[node.id]
        if (  # ``np.float64(0.5)``: how NumPy 2 prints its scalars, which RETURNN may have written
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("np", "numpy")
            and node.func.attr in _NUMPY_FLOATS
            and len(node.args) == 1
            and not node.keywords
        ):
            return number(node.args[0])
        raise fail(node, "a number was expected")

    if not text.strip():
        raise ConfigError(
            f"Learning-rate file '{path}' is empty. Expected "
            f"{{epoch: EpochData(learningRate=<float>, error={{<name>: <float>, ...}}), ...}}."
        )

    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ConfigError(
            f"Learning-rate file '{path}' has a syntax error at line {exc.lineno}: {exc.msg}."
        ) from None
    if not isinstance(tree, ast.Dict):
        raise fail(tree, "the file must hold one dict")
    history: dict[int, EpochData] = {}
    for key, call in zip(tree.keys, tree.values):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, int)) or key.value < 1:
            raise fail(key, "an epoch number (int >= 1) was expected as key")
        if not (
            isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "EpochData"
        ):
            raise fail(call, f"epoch {key.value}: EpochData(...) was expected")
        args = dict(zip(("learningRate", "error"), call.args))
        args.update({kw.arg: kw.value for kw in call.keywords})
        rate_node = args.pop("learningRate", args.pop("learning_rate", None))
        error_node = args.pop("error", None)
        args.pop("meta", None)
        if rate_node is None or args:
            raise fail(call, f"epoch {key.value}: unexpected or missing EpochData arguments")
        scores: dict[str, float] = {}
        if isinstance(error_node, ast.Dict):
            for k, v in zip(error_node.keys, error_node.values):
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    raise fail(k, f"epoch {key.value}: score names must be strings")
                if not k.value.startswith(":meta:"):  # RETURNN's extra info, not a score
                    scores[k.value] = number(v)
        elif error_node is not None and not (
            isinstance(error_node, ast.Constant) and error_node.value is None
        ):
            scores["old_format_score"] = number(error_node)  # RETURNN's oldest format: a single float
        history[key.value] = EpochData(number(rate_node), scores)
    return history
