"""Values per sequence rather than per frame: RETURNN's ``length``, a ``compare`` of such values, and a
``squeeze`` of a one-frame stream's time axis (a label per sequence).

2019-e2e-speech-to-text-comparison's multi-input decoders switch between their audio and text attention
by whether the sequence has audio: ``{"class": "length", "from": "data"}`` gives each sequence's number of
frames (RETURNN: (B,) int32), a ``compare`` of it with a ``value`` a flag per sequence ((B,) bool), which
the decoder's unit reads as ``base:`` (a ``switch``'s ``condition``). Here such a value is kept as one
frame: a length (1, B, 1), read only by ``compare``; a flag (1, B), read only by rec units; a label
(1, B), read only as a loss's target (``spec_readers.py`` refuses other readers).
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.layers.base import Layer
from engine.model.losses.data_checks import require
from engine.runtime.errors import ConfigError

COMPARE_KINDS = {"equal": tf.equal, "not_equal": tf.not_equal, "less": tf.less, "less_equal": tf.less_equal,
                 "greater": tf.greater, "greater_equal": tf.greater_equal}


class Length(Layer):
    """``length``: each sequence's number of frames (``axis`` "T", RETURNN's default; ``dtype`` int32)."""

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        where = f"Network layer '{name}'"
        if str(opts.get("axis", "T")).upper() not in ("T", "TIME"):
            raise ConfigError(f"{where}: length over axis {opts['axis']!r} is not implemented (the time "
                              "axis 'T' is).")
        for key, default in (("add_time_axis", False), ("sparse", False), ("dtype", "int32")):
            if opts.get(key, default) != default:
                raise ConfigError(f"{where}: length with {key} {opts[key]!r} is not implemented (only "
                                  f"{default!r}, RETURNN's default).")
        self.n_out = 1

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return tf.cast(lengths, tf.int32)[None, :, None]

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return tf.ones_like(lengths)


class SequenceCompare(Layer):
    """``compare`` of a value per sequence (a ``length``) with ``value`` by ``kind``: a flag per sequence."""

    value_dtype = tf.bool

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        kind = opts.get("kind", "equal")
        if kind not in COMPARE_KINDS:
            raise ConfigError(f"Network layer '{name}': compare kind {kind!r} is not one of "
                              f"{', '.join(COMPARE_KINDS)}.")
        value = opts.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or in_dim != 1:
            raise ConfigError(f"Network layer '{name}': compare at the top level is implemented with one "
                              f"source and a number 'value', got value {value!r} and {in_dim} features.")
        self.compare, self.value, self.n_out = COMPARE_KINDS[kind], float(value), 1

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        return self.compare(tf.cast(x[..., 0], tf.float32), self.value)

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return tf.ones_like(lengths)


class SqueezeTime(Layer):
    """``squeeze`` of the time axis of a stream of class ids with one frame per sequence (2022-swb-conformer-
    hybrid-sat's speaker label, a target per sequence): RETURNN's (B,) ids, here that one frame (1, B).
    Another number of frames ends the step with a DataError (RETURNN's squeeze fails on it too)."""

    sparse_input = True
    ids_output = True

    def __init__(self, name: str, opts: dict, in_dim: int, source_is_ids: bool) -> None:
        super().__init__(in_dim)
        self.name_ = name
        if str(opts.get("axis")).upper() not in ("T", "TIME") or not source_is_ids:
            raise ConfigError(f"Network layer '{name}': squeeze at the top level is implemented over the "
                              "time axis ('axis': 'T') of a stream of class ids with one frame per sequence "
                              f"(a label per sequence), got axis {opts.get('axis')!r}"
                              f"{'' if source_is_ids else ' of features'}.")
        if opts.get("enforce_batch_dim_axis", 0) != 0 or opts.get("allow_no_op", False):
            raise ConfigError(f"Network layer '{name}': squeeze takes enforce_batch_dim_axis 0 and "
                              "allow_no_op False only (a label per sequence must have its one frame).")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        one = tf.reduce_all(tf.equal(lengths, 1))
        return require(one, [f"Network layer '{self.name_}': squeeze of the time axis needs one frame per "
                             "sequence; the batch's sequences have", lengths, "frames."], x[:1])

    def out_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        return tf.ones_like(lengths)
