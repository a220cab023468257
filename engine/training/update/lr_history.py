"""The learning-rate file: the per-epoch history of rates and scores, in RETURNN's format::

    {
        1: EpochData(learningRate=0.001, error={
            'dev_error': 0.25,
            'dev_score': 0.7,
        }),
    }

RETURNN's ``LearningRateControl`` reads what ``format_history`` writes, and ``parse_history`` reads
RETURNN's files (also its older forms) without ``eval``. ``read_history_file`` reads one: an I/O error
that may pass (EIO, ESTALE, ETIMEDOUT) is a ``TransientIOError`` (exit code 1: ``supervise`` restarts),
anything else a ConfigError naming the file.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field

from engine.config.loader import Config
from engine.runtime.atomic_file import describe_io_error, io_errno
from engine.runtime.errors import TRANSIENT_ERRNOS, ConfigError, TransientIOError


@dataclass
class EpochData:
    learning_rate: float
    scores: dict[str, float] = field(default_factory=dict)


def learning_rate_file(config: Config) -> str | None:
    """``learning_rate_file``, by default ``<model>.learning_rates``: beside the checkpoints and named by
    their prefix, so that a run with another ``model`` never reads or extends another run's history
    (RETURNN has no default file: a config that fixes one shares it between all its model paths)."""
    path = config.str("learning_rate_file")
    if path is None and config.str("model"):
        path = config.str("model") + ".learning_rates"
    return path or None


def read_history_file(path: str) -> dict[int, EpochData]:
    """The history in the file ``path`` (which must exist)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        if io_errno(exc) in TRANSIENT_ERRNOS:
            raise TransientIOError(
                f"Learning-rate file '{path}' could not be read: {describe_io_error(exc)}, an I/O error of "
                "the disk or network file system that may pass. Ending with exit code 1, on which "
                "`supervise` restarts the job.") from None
        raise ConfigError(f"Learning-rate file '{path}' cannot be read: {exc}.") from None
    return parse_history(text, path)


def trained_epochs(history: dict[int, EpochData]) -> list[int]:
    """The epochs the history shows as trained (with scores; rates alone may come from ``learning_rates``)."""
    return sorted(epoch for epoch, data in history.items() if data.scores)


def format_history(epoch_data: dict[int, EpochData]) -> str:
    lines = ["{"]
    for epoch in sorted(epoch_data):
        data = epoch_data[epoch]
        lines.append(f"    {epoch}: EpochData(learningRate={float(data.learning_rate)!r}, error={{")
        lines += [f"        {key!r}: {value!r}," for key, value in sorted(data.scores.items())]
        lines.append("    }),")
    lines.append("}")
    return "\n".join(lines) + "\n"


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
