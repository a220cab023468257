"""The layer classes of the ``network`` dict: ``linear``, ``softmax``, ``rec`` (LSTM), ``copy``, ``dropout``
(``time_chunking``/``time_unchunking``: ``time_chunking.py``).

Layers work time-major: input (T, B, in_dim), output (T, B, n_out). Combining the sources, one-hot of
sparse input and input dropout are the network's job (``network.py``); a layer that takes sparse input
directly (``linear``/``softmax`` right after sparse ``data``) gets int ids (T, B) and looks rows up.

Variables are created at construction with stateless random ops seeded by (``random_seed``, a hash of
the variable's name), so every rank and every run builds bit-identical initial values.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import tensorflow as tf

from engine.model.layers.lstm import fused_lstm, scan_lstm
from engine.model.losses.cross_entropy import CrossEntropy
from engine.runtime.errors import ConfigError

ACTIVATIONS: dict[Any, Callable[[tf.Tensor], tf.Tensor] | None] = {
    None: None,
    "linear": None,
    "identity": None,
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
    "sigmoid": tf.sigmoid,
    "elu": tf.nn.elu,
    "softmax": tf.nn.softmax,
    "log_softmax": tf.nn.log_softmax,
}


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


def _embed_rows(weights: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """``tf.gather`` whose gradient is a dense tensor, not IndexedSlices: fused allreduce, clipping
    and the updater then treat the embedding like every other weight."""

    @tf.custom_gradient
    def lookup(w):
        def grad(dy):
            return tf.math.unsorted_segment_sum(dy, ids, tf.shape(w)[0])

        return tf.gather(w, ids), grad

    return lookup(weights)


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


class Copy(Layer):
    """``copy`` and ``dropout``: the (concatenated, maybe dropped-out) input itself."""


class Linear(Layer):
    """``linear``: x W + b and an activation. Sparse input (ids) selects rows of W (an embedding)."""

    def __init__(self, name: str, opts: dict, in_dim: int, *, sparse_input: bool, random_seed: int) -> None:
        super().__init__(in_dim)
        self.n_out = positive_int(name, opts, "n_out")
        activation = opts.get("activation")
        if activation not in ACTIVATIONS:
            known = ", ".join(repr(k) for k in ACTIVATIONS)
            raise ConfigError(f"Network layer '{name}': unknown activation {activation!r}; known: {known}.")
        self.activation = ACTIVATIONS[activation]
        self.sparse_input = sparse_input
        self.params["W"] = glorot_variable(f"{name}/W", (in_dim, self.n_out), random_seed)
        if opts.get("with_bias", True):
            self.params["b"] = tf.Variable(tf.zeros([self.n_out]), name=f"{name}/b")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        weights = self.params["W"]
        if self.sparse_input:
            y = _embed_rows(tf.convert_to_tensor(weights), x)
        else:
            # One (T*B, in) x (in, out) matmul: a broadcast batched matmul would run T small ones.
            shape = tf.shape(x)
            y = tf.reshape(
                tf.matmul(tf.reshape(x, [-1, self.in_dim]), weights), [shape[0], shape[1], self.n_out]
            )
        if "b" in self.params:
            y = y + self.params["b"]
        return y if self.activation is None else self.activation(y)


class Softmax(Linear):
    """``softmax``: a linear layer whose call returns the logits; the network adds the probabilities.

    With ``loss: "ce"`` it is trained with cross-entropy against ``target`` (default ``classes``), with
    ``loss_scale`` and ``loss_opts`` as in ``losses.CrossEntropy``.
    """

    def __init__(
        self,
        name: str,
        opts: dict,
        in_dim: int,
        *,
        sparse_input: bool,
        random_seed: int,
        target_dims: dict[str, int],
    ) -> None:
        self.target = opts.get("target", "classes")
        self.loss = opts.get("loss")
        if self.loss not in (None, "ce"):
            raise ConfigError(
                f"Network layer '{name}': loss {self.loss!r} is not supported; use 'ce' (or none)."
            )
        if not self.loss and opts.get("loss_opts"):
            raise ConfigError(f"Network layer '{name}': loss_opts are given, but the layer has no loss.")
        target_dim = target_dims.get(self.target) if isinstance(self.target, str) else None
        n_out = opts.get("n_out", target_dim)
        if n_out is None:
            raise ConfigError(
                f"Network layer '{name}': 'n_out' is not given and target {self.target!r} is not a known "
                f"data stream (known: {sorted(target_dims)}); set 'n_out' or 'target'."
            )
        if self.loss and target_dim is None:
            raise ConfigError(
                f"Network layer '{name}': loss target {self.target!r} is not a data stream; "
                f"known targets: {sorted(target_dims)}."
            )
        if self.loss and n_out != target_dim:
            raise ConfigError(
                f"Network layer '{name}': n_out {n_out} does not match the dim {target_dim} of "
                f"its target {self.target!r}."
            )
        self.criterion = CrossEntropy.from_layer_options(name, opts, n_out)
        super().__init__(
            name,
            {**opts, "n_out": n_out, "activation": None},
            in_dim,
            sparse_input=sparse_input,
            random_seed=random_seed,
        )


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
