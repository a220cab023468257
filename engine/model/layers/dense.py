"""Dense layers of the ``network`` dict: ``linear``, ``softmax`` (with its ``ce`` loss), and ``copy`` /
``dropout`` (the input itself)."""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from engine.model.layers.base import Layer, dense_gather, glorot_variable, positive_int
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
    # RETURNN looks any other name up in tf.nn, then tf / tf.math: these are the common ones
    "gelu": tf.nn.gelu,  # tf.nn.gelu's default: the exact (erf) form, as RETURNN gets it
    "swish": tf.nn.swish,
    "silu": tf.nn.silu,
    "softplus": tf.nn.softplus,
    "softsign": tf.nn.softsign,
    "relu6": tf.nn.relu6,
    "selu": tf.nn.selu,
    "log_sigmoid": tf.math.log_sigmoid,
    "abs": tf.abs,
    "exp": tf.exp,
    "log": tf.math.log,
    "sqrt": tf.sqrt,
    "square": tf.square,
    "sin": tf.sin,
    "cos": tf.cos,
    "neg": tf.negative,
    "negative": tf.negative,
}


def activation_option(layer: str, opts: dict) -> Any:
    """The layer's ``activation`` (a key of ``ACTIVATIONS``); an unknown name is a ConfigError."""
    activation = opts.get("activation")
    if not isinstance(activation, (str, type(None))) or activation not in ACTIVATIONS:
        known = ", ".join(repr(k) for k in ACTIVATIONS)
        raise ConfigError(f"Network layer '{layer}': unknown activation {activation!r}; known: {known}.")
    return activation


class Copy(Layer):
    """``copy`` and ``dropout``: the (concatenated, maybe dropped-out) input itself."""


class Linear(Layer):
    """``linear``: x W + b and an activation. Sparse input (ids) selects rows of W (an embedding)."""

    def __init__(self, name: str, opts: dict, in_dim: int, *, sparse_input: bool, random_seed: int) -> None:
        super().__init__(in_dim)
        self.n_out = positive_int(name, opts, "n_out")
        self.activation = ACTIVATIONS[activation_option(name, opts)]
        self.sparse_input = sparse_input
        self.params["W"] = glorot_variable(f"{name}/W", (in_dim, self.n_out), random_seed)
        if opts.get("with_bias", True):
            self.params["b"] = tf.Variable(tf.zeros([self.n_out]), name=f"{name}/b")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        weights = self.params["W"]
        if self.sparse_input:
            y = dense_gather(tf.convert_to_tensor(weights), x)
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
