"""RETURNN's ``conv`` and ``pool`` with a window over two axes: time and one static axis.

The input is (T, B, S, C): a static axis S (made by ``split_dims``, or by ``input_add_feature_dim``, which
makes the features that axis and adds a channel axis of 1) and the channels C. The output is
(T', B, S', n_out) (conv) or (T', B, S', C) (pool). Along time the window is placed as the 1-D layers of
``conv.py`` place it (frames outside a sequence read as zeros or are left out, the "same" left padding
fixed, so a sequence gives the same output alone or in a batch); along S, which is static, exactly as
TensorFlow's "same" and "valid" place it, as in RETURNN. Both run as one TensorFlow window op on the
batch-major tensor, padded explicitly.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.axes import Layout
from engine.model.initializers import option_variable
from engine.model.layers.base import Layer, one_of, positive_int
from engine.model.layers.conv import Window, conv_groups, out_length, same_left_pad, window_options
from engine.model.layers.dense import ACTIVATIONS, activation_option
from engine.runtime.errors import ConfigError


def static_out_size(size: int, window: Window) -> int:
    reach = (window.size - 1) * window.dilation
    return -(-size // window.stride) if window.padding == "same" else -(-(size - reach) // window.stride)


def _static_pads(size: int, window: Window) -> tuple[int, int]:
    """TensorFlow's "same" padding of a static axis (more on the right when odd)."""
    if window.padding == "valid":
        return 0, 0
    total = max((static_out_size(size, window) - 1) * window.stride + (window.size - 1) * window.dilation + 1
                - size, 0)
    return total // 2, total - total // 2


def masked(x: tf.Tensor, lengths: tf.Tensor, fill: float) -> tf.Tensor:
    """Batch-major (B, T, S, C) with the frames past each sequence set to ``fill``."""
    valid = tf.sequence_mask(lengths, tf.shape(x)[1])[:, :, None, None]
    return tf.where(valid, x, tf.cast(fill, x.dtype))


def same_as_tensorflow(time: Window, space: Window) -> bool:
    """Whether TensorFlow's own "SAME" pads as ``padded`` does: along time, where the stride is
    1 (its left padding then does not depend on the number of frames), and along the static axis always."""
    return time.padding == space.padding == "same" and time.stride == 1 and time.dilation == 1


def padded(x: tf.Tensor, lengths: tf.Tensor, time: Window, space: Window, fill: float) -> tf.Tensor:
    """Batch-major (B, T, S, C) -> (B, T_pad, S_pad, C), the frames past each sequence and the padding set
    to ``fill``, so that a "VALID" window op gives the layer's output frames."""
    n_time = tf.shape(x)[1]
    left = same_left_pad(time.size, time.stride, time.dilation) if time.padding == "same" else 0
    n_out = tf.maximum(out_length(n_time, time.size, time.stride, time.dilation, time.padding), 1)
    right = tf.maximum((n_out - 1) * time.stride + (time.size - 1) * time.dilation + 1 - n_time - left, 0)
    s_left, s_right = _static_pads(x.shape[2], space)
    return tf.pad(masked(x, lengths, fill), [[0, 0], [left, right], [s_left, s_right], [0, 0]],
                  constant_values=fill)


class _Windowed2D(Layer):
    """What 2-D ``conv`` and ``pool`` share: the window, the input's static axis and the output lengths."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, layout: Layout, cls: str) -> None:
        self.add_feature_axis = opts.get("input_add_feature_dim", False)
        if not isinstance(self.add_feature_axis, bool):
            raise ConfigError(f"Network layer '{name}': 'input_add_feature_dim' must be True or False.")
        if self.add_feature_axis and not layout.spatial:
            layout = Layout((layout.feature,), 1)
        if len(layout.spatial) != 1:
            raise ConfigError(f"Network layer '{name}': a window over two axes needs an input (T, B, S, C) "
                              f"with one static axis S; its input is {layout.describe()} (make S with "
                              "'split_dims' or 'input_add_feature_dim': True).")
        super().__init__(layout.feature)
        self.time, self.space = window_options(name, opts, cls)
        if self.time.dilation > 1 or self.space.dilation > 1:
            raise ConfigError(f"Network layer '{name}': 'dilation_rate' must be 1 for a window over two "
                              "axes: RETURNN (1.2026, TensorFlow 2.15) fails on its own shape check when it "
                              "builds a dilated 2-D convolution, and its pooling over two axes runs "
                              "TensorFlow's, which has no dilation.")
        self.spatial = (static_out_size(layout.spatial[0], self.space),)
        if self.spatial[0] < 1:
            raise ConfigError(f"Network layer '{name}': the window {self.space.size} is wider than the "
                              f"static axis {layout.spatial[0]} it slides over with padding 'valid'.")

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return out_length(lengths, self.time.size, self.time.stride, self.time.dilation, self.time.padding)

    def with_channels(self, x: tf.Tensor) -> tf.Tensor:
        """``input_add_feature_dim``: the features as the static axis, one channel."""
        return x[..., None] if self.add_feature_axis and x.shape.rank == 3 else x

    @property
    def frame_by_frame(self) -> bool:
        """A window of one frame, every frame: each output frame reads its own input frame only, so the op
        runs on the time-major (T, B, S, C) as it is, the batch as the image's height (no transpose, and
        the frames past a sequence need no masking: they reach no frame inside it)."""
        return self.time.size == 1 and self.time.stride == 1


class Conv2D(_Windowed2D):
    """``conv`` with ``filter_size`` (time, S): ``padding``, ``strides``, ``dilation_rate``, ``n_out``,
    ``activation``, ``with_bias`` [False, as ``conv.Conv``], ``groups`` (1 or C), ``input_add_feature_dim``.
    Parameters ``W`` (time, S, C / groups, n_out) and ``bias`` (n_out), RETURNN's names and layout."""

    def __init__(self, name: str, opts: dict, layout: Layout, *, random_seed: int) -> None:
        super().__init__(name, opts, layout, "conv")
        self.n_out = positive_int(name, opts, "n_out")
        self.activation = ACTIVATIONS[activation_option(name, opts)]
        self.depthwise = conv_groups(name, opts, self.in_dim, self.n_out) > 1
        shape = (self.time.size, self.space.size, 1 if self.depthwise else self.in_dim, self.n_out)
        self.params["W"] = option_variable(name, opts, "forward_weights_init", f"{name}/W", shape,
                                           random_seed)
        if opts.get("with_bias", False):
            self.params["bias"] = option_variable(name, opts, "bias_init", f"{name}/bias", (self.n_out,),
                                                  random_seed)

    def on_batch_major(self, x: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
        """Batch-major (B, T, S, C) -> (B, T', S', n_out)."""
        strides = [1, self.time.stride, self.space.stride, 1]
        weights = self.param("W")
        if self.depthwise:
            multiplier = self.n_out // self.in_dim
            weights = tf.reshape(weights, [self.time.size, self.space.size, self.in_dim, multiplier])
            y = tf.nn.depthwise_conv2d(padded(x, lengths, self.time, self.space, 0.0), weights, strides,
                                       "VALID")
        elif self.frame_by_frame:
            y = tf.nn.conv2d(x, weights, strides, self.space.padding.upper())
        elif same_as_tensorflow(self.time, self.space):  # a pad and its gradient cost a pass over x each
            y = tf.nn.conv2d(masked(x, lengths, 0.0), weights, strides, "SAME")
        else:  # (explicit paddings would take TensorFlow's own kernels, not oneDNN's: 3x the time)
            y = tf.nn.conv2d(padded(x, lengths, self.time, self.space, 0.0), weights, strides, "VALID")
        if "bias" in self.params:  # oneDNN fuses the convolution and its bias
            y = tf.nn.bias_add(y, self.param("bias"))
        return y if self.activation is None else self.activation(y)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        x = self.with_channels(x)
        if self.frame_by_frame and not self.depthwise:  # the same op on (T, B, S, C)
            return self.on_batch_major(x, lengths)
        return tf.transpose(self.on_batch_major(tf.transpose(x, [1, 0, 2, 3]), lengths), [1, 0, 2, 3])


class Pool2D(_Windowed2D):
    """``pool`` with ``pool_size`` (time, S): ``mode`` "max"/"avg", ``strides`` [``pool_size``], ``padding``
    ["valid"], ``input_add_feature_dim``; ``dilation_rate`` only 1 (TensorFlow's 2-D pooling has none).
    Frames outside a sequence and the padding are left out: max over the rest, their mean."""

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(name, opts, layout, "pool")
        if "mode" not in opts:
            raise ConfigError(f"Network layer '{name}': 'mode' is required ('max' or 'avg').")
        self.mode = one_of(name, opts, "mode", ("max", "avg"), None)

    def on_batch_major(self, x: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
        """Batch-major (B, T, S, C) -> (B, T', S', C)."""
        size, strides = [self.time.size, self.space.size], [self.time.stride, self.space.stride]
        if self.mode == "max" and self.frame_by_frame:  # a window never holds padding alone along S
            return tf.nn.max_pool2d(x, size, strides, self.space.padding.upper())
        if self.mode == "max":
            lowest = x.dtype.min
            y = tf.nn.max_pool2d(padded(x, lengths, self.time, self.space, lowest), size, strides, "VALID")
            return tf.where(y > lowest, y, tf.zeros_like(y))  # a window without a frame of its sequence

        def window_sums(values: tf.Tensor) -> tf.Tensor:
            window = float(self.time.size * self.space.size)
            return tf.nn.avg_pool2d(padded(values, lengths, self.time, self.space, 0.0), size, strides,
                                    "VALID") * window

        return window_sums(x) / tf.maximum(window_sums(tf.ones_like(x[..., :1])), 1.0)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        x = self.with_channels(x)
        if self.mode == "max" and self.frame_by_frame:  # the same op on (T, B, S, C)
            return self.on_batch_major(x, lengths)
        return tf.transpose(self.on_batch_major(tf.transpose(x, [1, 0, 2, 3]), lengths), [1, 0, 2, 3])
