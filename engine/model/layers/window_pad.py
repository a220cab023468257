"""RETURNN's ``window``, ``pad`` and ``swap_axes``: layers that add, grow or reorder the axes of a
(T, B, *static, F) output, as RETURNN's do at behaviour version 0.

- ``window`` slides a window of ``window_size`` frames over time and puts it on a new static axis right
  after the batch, RETURNN's place for it (batch-major (B, T, W, ..., F), right after time): (T', B, W,
  *static, F). Frames outside a sequence read as zeros, as in ``conv``, so a sequence gives the same
  windows alone or in a batch; RETURNN reads its input tensor's padding there, the same zeros for the data
  and for layers whose padding stays zero (not, e.g., after a linear layer with a bias).
- ``pad`` pads static axes, and the time axis on the left (and on the right only with
  ``handle_dynamic_dims``, which pads after each sequence's end); the lengths grow by the frames added.
- ``swap_axes`` swaps two static axes; the last axis stays the features, as in RETURNN, which keeps the
  feature axis at its default place, the last, after the layers this engine builds (split_dims, conv,
  pool, window, pad, linear, activation, slice, ...: RETURNN 1.2026 checked).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from engine.model.axes import BATCH, TIME, Layout, resolve_axes
from engine.model.layers.base import Layer, dense_gather, positive_int
from engine.model.layers.conv import out_length
from engine.runtime.errors import ConfigError

_PAD_MODES = ("constant", "reflect", "symmetric", "replication")


def _resolve_one(name: str, option: str, value: Any, layout: Layout) -> int:
    axes = resolve_axes(layout, value, layer=name, option=option)
    if len(axes) != 1:
        raise ConfigError(f"Network layer '{name}': {option} {value!r} must name one axis of its input "
                          f"{layout.describe()}, it names {len(axes)} (RETURNN takes one axis here).")
    return axes[0]


def _names_time(item: Any) -> bool:
    """Whether the axis string names the time axis of every input (``"T"``, ``"s:0"``, ...), so that the
    network's check of time axes can tell from the options alone."""
    try:
        return all(resolve_axes(layout, item, layer="", option="") == [TIME]
                   for layout in (Layout((), 1), Layout((1,), 2)))
    except ConfigError:
        return False


def _broadcast(mask: tf.Tensor, rank: int) -> tf.Tensor:
    """A mask over the leading axes of a tensor of ``rank`` axes, with size-1 axes for the rest."""
    return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([rank - mask.shape.rank], tf.int32)], 0))


# ----- window -----
class Window(Layer):
    """``window``: ``window_size``, ``padding`` ["same"] or "valid", ``window_left`` / ``window_right``
    (with "same"; by default the window is centred, one frame more on the right when even), ``stride`` [1]
    (every stride-th window), ``axis`` ["T"] (the time axis only)."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(layout.feature)
        self.size = positive_int(name, opts, "window_size")
        self.stride = positive_int(name, {"stride": opts.get("stride", 1)}, "stride")
        self.padding = opts.get("padding", "same")
        if self.padding not in ("same", "valid"):  # RETURNN compares the lower-case strings exactly
            raise ConfigError(f"Network layer '{name}': 'padding' must be 'same' or 'valid' (lower case, as "
                              f"RETURNN's window takes it), got {self.padding!r}.")
        if _resolve_one(name, "'axis'", opts.get("axis", "T"), layout) != TIME:
            raise ConfigError(f"Network layer '{name}': 'axis' {opts['axis']!r} is not the time axis; this "
                              "engine windows over time only.")
        self.left = self._left(name, opts.get("window_left"), opts.get("window_right"))
        self.spatial = (self.size, *layout.spatial)

    def _left(self, name: str, left: Any, right: Any) -> int:
        for key, value in (("window_left", left), ("window_right", right)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value < self.size):
                raise ConfigError(f"Network layer '{name}': '{key}' must be an int from 0 to window_size - 1 "
                                  f"= {self.size - 1}, got {value!r}.")
        if self.padding == "valid":
            if left is not None or right is not None:
                raise ConfigError(f"Network layer '{name}': 'window_left' and 'window_right' go with padding "
                                  "'same' only (RETURNN refuses them with 'valid').")
            return 0
        if left is not None and right is not None and left + right + 1 != self.size:
            raise ConfigError(f"Network layer '{name}': window_left {left} + window_right {right} + 1 must "
                              f"be window_size {self.size}.")
        if left is not None:
            return left
        return self.size - 1 - (self.size // 2 if right is None else right)

    @property
    def changes_time(self) -> bool:
        return self.stride > 1 or (self.padding == "valid" and self.size > 1)

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return out_length(lengths, self.size, self.stride, 1, self.padding)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        n_time = tf.shape(x)[0]
        n_out = out_length(n_time, self.size, self.stride, 1, self.padding)
        pos = tf.range(n_out)[:, None] * self.stride - self.left + tf.range(self.size)[None, :]  # (T', W)
        frames = dense_gather(x, tf.clip_by_value(pos, 0, tf.maximum(n_time - 1, 0)))  # (T', W, B, ..., F)
        valid = (pos[:, :, None] >= 0) & (pos[:, :, None] < lengths[None, None, :])  # (T', W, B)
        frames = tf.where(_broadcast(valid, x.shape.rank + 1), frames, tf.zeros_like(frames))
        return tf.transpose(frames, [0, 2, 1, *range(3, x.shape.rank + 1)])  # (T', B, W, ..., F)


# ----- pad -----
def _pad_items(name: str, opts: dict) -> tuple[list, list[tuple[int, int]]]:
    """The axis strings of ``axes`` and the (left, right) padding of each, as RETURNN reads ``padding``:
    an int for both sides of every axis, one (left, right) pair for every axis, or a pair per axis."""
    axes = opts.get("axes")
    items = list(axes) if isinstance(axes, (list, tuple)) else [axes]
    padding = opts.get("padding")

    def side(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"Network layer '{name}': 'padding' must hold ints >= 0 (dim tags are not "
                              f"taken here), got {padding!r}.")
        return value

    if isinstance(padding, (list, tuple)) and padding and isinstance(padding[0], (list, tuple)):
        pairs = padding
    elif isinstance(padding, (list, tuple)):
        pairs = [padding] * len(items)
    else:
        pairs = [(padding, padding)] * len(items)
    if len(pairs) != len(items) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise ConfigError(f"Network layer '{name}': 'padding' must be an int, a pair (left, right) or one "
                          f"pair per axis of 'axes' {axes!r}, got {padding!r}.")
    return items, [(side(left), side(right)) for left, right in pairs]


class Pad(Layer):
    """``pad``: ``axes`` (one axis string or a list; each names one axis), ``padding``, ``mode``
    ["constant"], "reflect", "symmetric" or "replication" (one axis), ``value`` [0] (with "constant"),
    ``handle_dynamic_dims`` [False at behaviour version 0]."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(layout.feature)
        items, pairs = _pad_items(name, opts)
        axes = [_resolve_one(name, "'axes'", item, layout) for item in items]
        if len(set(axes)) != len(axes) or BATCH in axes:
            raise ConfigError(f"Network layer '{name}': 'axes' {opts.get('axes')!r} must name different axes "
                              f"of its input {layout.describe()}, not the batch.")
        self.mode = opts.get("mode", "constant")
        self.mode = self.mode.lower() if isinstance(self.mode, str) else self.mode
        if self.mode not in _PAD_MODES:
            raise ConfigError(f"Network layer '{name}': 'mode' must be one of {', '.join(_PAD_MODES)} "
                              f"(RETURNN's TensorFlow backend runs no other), got {opts.get('mode')!r}.")
        self.value = opts.get("value", 0)
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise ConfigError(f"Network layer '{name}': 'value' must be a number (a value from a layer is "
                              f"not implemented), got {self.value!r}.")
        handle = opts.get("handle_dynamic_dims")
        if handle is not None and not isinstance(handle, bool):
            raise ConfigError(f"Network layer '{name}': 'handle_dynamic_dims' must be True or False, got "
                              f"{handle!r}.")
        self.paddings = [[0, 0] for _ in range(layout.ndim)]
        for item, axis, pair in zip(items, axes, pairs):
            self.paddings[axis] = list(pair)
            if axis == TIME:
                self._check_time(name, item, pair, bool(handle))
            else:
                self._check_static(name, item, pair, layout.size(axis))
        if self.mode == "replication" and len(axes) != 1:
            raise ConfigError(f"Network layer '{name}': mode 'replication' pads one axis only (RETURNN's "
                              f"implementation), 'axes' names {len(axes)}.")
        self.left, self.right = self.paddings[TIME]
        sizes = [layout.size(a) + sum(self.paddings[a]) for a in layout.static_axes()]
        self.spatial, self.n_out = tuple(sizes[:-1]), sizes[-1]

    def _check_time(self, name: str, item: Any, pair: tuple[int, int], handle: bool) -> None:
        if pair == (0, 0):
            return
        if not _names_time(item):
            raise ConfigError(f"Network layer '{name}': 'axes' {item!r} names the time axis of this input "
                              "only; name it 'T' to pad it (the network checks time axes from the options).")
        if self.mode != "constant":
            raise ConfigError(f"Network layer '{name}': mode {self.mode!r} on the time axis reads frames "
                              "past a short sequence's end in RETURNN; only 'constant' pads the time axis "
                              "here.")
        if pair[1] and not handle:
            raise ConfigError(f"Network layer '{name}': right padding of the time axis needs "
                              "'handle_dynamic_dims': True; without it RETURNN (behaviour version 0) pads "
                              "the end of the batch, so a shorter sequence gets its padding frames, not "
                              "'value'.")

    def _check_static(self, name: str, item: Any, pair: tuple[int, int], size: int) -> None:
        limit = {"reflect": size - 1, "symmetric": size}.get(self.mode)
        if limit is not None and max(pair) > limit:
            raise ConfigError(f"Network layer '{name}': mode {self.mode!r} pads axis {item!r} of size {size} "
                              f"by at most {limit} on a side, got {pair}.")

    @property
    def changes_time(self) -> bool:
        return self.left + self.right > 0

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return lengths + self.left + self.right

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        if not any(left or right for left, right in self.paddings):
            return x
        if self.mode == "replication":
            axis = next(a for a, pair in enumerate(self.paddings) if pair != [0, 0])
            (left, right), size = self.paddings[axis], x.shape[axis]
            return tf.gather(x, tf.constant([0] * left + list(range(size)) + [size - 1] * right, tf.int32),
                             axis=axis)
        value = tf.cast(self.value, x.dtype)
        y = tf.pad(x, self.paddings, mode=self.mode.upper(), constant_values=value)
        if self.right:  # handle_dynamic_dims: the frames after each sequence's own end
            inside = tf.transpose(tf.sequence_mask(lengths + self.left, tf.shape(y)[0]))  # (T', B)
            y = tf.where(_broadcast(inside, x.shape.rank), y, value)
        return y


# ----- swap_axes -----
class SwapAxes(Layer):
    """``swap_axes``: ``axis1``, ``axis2``, two different static axes (the features too): the result stays
    (T, B, ..., F), its last axis the features."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(layout.feature)
        if "axis1" not in opts or "axis2" not in opts:
            raise ConfigError(f"Network layer '{name}': 'axis1' and 'axis2' are required.")
        first = _resolve_one(name, "'axis1'", opts["axis1"], layout)
        second = _resolve_one(name, "'axis2'", opts["axis2"], layout)
        if TIME in (first, second) or BATCH in (first, second):
            raise ConfigError(f"Network layer '{name}': swapping the time or batch axis of "
                              f"{layout.describe()} is not implemented: the result would not be (T, B, ..., "
                              "F), the layout of every output here.")
        if first == second:
            raise ConfigError(f"Network layer '{name}': 'axis1' {opts['axis1']!r} and 'axis2' "
                              f"{opts['axis2']!r} name the same axis (RETURNN refuses that no-op).")
        self.perm = list(range(layout.ndim))
        self.perm[first], self.perm[second] = second, first
        sizes = [layout.size(a) for a in self.perm[2:]]
        self.spatial, self.n_out = tuple(sizes[:-1]), sizes[-1]

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return tf.transpose(x, self.perm)


def changes_time(cls: str, opts: dict) -> bool:
    """Whether a ``window`` or ``pad`` layer changes the frames of the time axis, from its options alone
    (the network's check of time axes runs before any layer is built; ``Pad`` refuses what this misses)."""
    if cls == "window":
        return opts.get("stride", 1) != 1 or (opts.get("padding", "same") == "valid"
                                              and opts.get("window_size") != 1)
    if cls != "pad":
        return False
    try:
        items, pairs = _pad_items("", opts)
    except ConfigError:
        return False  # the layer's build names the problem
    return any(_names_time(item) and pair != (0, 0) for item, pair in zip(items, pairs))
