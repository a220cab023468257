"""RETURNN's ``reduce`` over static spatial axes of a (T, B, *spatial, F) output, or over time to one frame.

The ResNet/LACE hybrids of RETURNN's setups average the frequency axis that their 2-D convolutions leave
(``{"class": "reduce", "mode": "avg", "axes": "s:1"}``) before the output layer. The speaker-adaptive
Conformer hybrids (2022-swb-conformer-hybrid-sat) average an utterance's i-vectors over time with
``keep_dims`` (``{"axis": "T", "keep_dims": True}``): the output keeps a time axis of one frame (RETURNN: a
static axis of size 1), over each sequence's valid frames as RETURNN masks them; a ``dot`` combines it
with the frames of another layer. Without ``keep_dims`` (2021-internal-lm-attention's ``encoder_mean``)
RETURNN's output is one vector per sequence: the same frame here, read only by rec units (``base:``),
as the same vector at every step. The batch axis is not reduced, nor the feature axis (RETURNN then makes
the last remaining axis the feature, which this layout cannot follow): refused with the reason.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.axes import BATCH, TIME, Layout, resolve_axes
from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError

REDUCE_OPS = {"sum": tf.reduce_sum, "max": tf.reduce_max, "min": tf.reduce_min, "mean": tf.reduce_mean,
              "avg": tf.reduce_mean, "logsumexp": tf.reduce_logsumexp}
# over time, on the valid frames only (the padding filled with what leaves the result unchanged; avg and
# mean divide the sum by the length)
MASKED = {"sum": tf.reduce_sum, "avg": tf.reduce_sum, "mean": tf.reduce_sum, "max": tf.reduce_max,
          "min": tf.reduce_min}


class Reduce(Layer):
    """``reduce``: ``mode`` (sum, max, min, mean/avg, logsumexp), ``axes`` (or ``axis``: static spatial
    axes, e.g. ``"s:1"``, or ``"T"`` with ``keep_dims`` True), ``keep_dims`` [False]. ``use_time_mask``
    and ``enforce_batch_dim_axis`` are taken: on static axes no mask applies, over time RETURNN's default
    (the mask) is what is computed, and the batch's position is a layout, not a value."""

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
        self.over_time = axes == [TIME]
        # without keep_dims RETURNN gives (B, F): kept here as its one frame, a vector per sequence
        # (spec_readers.py says which layers read it)
        if self.over_time:
            if mode not in MASKED:
                raise ConfigError(f"Network layer '{name}': mode {mode!r} over time is not implemented; over "
                                  f"time: {', '.join(MASKED)}.")
            if opts.get("use_time_mask") is False:
                raise ConfigError(f"Network layer '{name}': use_time_mask False over time would reduce the "
                                  "padding frames too (RETURNN reads them then); not implemented.")
            self.mode, self.n_out = mode, layout.feature
            return
        if TIME in axes or BATCH in axes or layout.feature_axis in axes or not axes:
            raise ConfigError(f"Network layer '{name}': 'axes' {opts.get('axes', opts.get('axis'))!r} of its "
                              f"input {layout.describe()} must be static spatial axes (such as 's:1'); "
                              "this engine keeps every layer's frames and sequences (time alone with "
                              "keep_dims True makes one frame), and RETURNN gives a reduced feature axis's "
                              "role to another axis, which this layout cannot follow.")
        self.reduce, self.axes, self.keep_dims = REDUCE_OPS[mode], sorted(axes), keep_dims
        self.spatial = tuple(1 if keep_dims and axis in axes else layout.size(axis)
                             for axis in range(2, layout.feature_axis) if keep_dims or axis not in axes)
        self.n_out = layout.feature

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return tf.ones_like(lengths) if self.over_time else lengths

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        if not self.over_time:
            return self.reduce(x, axis=self.axes, keepdims=self.keep_dims)
        valid = tf.transpose(tf.sequence_mask(lengths, tf.shape(x)[0]))  # (T, B)
        valid = tf.reshape(valid, tf.concat([tf.shape(valid), tf.ones([x.shape.rank - 2], tf.int32)], 0))
        fill = {"max": x.dtype.min, "min": x.dtype.max}.get(self.mode, 0.0)
        total = MASKED[self.mode](tf.where(valid, x, tf.cast(fill, x.dtype)), axis=0, keepdims=True)
        if self.mode in ("avg", "mean"):
            counts = tf.cast(tf.maximum(lengths, 1), x.dtype)
            total /= tf.reshape(counts, [1, -1] + [1] * (x.shape.rank - 2))
        return total
