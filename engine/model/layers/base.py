"""The base of every layer of the ``network`` dict: ``Layer``, and the helpers layers build on.

Layers work time-major: input (T, B, in_dim), output (T, B, n_out). Combining the sources, one-hot of
sparse input and input dropout are the network's job (``network.py``); a layer that takes sparse input
directly (``linear``/``softmax`` right after sparse ``data``) gets int ids (T, B) and looks rows up.

Variables are created at construction with stateless random ops seeded by (``random_seed``, a hash of
the variable's name), so every rank and every run builds bit-identical initial values.
"""

from __future__ import annotations

import zlib

import tensorflow as tf

from engine.runtime.errors import ConfigError


def glorot_variable(name: str, shape: tuple[int, int], random_seed: int) -> tf.Variable:
    """Glorot-uniform weights, a pure function of (random_seed, name, shape)."""
    limit = (6.0 / (shape[0] + shape[1])) ** 0.5
    seed = tf.constant([random_seed, zlib.crc32(name.encode())], tf.int64)
    init = tf.random.stateless_uniform(shape, seed=seed, minval=-limit, maxval=limit)
    return tf.Variable(init, name=name)


def positive_int(layer: str, opts: dict, key: str) -> int:
    value = opts.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"Network layer '{layer}': '{key}' must be a positive int, got {value!r}.")
    return value


class Layer(tf.Module):
    """Base: a named layer with ``in_dim`` inputs and ``n_out`` outputs; owns its variables in order."""

    sparse_input = False  # True: the layer takes int ids (T, B) instead of features

    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.n_out = in_dim
        self.params: dict[str, tf.Variable] = {}

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return x

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        """The sequence lengths of the output for inputs of ``lengths``; layers that subsample override."""
        return lengths
