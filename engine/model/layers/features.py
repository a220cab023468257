"""Layers of the ``network`` dict that change the feature axis of every frame: RETURNN's ``gating``,
``reduce_out`` and ``slice`` (on the feature axis). Time and batch stay as they are."""
from __future__ import annotations

import tensorflow as tf

from engine.model.layers.base import Layer, positive_int
from engine.model.layers.dense import ACTIVATIONS, activation_option
from engine.runtime.errors import ConfigError

# RETURNN's axis strings that name the feature axis of a (time, batch, feature) output (lower-cased)
FEATURE_AXIS_NAMES = ("f", "feature")
_REDUCE_OUT_MODES = {"max": tf.reduce_max, "sum": tf.reduce_sum, "mean": tf.reduce_mean,
                     "avg": tf.reduce_mean}


def _declared_n_out(name: str, opts: dict, n_out: int, why: str) -> int:
    if opts.get("n_out", n_out) != n_out:
        raise ConfigError(f"Network layer '{name}': n_out {opts['n_out']!r} must be {n_out} ({why}).")
    return n_out


class Gating(Layer):
    """``gating`` (a GLU): the input's features split in two halves a | b (with two sources of one dim: the
    sources), out = ``activation``(a) * ``gate_activation``(b), ``n_out`` = half the input's dim. As in
    RETURNN, ``activation`` is required and ``gate_activation`` is ``sigmoid`` by default."""

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        if "activation" not in opts:
            raise ConfigError(f"Network layer '{name}': 'activation' is required for class 'gating' "
                              "(RETURNN's has no default; 'identity' makes a GLU).")
        if in_dim % 2:
            raise ConfigError(f"Network layer '{name}': gating splits its input's features in two halves, "
                              f"but its input has dim {in_dim}, an odd number.")
        self.n_out = _declared_n_out(name, opts, in_dim // 2, f"half the input's dim {in_dim}")
        self.activation = ACTIVATIONS[activation_option(name, opts)]
        gate = activation_option(name, {"activation": opts.get("gate_activation", "sigmoid")})
        self.gate_activation = ACTIVATIONS[gate]

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        a, b = tf.split(x, 2, axis=-1)
        if self.activation is not None:
            a = self.activation(a)
        return a if self.gate_activation is None else a * self.gate_activation(b)


class ReduceOut(Layer):
    """``reduce_out`` (maxout with ``mode`` max): each run of ``num_pieces`` consecutive features is reduced
    to one by ``mode`` (``max``, ``sum``, ``mean`` or ``avg``), so ``n_out`` = in_dim / num_pieces."""

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        mode = opts.get("mode")
        if mode not in _REDUCE_OUT_MODES:
            raise ConfigError(f"Network layer '{name}': reduce_out mode {mode!r} is not one of "
                              f"{', '.join(map(repr, _REDUCE_OUT_MODES))}.")
        self.reduce = _REDUCE_OUT_MODES[mode]
        self.num_pieces = positive_int(name, opts, "num_pieces")
        if in_dim % self.num_pieces:
            raise ConfigError(f"Network layer '{name}': its input's dim {in_dim} is not a multiple of "
                              f"num_pieces {self.num_pieces}.")
        self.n_out = _declared_n_out(name, opts, in_dim // self.num_pieces, "the input's dim / num_pieces")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        shape = tf.shape(x)
        pieces = tf.reshape(x, tf.concat([shape[:-1], [self.n_out, self.num_pieces]], axis=0))
        return self.reduce(pieces, axis=-1)


class FeatureSlice(Layer):
    """``slice`` on the feature axis (``axis`` ``"F"``): features [slice_start:slice_end:slice_step] of every
    frame, as Python slices them. Slicing time, batch or another axis is refused by name."""

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        axis = opts.get("axis")
        if not isinstance(axis, str) or axis.lower() not in FEATURE_AXIS_NAMES:
            raise ConfigError(f"Network layer '{name}': slice along axis {axis!r} is not implemented; this "
                              "engine slices the feature axis only (axis 'F').")
        bounds = [opts.get(key) for key in ("slice_start", "slice_end", "slice_step")]
        if not all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in bounds):
            raise ConfigError(f"Network layer '{name}': slice_start, slice_end and slice_step must be ints "
                              f"or None, got {bounds}.")
        if bounds[0] is not None and bounds[0] < 0:
            raise ConfigError(f"Network layer '{name}': slice_start must be at least 0, as in RETURNN, got "
                              f"{bounds[0]}.")
        if bounds[2] == 0:
            raise ConfigError(f"Network layer '{name}': slice_step must not be 0.")
        self.slice = slice(*bounds)
        self.n_out = _declared_n_out(name, opts, len(range(in_dim)[self.slice]), f"the slice's width of "
                                     f"the input's {in_dim} features")
        if self.n_out == 0:
            raise ConfigError(f"Network layer '{name}': the slice {bounds} of the input's {in_dim} features "
                              "is empty.")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return x[..., self.slice]
