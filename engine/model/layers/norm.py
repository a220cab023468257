"""Normalisation layers of the ``network`` dict: RETURNN's ``layer_norm``."""
from __future__ import annotations

import tensorflow as tf

from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError


class LayerNorm(Layer):
    """``layer_norm``: each frame normalised over its features, (x - mean) / sqrt(var + ``epsilon``), then
    times ``scale`` plus ``bias`` (per feature; initial 1 and 0). ``epsilon`` defaults to RETURNN's 1e-6.
    A frame depends on itself only, so padding cannot leak."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        self.epsilon = opts.get("epsilon", 1e-6)
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) or self.epsilon < 0:
            raise ConfigError(f"Network layer '{name}': 'epsilon' must be a number >= 0, "
                              f"got {self.epsilon!r}.")
        self.params["scale"] = tf.Variable(tf.ones([in_dim]), name=f"{name}/scale")
        self.params["bias"] = tf.Variable(tf.zeros([in_dim]), name=f"{name}/bias")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        dtype, x = x.dtype, tf.cast(x, tf.float32)  # tf_amp: the statistics in float32
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
        normed = (x - mean) * tf.math.rsqrt(variance + float(self.epsilon))
        return tf.cast(normed * self.params["scale"] + self.params["bias"], dtype)
