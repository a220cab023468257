"""Dropout as one product with a scaled 0/1 mask.

``tf.nn.experimental.stateless_dropout`` keeps a value where its uniform draw is >= rate and scales it by
1 / (1 - rate), with a select (``where``) forward and two more in its gradient. ``stateless_dropout`` here
draws the same numbers (same seed, shape, dtype and algorithm) and multiplies by the mask times the scale
instead: the same kept values and gradients, one multiplication each way. A small network runs a few dozen
dropouts per step, and the selects with their gradients were the largest element-wise cost after the
LSTMs (RETURNN's own dropout multiplies too). Unlike the select, the product lets an Inf or NaN in a
dropped position through, as RETURNN's does.
"""
from __future__ import annotations

import tensorflow as tf


def stateless_dropout(x: tf.Tensor, rate: float, seed: tf.Tensor, noise_shape: tf.Tensor | None = None
                      ) -> tf.Tensor:
    """``x`` with each value (each of ``noise_shape``'s, broadcast over ``x``) kept at probability
    1 - ``rate`` and scaled by 1 / (1 - ``rate``), else 0; ``seed`` int (2,) keys the draws."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    draws = tf.random.stateless_uniform(tf.shape(x) if noise_shape is None else noise_shape, seed=seed,
                                        dtype=x.dtype)
    return x * (tf.cast(draws >= rate, x.dtype) * tf.constant(1.0 / (1.0 - rate), x.dtype))
