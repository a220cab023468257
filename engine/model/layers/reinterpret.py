"""RETURNN's ``reinterpret_data``: with ``size_base``, the same frames with the lengths of another sequence;
with ``enforce_batch_major`` and ``set_axes`` that name the axes the input already has, a copy.

With ``size_base`` RETURNN only relabels the time axis; its losses then read the first ``length`` frames of
each sequence. Here the output is cut (or zero-padded) to the longest new length, so that it lines up
frame by frame with what it now belongs to (a hybrid's alignment after a down- and upsampling). A new
length beyond the frames the layer's input has for that sequence stops the step with an error: RETURNN
would read padding there.

``enforce_batch_major`` changes only where RETURNN keeps the batch axis, a layout; ``set_axes`` (RETURNN's
axis numbers of that batch-major view, (B, T, *spatial, F)) is accepted where it names the time and
feature axes the input already has (2022-swb-conformer-hybrid-sat's ``{'F': 2, 'T': 1}`` after a ``dot``),
and refused otherwise: relabelling axes is not implemented.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.axes import Layout
from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError


def size_base_of(name: str, opts: dict) -> str:
    """The stream (``"data:<stream>"``) or layer whose lengths the layer takes."""
    base = opts.get("size_base")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"Network layer '{name}': reinterpret_data needs 'size_base' (a layer, or a data "
                          f"stream as 'data:<stream>'), got {base!r}.")
    return "data:data" if base == "data" else base


_AXIS_NAMES = {"t": "T", "time": "T", "f": "F", "feature": "F"}


class ReinterpretData(Layer):
    """``reinterpret_data``: with ``size_base`` the network hands over the new lengths to ``resize``;
    without, a copy. Its options that relabel sparsity are refused (``spec.py``)."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(layout.feature)
        self.layer_name = name
        self.base = size_base_of(name, opts) if "size_base" in opts else None
        batch_major = opts.get("enforce_batch_major", False)
        if not isinstance(batch_major, bool):
            raise ConfigError(f"Network layer '{name}': enforce_batch_major must be True or False, got "
                              f"{batch_major!r}.")
        set_axes = opts.get("set_axes")
        if set_axes is None:
            return
        has = {"T": 1, "F": layout.ndim - 1}  # RETURNN's batch-major view of the input
        named = {_AXIS_NAMES.get(str(key).lower()): value for key, value in dict(set_axes).items()} \
            if isinstance(set_axes, dict) else None
        if not batch_major or not named or any(has.get(key) != value for key, value in named.items()):
            raise ConfigError(f"Network layer '{name}': set_axes {set_axes!r} is implemented only with "
                              "enforce_batch_major True and naming the axes the input "
                              f"{layout.describe()} already has as RETURNN numbers them batch-major "
                              f"({has}); relabelling axes is not implemented.")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return x

    def resize(self, x: tf.Tensor, lengths: tf.Tensor, new_lengths: tf.Tensor) -> tf.Tensor:
        """``x`` (T, B, ...) with ``lengths`` -> (max(new_lengths), B, ...)."""
        check = tf.debugging.assert_less_equal(
            new_lengths, lengths, message=f"Network layer '{self.layer_name}': size_base {self.base!r} "
                                          "gives a sequence "
                                          "more frames than the layer's input has")
        with tf.control_dependencies([check]):
            n_new = tf.reduce_max(new_lengths)
        n_time = tf.shape(x)[0]
        # tf.slice, not x[:n_new]: its gradient is a pad, a strided slice's took 5x as long
        first = tf.slice(x, tf.zeros([x.shape.rank], tf.int32),
                         tf.concat([[tf.minimum(n_new, n_time)], tf.fill([x.shape.rank - 1], -1)], axis=0))
        x = tf.pad(first, [[0, tf.maximum(n_new - n_time, 0)]] + [[0, 0]] * (x.shape.rank - 1))
        return x
