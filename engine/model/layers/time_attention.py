"""Attention over the time axis at the top level: ``softmax_over_spatial`` and ``generic_attention``.

2022-swb-conformer-hybrid-sat's speaker branch pools an encoder layer's frames into one vector per sequence
(a speaker classifier's input): energies per frame, ``softmax_over_spatial`` over the sequence's frames,
``generic_attention`` weighting the encoder's frames by them and summing over time. RETURNN's result has no
time axis, (B, H, F) with ``auto_squeeze`` False (H: the weights' features, the heads), else (B, F) for one
head; here it is one frame per sequence, (1, B[, H], F), a value per sequence (``spec_readers.py`` says
which layers read it). Inside rec units these classes are ``rec/step_layers.py``'s.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.axes import Layout
from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError

_TIME_AXES = (None, "T", "t", "time", "dyn:-1")  # RETURNN's names of the one time axis here


class SoftmaxOverTime(Layer):
    """``softmax_over_spatial`` over the time axis: each feature's energies of a sequence's frames
    normalised, frames past its length weighted 0; ``energy_factor`` scales the energies first."""

    def __init__(self, name: str, opts: dict, layout: Layout) -> None:
        super().__init__(layout.feature)
        where = f"Network layer '{name}'"
        if layout.spatial:
            raise ConfigError(f"{where}: softmax_over_spatial at the top level takes (time, features) "
                              f"frames, got {layout.describe()}.")
        if opts.get("axis") not in _TIME_AXES:
            raise ConfigError(f"{where}: softmax_over_spatial over axis {opts['axis']!r} is not implemented "
                              "at the top level (over the time axis, RETURNN's default, it is).")
        if opts.get("use_time_mask", True) is not True:
            raise ConfigError(f"{where}: use_time_mask {opts['use_time_mask']!r} would weight the padding "
                              "frames too; not implemented.")
        self.factor = opts.get("energy_factor")
        if self.factor is not None and (isinstance(self.factor, bool)
                                        or not isinstance(self.factor, (int, float))):
            raise ConfigError(f"{where}: energy_factor must be a number, got {self.factor!r}.")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        valid = tf.transpose(tf.sequence_mask(lengths, tf.shape(x)[0]))[:, :, None]  # (T, B, 1)
        energies = x * float(self.factor) if self.factor else x
        weights = tf.nn.softmax(tf.where(valid, energies, tf.cast(float("-inf"), x.dtype)), axis=0)
        return tf.where(valid, weights, tf.zeros_like(weights))  # a sequence without frames: none


class AttentionPooling(Layer):
    """``generic_attention`` with ``weights`` (frames, H features) and ``base`` (frames, F features) on one
    time axis: per sequence and head the sum over time of weight times base frame, (1, B, H, F); with
    ``auto_squeeze`` (RETURNN's default) one head leaves (1, B, F)."""

    separate_sources = True  # [weights, base]

    def __init__(self, name: str, opts: dict, weights: Layout, base: Layout) -> None:
        super().__init__(base.feature)
        if weights.spatial or base.spatial:
            raise ConfigError(f"Network layer '{name}': generic_attention at the top level takes weights and "
                              f"base of (time, features), got weights {weights.describe()}, base "
                              f"{base.describe()}.")
        squeeze = opts.get("auto_squeeze", True)
        if not isinstance(squeeze, bool):
            raise ConfigError(f"Network layer '{name}': auto_squeeze must be True or False, got {squeeze!r}.")
        self.heads = weights.feature
        self.spatial = () if squeeze and self.heads == 1 else (self.heads,)

    def __call__(self, xs: list[tf.Tensor], lengths: tf.Tensor, training: bool) -> tf.Tensor:
        weights, base = xs  # (T, B, H), (T, B, F): the weights are 0 past each sequence's frames
        pooled = tf.einsum("tbh,tbf->bhf", weights, base)[None]  # (1, B, H, F)
        return pooled if self.spatial else pooled[:, :, 0]

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return tf.ones_like(lengths)
