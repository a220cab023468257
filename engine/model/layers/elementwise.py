"""Frame-wise layers of the ``network`` dict: RETURNN's ``activation`` and ``combine``."""
from __future__ import annotations

from typing import Callable

import tensorflow as tf

from engine.model.layers.base import Layer
from engine.model.layers.dense import ACTIVATIONS, activation_option
from engine.runtime.errors import ConfigError

# RETURNN's combine kinds that are one binary op, folded left over the sources (``average``: their mean)
COMBINE_KINDS: dict[str, Callable[[tf.Tensor, tf.Tensor], tf.Tensor]] = {
    "add": tf.add,
    "sub": tf.subtract,
    "mul": tf.multiply,
    "truediv": tf.truediv,
    "maximum": tf.maximum,
    "minimum": tf.minimum,
    "average": tf.add,
}


class Activation(Layer):
    """``activation``: the function named by ``activation`` (``dense.ACTIVATIONS``) on every frame."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        if "activation" not in opts:
            raise ConfigError(f"Network layer '{name}': 'activation' is required for class 'activation'.")
        self.activation = ACTIVATIONS[activation_option(name, opts)]

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return x if self.activation is None else self.activation(x)


class Combine(Layer):
    """``combine``: ``kind`` applied to the sources left to right (((a op b) op c) ...), then ``with_bias``
    (a parameter ``b``, default off as in RETURNN) and ``activation``. Every source has the same feature
    dim and time axis (RETURNN broadcasts only over matching dims, and all sources here are (T, B, F))."""

    separate_sources = True
    takes_spatial = True

    def __init__(self, name: str, opts: dict, source_dims: dict[str, int]) -> None:
        dims = set(source_dims.values())
        if len(dims) != 1:
            listed = ", ".join(f"'{src}' {dim}" for src, dim in source_dims.items())
            raise ConfigError(f"Network layer '{name}': combine needs sources of one feature dim, "
                              f"got {listed}.")
        super().__init__(dims.pop())
        if opts.get("dropout"):
            raise ConfigError(f"Network layer '{name}': RETURNN's combine layer takes no 'dropout' (it "
                              "does not concatenate its sources); put a dropout on a source layer instead.")
        kind = opts.get("kind")
        if kind not in COMBINE_KINDS:
            raise ConfigError(f"Network layer '{name}': combine kind {kind!r} is not supported; supported: "
                              f"{', '.join(COMBINE_KINDS)}.")
        if opts.get("n_out", self.n_out) != self.n_out:
            raise ConfigError(f"Network layer '{name}': n_out {opts['n_out']!r} differs from the sources' "
                              f"dim {self.n_out}.")
        self.kind = kind
        self.activation = ACTIVATIONS[activation_option(name, opts)]
        if opts.get("with_bias", False):
            self.params["b"] = tf.Variable(tf.zeros([self.n_out]), name=f"{name}/b")

    def __call__(self, xs: list[tf.Tensor], lengths: tf.Tensor, training: bool) -> tf.Tensor:
        op = COMBINE_KINDS[self.kind]
        y = xs[0]
        for x in xs[1:]:
            y = op(y, x)
        if self.kind == "average":
            y = y / float(len(xs))
        if "b" in self.params:
            y = tf.nn.bias_add(y, self.param("b"))
        return y if self.activation is None else self.activation(y)
