"""RETURNN's ``split_dims`` and ``merge_dims`` on the static axes of a (T, B, *spatial, F) output.

``split_dims`` turns one static axis into several (F=40 with ``dims`` (-1, 1) into a spatial axis of 40
and a feature axis of 1, the input of a 2-D ``conv``); ``merge_dims`` flattens static axes into one (the
spatial and channel axes after the convolutions back into features). Both are reshapes, in RETURNN's
order: a split axis becomes its parts major to minor, merged axes are flattened in their order in the
tensor (RETURNN's ``keep_order`` False, its default without a behaviour version) or in the order of
``axes`` (``keep_order`` True). The time and batch axes are never split or merged here: RETURNN pads the
time axis to a multiple for a split and loses the sequence lengths in a merge.
"""
from __future__ import annotations

import math

import tensorflow as tf

from engine.model.axes import BATCH, TIME, Layout, resolve_axes
from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError


def _refuse_time(layer: str, option: str, axes: list[int], layout: Layout) -> None:
    if TIME in axes or BATCH in axes:
        raise ConfigError(f"Network layer '{layer}': {option} names the time or batch axis of its input "
                          f"{layout.describe()}; this engine splits and merges static axes only (RETURNN "
                          "pads a split time axis to a multiple and a merge loses the sequence lengths).")


def _split_sizes(layer: str, dims: object, size: int) -> tuple[int, ...]:
    ok = isinstance(dims, (list, tuple)) and len(dims) >= 1 and all(
        isinstance(d, int) and not isinstance(d, bool) and (d > 0 or d == -1) for d in dims)
    if not ok or sum(d == -1 for d in dims) > 1:
        raise ConfigError(f"Network layer '{layer}': 'dims' must be a tuple of positive ints with at most "
                          f"one -1, like (-1, 1), got {dims!r}.")
    known = math.prod(d for d in dims if d > 0)
    rest = size // known if size % known == 0 else None
    if rest is None or (-1 not in dims and known != size):
        raise ConfigError(f"Network layer '{layer}': 'dims' {tuple(dims)} do not divide the axis of size "
                          f"{size} it splits.")
    return tuple(rest if d == -1 else d for d in dims)


class SplitDims(Layer):
    """``split_dims``: ``axis`` (a static axis: ``"F"``, ``"s:1"``, ...), ``dims``; ``pad_to_multiples``
    only False (RETURNN pads dynamic axes only)."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(layout.feature)
        if opts.get("pad_to_multiples") not in (None, False) or opts.get("pad_value", 0) != 0:
            raise ConfigError(f"Network layer '{name}': 'pad_to_multiples' and 'pad_value' are not taken: "
                              "the axes split here are static and must divide exactly.")
        if "axis" not in opts or "dims" not in opts:
            raise ConfigError(f"Network layer '{name}': 'axis' and 'dims' are required.")
        axes = resolve_axes(layout, opts["axis"], layer=name, option="'axis'")
        _refuse_time(name, "'axis'", axes, layout)
        if len(axes) != 1:
            raise ConfigError(f"Network layer '{name}': 'axis' {opts['axis']!r} must name one axis.")
        self.axis = axes[0]
        parts = _split_sizes(name, opts["dims"], layout.size(self.axis))
        sizes = [*layout.spatial, layout.feature]
        sizes[self.axis - 2: self.axis - 1] = parts
        self.spatial, self.n_out = tuple(sizes[:-1]), sizes[-1]

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        shape = tf.shape(x)
        return tf.reshape(x, tf.concat([shape[:2], list(self.spatial) + [self.n_out]], axis=0))


class MergeDims(Layer):
    """``merge_dims``: ``axes`` (static axes: ``"static"``, ``"except_time"``, ``["s:1", "f"]``, ...),
    ``keep_order`` [False], ``n_out`` (checked against the merged size)."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(layout.feature)
        axes = resolve_axes(layout, opts.get("axes"), layer=name, option="'axes'")
        _refuse_time(name, "'axes'", axes, layout)
        keep_order = opts.get("keep_order", False)
        if not isinstance(keep_order, bool):
            raise ConfigError(f"Network layer '{name}': 'keep_order' must be True or False, got "
                              f"{keep_order!r}.")
        self.axes = axes if keep_order else sorted(axes)
        rest = [a for a in range(2, layout.ndim) if a not in axes]
        # where the merged axis goes: the feature axis if it is merged (it stays the feature), else the first
        target = len([a for a in rest if a < layout.feature_axis]) if layout.feature_axis in axes else \
            len([a for a in rest if a < min(axes)]) if axes else 0
        self.perm = [TIME, BATCH] + rest[:target] + self.axes + rest[target:]
        sizes = [layout.size(a) for a in rest]
        sizes.insert(target, math.prod(layout.size(a) for a in self.axes))
        self.spatial, self.n_out = tuple(sizes[:-1]), sizes[-1]
        if opts.get("n_out") is not None and opts["n_out"] != self.n_out:
            raise ConfigError(f"Network layer '{name}': 'n_out' is {opts['n_out']!r}, but merging the axes "
                              f"{opts.get('axes')!r} of {layout.describe()} gives {self.n_out} features.")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        if len(self.axes) <= 1:
            return x
        merged = tf.concat([tf.shape(x)[:2], list(self.spatial) + [self.n_out]], axis=0)
        return tf.reshape(tf.transpose(x, self.perm), merged)
