"""RETURNN's ``reduce`` over static spatial axes of a (T, B, *spatial, F) output.

The ResNet/LACE hybrids of RETURNN's setups average the frequency axis that their 2-D convolutions leave
(``{"class": "reduce", "mode": "avg", "axes": "s:1"}``) before the output layer. The time and batch axes
are not reduced here (a layer's output keeps its frames and sequences), nor the feature axis (RETURNN then
makes the last remaining axis the feature, which this layout cannot follow): both refused with the reason.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.axes import BATCH, TIME, Layout, resolve_axes
from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError

REDUCE_OPS = {"sum": tf.reduce_sum, "max": tf.reduce_max, "min": tf.reduce_min, "mean": tf.reduce_mean,
              "avg": tf.reduce_mean, "logsumexp": tf.reduce_logsumexp}


class Reduce(Layer):
    """``reduce``: ``mode`` (sum, max, min, mean/avg, logsumexp), ``axes`` (or ``axis``: static spatial
    axes, e.g. ``"s:1"``), ``keep_dims`` [False]. ``use_time_mask`` and ``enforce_batch_dim_axis`` are
    taken: on static axes no mask applies, and the batch's position is a layout, not a value."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(layout.feature)
        mode = str(opts.get("mode", "")).lower()
        if mode not in REDUCE_OPS:
            raise ConfigError(f"Network layer '{name}': 'mode' {opts.get('mode')!r} is not taken here; "
                              f"modes: {', '.join(sorted(REDUCE_OPS))} (argmin/argmax give class ids, not "
                              "implemented).")
        if "axes" in opts and "axis" in opts:
            raise ConfigError(f"Network layer '{name}': give 'axes' or 'axis', not both (as RETURNN).")
        keep_dims = opts.get("keep_dims", False)
        if not isinstance(keep_dims, bool):
            raise ConfigError(f"Network layer '{name}': 'keep_dims' must be True or False, got "
                              f"{keep_dims!r}.")
        axes = resolve_axes(layout, opts.get("axes", opts.get("axis")), layer=name, option="'axes'")
        if TIME in axes or BATCH in axes or layout.feature_axis in axes or not axes:
            raise ConfigError(f"Network layer '{name}': 'axes' {opts.get('axes', opts.get('axis'))!r} of its "
                              f"input {layout.describe()} must be static spatial axes (such as 's:1'); "
                              "this engine keeps every layer's frames and sequences, and RETURNN gives a "
                              "reduced feature axis's role to another axis, which this layout cannot follow.")
        self.reduce, self.axes, self.keep_dims = REDUCE_OPS[mode], sorted(axes), keep_dims
        self.spatial = tuple(1 if keep_dims and axis in axes else layout.size(axis)
                             for axis in range(2, layout.feature_axis) if keep_dims or axis not in axes)
        self.n_out = layout.feature

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return self.reduce(x, axis=self.axes, keepdims=self.keep_dims)
