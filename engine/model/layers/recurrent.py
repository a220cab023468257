"""Recurrent layers of the ``network`` dict: ``rec`` with an LSTM unit (its kernels: ``lstm.py``)."""

from __future__ import annotations

import tensorflow as tf

from engine.model.layers.base import Layer, glorot_variable, positive_int
from engine.model.layers.lstm import fused_lstm, scan_lstm
from engine.runtime.errors import ConfigError


class Rec(Layer):
    """``rec`` with an LSTM unit; ``direction`` -1 runs over the valid part of each sequence reversed.

    The LSTM is ``lstm.fused_lstm`` (``lstm.scan_lstm`` when the gradient must be differentiable again).
    Padding cannot leak into valid frames: forward, padded frames come after all valid ones; backward,
    the valid part is reversed in place (``tf.reverse_sequence``) so the padding still comes last.
    """

    def __init__(self, name: str, opts: dict, in_dim: int, *, random_seed: int,
                 twice_differentiable: bool = False) -> None:
        super().__init__(in_dim)
        self.n_out = positive_int(name, opts, "n_out")  # its unit is an LSTM (``spec.py`` checks)
        self.direction = opts.get("direction", 1)
        if self.direction not in (1, -1):
            raise ConfigError(f"Network layer '{name}': direction must be 1 or -1, got {self.direction!r}.")
        self._lstm = scan_lstm if twice_differentiable else fused_lstm
        n = self.n_out
        self.params["W"] = glorot_variable(f"{name}/W", (in_dim + n, 4 * n), random_seed)
        # Forget-gate bias 1 (held in the variable, not added by the op) so early training keeps memory.
        bias = tf.concat([tf.zeros([2 * n]), tf.ones([n]), tf.zeros([n])], axis=0)
        self.params["b"] = tf.Variable(bias, name=f"{name}/b")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        if self.direction == -1:
            x = tf.reverse_sequence(x, lengths, seq_axis=0, batch_axis=1)
        h = self._lstm(x, lengths, self.params["W"], self.params["b"], self.n_out)
        if self.direction == -1:
            h = tf.reverse_sequence(h, lengths, seq_axis=0, batch_axis=1)
        return h
