"""The base of every layer of the ``network`` dict: ``Layer``, and the helpers layers build on.

Layers work time-major: input (T, B, in_dim), output (T, B, n_out). Combining the sources, one-hot of
sparse input and input dropout are the network's job (``network.py``); a layer that takes sparse input
directly (``linear``/``softmax`` right after sparse ``data``) gets int ids (T, B) and looks rows up.

Variables are created at construction with stateless random ops seeded by (``random_seed``, a hash of
the variable's name), so every rank and every run builds bit-identical initial values.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import tensorflow as tf

from engine.runtime.errors import ConfigError


def glorot_values(name: str, shape: tuple[int, ...], random_seed: int) -> tf.Tensor:
    """Glorot-uniform values, a pure function of (random_seed, name, shape). A conv filter (width, in,
    out) counts its width in both fans, as TF's initializer does."""
    receptive = 1
    for size in shape[:-2]:
        receptive *= size
    limit = (6.0 / (receptive * (shape[-2] + shape[-1]))) ** 0.5
    seed = tf.constant([random_seed, zlib.crc32(name.encode())], tf.int64)
    return tf.random.stateless_uniform(shape, seed=seed, minval=-limit, maxval=limit)


def glorot_variable(name: str, shape: tuple[int, ...], random_seed: int) -> tf.Variable:
    return tf.Variable(glorot_values(name, shape, random_seed), name=name)


def positive_int(layer: str, opts: dict, key: str) -> int:
    value = opts.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"Network layer '{layer}': '{key}' must be a positive int, got {value!r}.")
    return value


def dense_gather(params: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """``tf.gather`` along axis 0 whose gradient is a dense tensor, not IndexedSlices: the fused LSTM's
    gradient, fused allreduce, clipping and the updater all want dense ones."""

    @tf.custom_gradient
    def gather(p):
        def grad(dy):
            return tf.math.unsorted_segment_sum(dy, ids, tf.shape(p)[0])

        return tf.gather(p, ids), grad

    return gather(params)


def one_of(layer: str, opts: dict, key: str, choices: tuple, default: Any) -> Any:
    """The option's value, lower-cased if a str (RETURNN compares these case-insensitively)."""
    value = opts.get(key, default)
    if isinstance(value, str):
        value = value.lower()
    if value not in choices:
        raise ConfigError(f"Network layer '{layer}': '{key}' must be one of {', '.join(map(repr, choices))}, "
                          f"got {opts.get(key)!r}.")
    return value


def time_mask(x: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """``x`` (T, B, F) with the frames past each sequence's length set to 0."""
    valid = tf.transpose(tf.sequence_mask(lengths, tf.shape(x)[0]))  # (T, B)
    return tf.where(valid[:, :, None], x, tf.zeros_like(x))


class Layer(tf.Module):
    """Base: a named layer with ``in_dim`` inputs and ``n_out`` outputs; owns its variables in order."""

    sparse_input = False  # True: the layer takes int ids (T, B) instead of features
    separate_sources = False  # True: the layer gets a list of its sources' outputs, not their concatenation
    needs_seed = False  # True: the layer is called with ``seed=`` (a stateless seed (2,)) for its own dropout
    running_keys: tuple[str, ...] = ()  # non-trainable params that its calls move (batch_norm's statistics)
    takes_spatial = False  # True: the layer takes (T, B, *spatial, F) input with static axes S (``axes.py``)
    spatial: tuple[int, ...] | None = None  # the output's static axes between B and F; None: the input's
    shares_params_of: str | None = None  # reuse_params: the layer whose ``params`` these are
    has_batch_axis = True  # False: the output has no batch axis (relative_positional_encoding's (T, T, F))
    compute_dtype = tf.float32  # tf_amp: the network sets bfloat16 or float16 (``engine/model/precision.py``)

    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.n_out = in_dim
        self.params: dict[str, tf.Variable] = {}
        # param key -> row counts of the separate variables RETURNN keeps it as (see SeqModel.returnn_parts)
        self.returnn_parts: dict[str, tuple[int, ...]] = {}
        # param key -> an L2 of its own besides the layer's (a rec unit's layer's ``L2``)
        self.inner_l2: dict[str, float] = {}

    def param(self, key: str) -> tf.Tensor:
        """The variable ``key`` in the compute dtype: the float32 variable stays the master copy, and its
        gradient comes back through the cast in float32."""
        return tf.cast(self.params[key], self.compute_dtype)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return x

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        """The (B,) lengths of the output sequences for input sequences of ``lengths``."""
        return lengths


def scope_name(layer: str) -> str:
    """A layer's name as a TensorFlow name scope (which takes letters, digits and ``._-/>`` only)."""
    return re.sub(r"[^A-Za-z0-9._\-/>]", "_", layer).lstrip("_-/>") or "layer"
