"""Checks of the batch inside the compiled steps that end in a ``DataError``.

In a graph a check cannot raise a Python exception: ``require`` adds an assertion whose message starts
with a marker, and the compiled step (``engine/training/step.py``) turns that message back into a
``DataError`` with ``data_error_from``. Run eagerly (tests), ``require`` raises the ``DataError`` itself.
"""
from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from engine.runtime.errors import DataError

MARKER = "[engine DataError]"


def require(ok: tf.Tensor, parts: list, guarded: tf.Tensor) -> tf.Tensor:
    """``parts`` (str or tensors) make up the message; it should name the layer and the target. Returns
    ``guarded`` as computed after the check, so that ops that would fail on bad input run after it."""
    if tf.executing_eagerly():
        if not bool(ok):
            raise DataError(" ".join(_text(p) for p in parts))
        return guarded
    with tf.control_dependencies([tf.debugging.Assert(ok, [MARKER] + parts, summarize=64)]):
        return tf.identity(guarded)


def _text(part) -> str:
    if isinstance(part, str):
        return part
    return str(np.asarray(part).tolist())


def data_error_from(message: str) -> DataError | None:
    """The ``DataError`` a failed ``require`` assertion stands for (None for other errors)."""
    start = message.find(MARKER)
    if start < 0:
        return None
    text = message[start + len(MARKER):].split("\n\t [[", 1)[0]
    text = re.sub(r"\] \[", " ", text).strip(" []")
    return DataError(text.replace("\\'", "'").replace("\n", " "))
