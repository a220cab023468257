"""RETURNN's ``transposed_conv`` over time (1-D): each input frame spreads over ``strides`` output frames.

As ``tf.nn.conv2d_transpose``, which RETURNN calls: output length n · s with padding "same", n · s +
max(size - s, 0) with "valid" (Keras' formula; RETURNN's ``output_padding`` None), minus 2 ·
``remove_padding``. Input frames outside a sequence read as zeros (RETURNN reads whatever its padding
holds), so a sequence gives the same output alone or in a batch.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.initializers import option_variable
from engine.model.layers.base import Layer, one_of, positive_int, time_mask
from engine.model.layers.conv import PADDINGS
from engine.model.layers.dense import ACTIVATIONS, activation_option
from engine.runtime.errors import ConfigError


def _one_int(layer: str, opts: dict, key: str, default: object) -> int:
    value = opts.get(key, default)
    items = value if isinstance(value, (list, tuple)) else [value]
    if len(items) != 1:
        raise ConfigError(f"Network layer '{layer}': '{key}' must be a list of one positive int like [3]: "
                          f"this engine's transposed_conv runs over time only (1-D), got {value!r}.")
    return positive_int(layer, {key: items[0]}, key)


class TransposedConv(Layer):
    """``transposed_conv``: ``filter_size`` [width], ``strides`` [= ``filter_size``], ``padding`` ["same"],
    ``remove_padding`` [0], ``n_out``, ``activation``, ``with_bias`` [True, RETURNN's default here].
    Parameters ``W_native_transposed_conv`` (width, 1, n_out, in), RETURNN's name and layout, and
    ``bias``."""

    def __init__(self, name: str, opts: dict, in_dim: int, *, random_seed: int) -> None:
        super().__init__(in_dim)
        if "filter_size" not in opts:
            raise ConfigError(f"Network layer '{name}': 'filter_size' is required.")
        self.size = _one_int(name, opts, "filter_size", None)
        self.stride = _one_int(name, opts, "strides", opts["filter_size"])
        self.padding = one_of(name, opts, "padding", PADDINGS, "same")
        remove = opts.get("remove_padding", 0)
        remove = remove[0] if isinstance(remove, (list, tuple)) and len(remove) == 1 else remove
        if isinstance(remove, bool) or not isinstance(remove, int) or remove < 0:
            raise ConfigError(f"Network layer '{name}': 'remove_padding' must be an int >= 0, got "
                              f"{remove!r}.")
        self.remove = remove
        if opts.get("output_padding") not in (None, [None], (None,)):
            raise ConfigError(f"Network layer '{name}': 'output_padding' is not implemented (its output "
                              "lengths follow from the padding alone here).")
        self.n_out = positive_int(name, opts, "n_out")
        self.activation = ACTIVATIONS[activation_option(name, opts)]
        self.params["W_native_transposed_conv"] = option_variable(
            name, opts, "forward_weights_init", f"{name}/W_native_transposed_conv",
            (self.size, 1, self.n_out, in_dim), random_seed)
        if opts.get("with_bias", True):
            self.params["bias"] = option_variable(name, opts, "bias_init", f"{name}/bias", (self.n_out,),
                                                  random_seed)

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        grown = lengths * self.stride + (max(self.size - self.stride, 0) if self.padding == "valid" else 0)
        return tf.maximum(grown - 2 * self.remove, 0)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        # time-major (T, B, in) as one image (1, T, B, in), the batch as its width: no transposes (their
        # gradients took as long as the op's); expand_dims and squeeze: their gradients are reshapes
        x = tf.expand_dims(time_mask(x, lengths), 0)
        shape = tf.shape(x)
        n_time = self.out_lengths(shape[1]) + 2 * self.remove
        y = tf.nn.conv2d_transpose(x, self.param("W_native_transposed_conv"),
                                   tf.stack([1, n_time, shape[2], self.n_out]), [1, self.stride, 1, 1],
                                   self.padding.upper())
        y = tf.squeeze(y, 0)
        if self.remove:
            y = y[self.remove:-self.remove]
        if "bias" in self.params:
            y = tf.nn.bias_add(y, self.param("bias"))
        return y if self.activation is None else self.activation(y)
