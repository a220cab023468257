"""``CompiledStep``: a step as one ``tf.function``, whose errors reach the user as one paragraph."""
from __future__ import annotations

import contextlib
import re
from typing import Callable, Iterator

import tensorflow as tf

from engine.model.losses.data_checks import data_error_from
from engine.runtime.errors import DataError

_NUMERICS_FOUND = re.compile(r"!!! (Detected Infinity or NaN in output \d+ of graph op \"[^\"]*\")")


class CompiledStep:
    """``tf.function(step)`` whose errors reach the user as one paragraph.

    Traced without autograph, an engine error raised while the graph is built (a config error) reaches
    the caller as raised. An Inf or NaN found by ``check_numerics`` comes as TensorFlow's error with the
    op's creation stack; its first line names the op, and a failed check of the batch inside the graph
    becomes the engine's DataError."""

    def __init__(self, step: Callable, signature: list) -> None:
        # No autograph: the steps' control flow is plain Python on Python values, and converting their source
        # took about half of a small run's CPU time (5 of 11 s for the tests' LSTM, in every process).
        self._function = tf.function(step, input_signature=signature, autograph=False)
        self.name = step.__name__.strip("_")

    def __call__(self, *args):
        with self._user_errors():
            return self._function(*args)

    def trace(self) -> None:
        """Build the graph now, without data (later calls reuse it)."""
        with self._user_errors():
            self._function.get_concrete_function()

    @contextlib.contextmanager
    def _user_errors(self) -> Iterator[None]:
        try:
            yield
        except tf.errors.InvalidArgumentError as exc:
            data_error = data_error_from(exc.message)  # a check of the batch inside the graph failed
            if data_error is not None:
                raise data_error from None
            found = _NUMERICS_FOUND.search(exc.message)
            if found is None:
                raise
            raise DataError(f"debug_add_check_numerics_ops: {found.group(1)} (in the {self.name}). Check the "
                            "data for Inf/NaN, or lower the learning rate.") from None
