"""RETURNN's ``reinterpret_data`` with ``size_base``: the same frames, the lengths of another sequence.

RETURNN only relabels the time axis; its losses then read the first ``length`` frames of each sequence.
Here the output is cut (or zero-padded) to the longest new length, so that it lines up frame by frame
with what it now belongs to (a hybrid's alignment after a down- and upsampling). A new length beyond
the frames the layer's input has for that sequence stops the step with an error: RETURNN would read
padding there.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError


def size_base_of(name: str, opts: dict) -> str:
    """The stream (``"data:<stream>"``) or layer whose lengths the layer takes."""
    base = opts.get("size_base")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"Network layer '{name}': reinterpret_data needs 'size_base' (a layer, or a data "
                          f"stream as 'data:<stream>'), got {base!r}.")
    return "data:data" if base == "data" else base


class ReinterpretData(Layer):
    """``reinterpret_data`` with ``size_base`` (the network hands over the new lengths to ``resize``); its
    options that relabel axes or sparsity are refused (``spec.py``): the layouts here have neither."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        self.layer_name = name
        self.base = size_base_of(name, opts)

    def resize(self, x: tf.Tensor, lengths: tf.Tensor, new_lengths: tf.Tensor) -> tf.Tensor:
        """``x`` (T, B, ...) with ``lengths`` -> (max(new_lengths), B, ...)."""
        check = tf.debugging.assert_less_equal(
            new_lengths, lengths, message=f"Network layer '{self.layer_name}': size_base {self.base!r} "
                                          "gives a sequence "
                                          "more frames than the layer's input has")
        with tf.control_dependencies([check]):
            n_new = tf.reduce_max(new_lengths)
        n_time = tf.shape(x)[0]
        x = tf.pad(x[:n_new], [[0, tf.maximum(n_new - n_time, 0)]] + [[0, 0]] * (x.shape.rank - 1))
        return x
