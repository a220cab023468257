"""Convolution and pooling over time: RETURNN's ``conv`` and ``pool`` layers, 1-D only.

Both read windows of ``size`` frames, ``dilation`` apart, every ``stride`` frames (``frame_windows``). With
padding "valid" output frame i reads input frames i*s .. i*s + (size-1)*d; with "same" the window starts
``same_left_pad`` frames earlier and frames outside a sequence read as zeros (conv) or are left out
(pool). Output lengths follow RETURNN's ``ConvLayer.calc_out_dim``: ceil(n / s) for "same",
max(ceil((n - (size-1)*d) / s), 0) for "valid".

Every window depends on its own sequence's frames only, so a sequence gives the same output alone or in
a padded batch. TensorFlow's own "same" padding would not: with a stride above 1 its left padding
depends on the (batch) length modulo the stride. Here the left padding is
max((size-1)*d + 1 - s, 0) // 2, TensorFlow's value when the length is a multiple of the stride (and for
every length when s = 1).
"""
from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from engine.model.initializers import option_variable
from engine.model.layers.base import Layer, dense_gather, one_of, positive_int, time_mask
from engine.model.layers.dense import ACTIVATIONS, activation_option
from engine.runtime.errors import ConfigError

PADDINGS = ("same", "valid")


def out_length(n: tf.Tensor, size: int, stride: int, dilation: int, padding: str) -> tf.Tensor:
    """Output frames for ``n`` input frames (RETURNN's formula)."""
    if padding == "same":
        return -(-n // stride)
    return tf.maximum(-(-(n - (size - 1) * dilation) // stride), 0)


def same_left_pad(size: int, stride: int, dilation: int) -> int:
    return max((size - 1) * dilation + 1 - stride, 0) // 2


def frame_windows(x: tf.Tensor, lengths: tf.Tensor, size: int, stride: int, dilation: int,
                  padding: str) -> tuple[tf.Tensor, tf.Tensor]:
    """(T, B, F) -> the windows (T_out, size, B, F) and whether each frame is inside its sequence
    (T_out, size, B); frames outside are 0."""
    n_time = tf.shape(x)[0]
    left = same_left_pad(size, stride, dilation) if padding == "same" else 0
    n_out = out_length(n_time, size, stride, dilation, padding)
    pos = tf.range(n_out)[:, None] * stride - left + tf.range(size)[None, :] * dilation  # (T_out, size)
    frames = dense_gather(x, tf.clip_by_value(pos, 0, tf.maximum(n_time - 1, 0)))
    valid = (pos[:, :, None] >= 0) & (pos[:, :, None] < lengths[None, None, :])
    return tf.where(valid[..., None], frames, tf.zeros_like(frames)), valid


def _ints(layer: str, opts: dict, key: str, default: object, count: int) -> tuple[int, ...]:
    """A window option of ``count`` axes: a sequence of that many ints, or (not for sizes) one int for all."""
    value = opts.get(key, default)
    allow_int = key not in ("filter_size", "pool_size")  # RETURNN takes these as sequences only
    items = list(value) if isinstance(value, (list, tuple)) else [value] * count
    if (not allow_int and not isinstance(value, (list, tuple))) or len(items) != count:
        example = "(3,)" if count == 1 else "(3, 3)"
        raise ConfigError(f"Network layer '{layer}': '{key}' must be {'an int or ' if allow_int else ''}a "
                          f"tuple of {count} positive int{'s' if count > 1 else ''} like {example}, one per "
                          f"axis of the window, got {value!r}.")
    return tuple(positive_int(layer, {key: item}, key) for item in items)


def window_axes(name: str, opts: dict, cls: str) -> int:
    """How many axes the window of a ``conv`` or ``pool`` layer spans: 1 (time) or 2 (time and a static
    axis, e.g. one made by ``split_dims``)."""
    key = "filter_size" if cls == "conv" else "pool_size"
    value = opts.get(key)
    if not isinstance(value, (list, tuple)) or len(value) not in (1, 2):
        raise ConfigError(f"Network layer '{name}': '{key}' must be a tuple of one positive int like (3,) (a "
                          "window over time) or of two like (3, 3) (over time and a static axis); 3-D "
                          f"windows are not implemented, got {value!r}.")
    return len(value)


def conv_groups(name: str, opts: dict, in_dim: int, n_out: int) -> int:
    """``groups``: 1, or the input dim (a depthwise convolution: each output channel reads one input
    channel, as RETURNN runs it with ``tf.nn.depthwise_conv2d``). Other counts RETURNN hands to
    ``tf.nn.convolution``, whose grouped form TensorFlow implements on GPU only."""
    groups = opts.get("groups", 1)
    if groups == 1:
        return 1
    if groups != in_dim or isinstance(groups, bool) or n_out % in_dim:
        raise ConfigError(f"Network layer '{name}': 'groups' must be 1 or the input dim {in_dim} (depthwise, "
                          f"with n_out a multiple of it), got groups {groups!r} and n_out {n_out}: other "
                          "group counts run on GPU only in RETURNN's TensorFlow backend.")
    return groups


class Window(NamedTuple):
    """The window geometry of a ``conv`` or ``pool`` layer along one axis."""

    size: int
    stride: int
    dilation: int
    padding: str

    @property
    def keeps_time(self) -> bool:
        """Whether output frame i belongs to input frame i (same lengths, one time axis)."""
        return self.stride == 1 and (self.padding == "same" or self.size == 1)


def window_options(name: str, opts: dict, cls: str) -> list[Window]:
    """The geometry of a ``conv`` or ``pool`` layer's options per window axis, time first, checked
    (ConfigError names the layer)."""
    count = window_axes(name, opts, cls)
    sizes = _ints(name, opts, "filter_size" if cls == "conv" else "pool_size", None, count)
    strides = _ints(name, opts, "strides", 1 if cls == "conv" else sizes, count)  # pool: RETURNN's default
    dilations = _ints(name, opts, "dilation_rate", 1, count)
    if cls == "conv" and "padding" not in opts:
        raise ConfigError(f"Network layer '{name}': 'padding' is required ('same' or 'valid').")
    padding = one_of(name, opts, "padding", PADDINGS, "valid")
    return [Window(*geometry, padding) for geometry in zip(sizes, strides, dilations)]


class _Windowed(Layer):
    """What ``conv`` and ``pool`` share: their window and its output lengths."""

    def __init__(self, name: str, opts: dict, in_dim: int, cls: str) -> None:
        super().__init__(in_dim)
        windows = window_options(name, opts, cls)
        if len(windows) != 1:
            raise ConfigError(f"Network layer '{name}': a window over two axes needs an input with a static "
                              "axis besides the features (made by 'split_dims', or 'input_add_feature_dim').")
        self.window = windows[0]
        self.size, self.stride, self.dilation, self.padding = self.window

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return out_length(lengths, self.size, self.stride, self.dilation, self.padding)

    def _windows(self, x: tf.Tensor, lengths: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return frame_windows(x, lengths, self.size, self.stride, self.dilation, self.padding)


class Conv(_Windowed):
    """``conv``: ``filter_size`` (width,), ``padding``, ``strides``, ``dilation_rate``, ``n_out``,
    ``activation``, ``with_bias`` [False: RETURNN's default for a config without ``behavior_version``; True
    only from version 10], ``groups`` (1 or the input dim).
    Parameters: ``W`` (width, in, n_out) and ``bias`` (n_out), RETURNN's names and layout."""

    def __init__(self, name: str, opts: dict, in_dim: int, *, random_seed: int) -> None:
        super().__init__(name, opts, in_dim, "conv")
        self.n_out = positive_int(name, opts, "n_out")
        self.activation = ACTIVATIONS[activation_option(name, opts)]
        self.depthwise = conv_groups(name, opts, in_dim, self.n_out) > 1
        self.params["W"] = option_variable(name, opts, "forward_weights_init", f"{name}/W",
                                           (self.size, 1 if self.depthwise else in_dim, self.n_out),
                                           random_seed)
        if opts.get("with_bias", False):
            self.params["bias"] = option_variable(name, opts, "bias_init", f"{name}/bias", (self.n_out,),
                                                  random_seed)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        if self.depthwise:
            return self._finish(self._depthwise(x, lengths))
        frames, _ = self._windows(x, lengths)  # (T_out, size, B, F)
        shape = tf.shape(frames)
        # one (T_out*B, size*F) x (size*F, n_out) matmul, the window flattened like the filter
        flat = tf.reshape(tf.transpose(frames, [0, 2, 1, 3]), [shape[0] * shape[2], self.size * self.in_dim])
        y = tf.matmul(flat, tf.reshape(self.param("W"), [self.size * self.in_dim, self.n_out]))
        return self._finish(tf.reshape(y, [shape[0], shape[2], self.n_out]))

    def _depthwise(self, x: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
        """Output channel f * multiplier + m reads input channel f only: TensorFlow's depthwise kernel over
        (1, T, B, F), time as the image's height and the batch as its width (no transpose), on the
        sequences' frames zero-padded as ``frame_windows`` reads them (windows gathered and multiplied
        cost a Conformer's step five times the kernel's time)."""
        n_time = tf.shape(x)[0]
        n_out = out_length(n_time, self.size, self.stride, self.dilation, self.padding)
        left = same_left_pad(self.size, self.stride, self.dilation) if self.padding == "same" else 0
        span = (tf.maximum(n_out, 1) - 1) * self.stride + (self.size - 1) * self.dilation + 1
        right = tf.maximum(span - left - n_time, 0)
        padded = tf.pad(time_mask(x, lengths), [[left, right], [0, 0], [0, 0]])
        weights = tf.reshape(self.param("W"), [self.size, 1, self.in_dim, self.n_out // self.in_dim])
        # the kernel takes a stride or a dilation; with both, every frame is computed and every stride-th kept
        stride = self.stride if self.dilation == 1 else 1
        y = tf.nn.depthwise_conv2d(padded[None], tf.cast(weights, x.dtype), [1, stride, 1, 1], "VALID",
                                   dilations=[self.dilation, 1])
        return y[0, ::self.stride // stride][:n_out]

    def _finish(self, y: tf.Tensor) -> tf.Tensor:
        if "bias" in self.params:
            y = tf.nn.bias_add(y, self.param("bias"))
        return y if self.activation is None else self.activation(y)


class Pool(_Windowed):
    """``pool``: ``mode`` "max"/"avg", ``pool_size`` (width,), ``strides`` (default ``pool_size``),
    ``padding`` (default "valid"), ``dilation_rate``. Only frames inside the sequence count: max over
    them, their mean; a window with none of them (possible only with dilation) gives 0."""

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(name, opts, in_dim, "pool")
        if "mode" not in opts:
            raise ConfigError(f"Network layer '{name}': 'mode' is required ('max' or 'avg').")
        self.mode = one_of(name, opts, "mode", ("max", "avg"), None)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        frames, valid = self._windows(x, lengths)
        valid = valid[..., None]
        count = tf.reduce_sum(tf.cast(valid, x.dtype), axis=1)  # (T_out, B, 1)
        if self.mode == "avg":
            return tf.reduce_sum(frames, axis=1) / tf.maximum(count, 1.0)
        lowest = tf.fill(tf.shape(frames), x.dtype.min)
        y = tf.reduce_max(tf.where(valid, frames, lowest), axis=1)
        return tf.where(count > 0, y, tf.zeros_like(y))
