"""The layers' ``L2`` and ``darc1`` terms.

``L2`` on a layer adds L2 * (sum of squares of all its parameters, weights and biases) to RETURNN's
objective, which is the loss summed over frames, undivided (``Steps._differentiated``). ``darc1`` adds
darc1 * (max over output dims of the summed |value| over the batch's frames) of the layer's output
before its activation, entered the same way (but once per rank in every mode: it depends on the data).
Both equal RETURNN's in one update (tests/test_returnn_parity.py).
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


def darc1_factor(layer: str, opts: dict) -> float:
    """The layer's ``darc1`` (0: none)."""
    value = opts.get("darc1")
    return 0.0 if value is None else _number(layer, "darc1", value, 0.0)


def darc1_term(factor: float, outputs: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """factor * max over output dims k of sum over the batch's frames of |outputs[b, t, k]| (DARC1,
    arXiv:1710.05468), as RETURNN adds it for a layer; ``outputs`` (B, T, K) are a softmax layer's values
    before the softmax. Unlike L2 it depends on the batch."""
    mask = tf.sequence_mask(lengths, tf.shape(outputs)[1])[:, :, None]
    summed = tf.reduce_sum(tf.where(mask, tf.abs(outputs), tf.zeros_like(outputs)), axis=[0, 1])
    return factor * tf.reduce_max(summed)
