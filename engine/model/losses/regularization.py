"""The layers' ``L2`` term.

``L2`` on a layer adds L2 * (sum of squares of all its parameters, weights and biases) to RETURNN's
objective, which is the loss summed over frames. The engine differentiates frame-averaged losses, so
``Steps`` divides the term by the batch's frames: the gradient has RETURNN's direction.
"""
from __future__ import annotations

from typing import Iterable

import tensorflow as tf

from engine.model.losses.cross_entropy import _number


def l2_factor(layer: str, opts: dict) -> float:
    """The layer's ``L2`` (0: none)."""
    value = opts.get("L2")
    return 0.0 if value is None else _number(layer, "L2", value, 0.0)


def l2_term(factor: float, params: Iterable[tf.Variable]) -> tf.Tensor:
    """factor * sum of squares of ``params``, as RETURNN adds it for a layer."""
    return factor * tf.add_n([tf.reduce_sum(tf.square(p)) for p in params] or [tf.constant(0.0)])
