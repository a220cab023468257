"""The ``ctc`` loss of a ``softmax`` layer, with RETURNN's ``loss_opts`` (its ``CtcLoss``).

The layer has one class more than its target: the blank, the last index (as TF's CTC ops want it). The
loss of a sequence is -log p(target | frames), summed over all alignments (TF's ``CTCLoss`` op, which
RETURNN calls). As in RETURNN, scores are normalised by the batch's target labels, not its frames:
score = sum of -log p / sum of target lengths, and the label error = summed edit distance of the
decoded labels to the targets / sum of target lengths. ``CtcLoss.sums`` returns the three sums, so ranks
can add them before dividing.

An empty target scores -log p(blank in every frame) (TF's op, and so RETURNN, refuses it).
A sequence is unalignable when it has fewer frames than its labels need (a label repeated at once needs
a blank between the two). TF's op then fails or returns inf; here it is a ``DataError`` naming the
sequences, or with ``ctc_opts`` ``ignore_longer_outputs_than_inputs`` such sequences add 0 to the loss
(their label error and target labels still count).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from engine.model.losses import REFUSED_LOSS_OPTS, check_loss_opts
from engine.model.losses.cross_entropy import loss_options, loss_scale, normalized_loss
from engine.model.losses.data_checks import require
from engine.model.losses.decoding import beam_labels, collapse_repeated, edit_distances, greedy_labels, \
    sparse_labels
from engine.runtime.errors import ConfigError

CTC_OPTIONS = ("scale", "beam_width", "ctc_opts", "target_collapse_repeated", "auto_clip_target_len",
               "output_in_log_space", "use_native", "use_viterbi", "use_flatten_frames",
               "use_normalized_loss")
CTC_OPTS_KEYS = ("preprocess_collapse_repeated", "ctc_merge_repeated", "ignore_longer_outputs_than_inputs")


def _flag(layer: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"Network layer '{layer}': loss_opts {key} must be True or False, got {value!r}.")
    return value


@dataclass(frozen=True)
class CtcLoss:
    scale: float = 1.0
    beam_width: int = 100
    target_collapse_repeated: bool = False
    auto_clip_target_len: bool = False
    preprocess_collapse_repeated: bool = False
    ctc_merge_repeated: bool = True
    ignore_longer_outputs_than_inputs: bool = False
    normalized: bool = False  # use_normalized_loss

    @classmethod
    def from_layer_options(cls, layer: str, opts: dict) -> "CtcLoss":
        """From ``loss_scale`` and ``loss_opts`` of the layer's options."""
        loss_opts = loss_options(layer, opts, "ctc", None)  # unknown keys: below, after the refused ones
        check_loss_opts(f"Network layer '{layer}'", "ctc", loss_opts)
        refused = tuple(REFUSED_LOSS_OPTS["ctc"])
        unknown = sorted(set(loss_opts) - set(CTC_OPTIONS) - set(refused))
        if unknown:
            raise ConfigError(f"Network layer '{layer}': loss_opts {unknown} are not options of RETURNN's "
                              f"'ctc' loss; it takes {', '.join(CTC_OPTIONS + refused)}.")
        # no effect on a sequence loss (RETURNN flattens frames only for frame-wise losses)
        _flag(layer, "use_flatten_frames", loss_opts.get("use_flatten_frames", True))
        # RETURNN's native CTC op: the same loss and gradient as TF's (bench_returnn_parity's ctc_native);
        # check_loss_opts has refused what its op does not take
        _flag(layer, "use_native", loss_opts.get("use_native", False))
        scale = loss_scale(layer, opts, loss_opts)
        beam = loss_opts.get("beam_width", 100)
        if isinstance(beam, bool) or not isinstance(beam, int) or beam < 0:
            raise ConfigError(f"Network layer '{layer}': loss_opts beam_width must be an int >= 0, "
                              f"got {beam!r}.")
        ctc_opts = loss_opts.get("ctc_opts") or {}
        if not isinstance(ctc_opts, dict):
            raise ConfigError(f"Network layer '{layer}': loss_opts ctc_opts must be a dict, "
                              f"got {ctc_opts!r}.")
        unknown = sorted(set(ctc_opts) - set(CTC_OPTS_KEYS))
        if unknown:
            raise ConfigError(f"Network layer '{layer}': loss_opts ctc_opts {unknown} are not supported; "
                              "RETURNN passes ctc_opts to TF's ctc_loss, which takes "
                              f"{', '.join(CTC_OPTS_KEYS)} (RETURNN sets its inputs, lengths and "
                              "time_major itself).")
        return cls(scale, beam,
                   _flag(layer, "target_collapse_repeated", loss_opts.get("target_collapse_repeated", False)),
                   _flag(layer, "auto_clip_target_len", loss_opts.get("auto_clip_target_len", False)),
                   *(_flag(layer, f"ctc_opts {key}", ctc_opts.get(key, default))
                     for key, default in zip(CTC_OPTS_KEYS, (False, True, False))),
                   normalized_loss(layer, loss_opts))

    def sums(self, logits: tf.Tensor, lengths: tf.Tensor, targets: tf.Tensor, target_lengths: tf.Tensor, *,
             layer: str, target: str, training: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(loss sum (unscaled), edit-distance sum, target-label count) of one batch.

        ``logits`` (B, T, V + 1), ``lengths`` (B,) its frames, ``targets`` (B, L) ids < V with
        ``target_lengths`` (B,). The label error decodes greedily in training and, with ``beam_width``
        > 1, by beam search otherwise (as RETURNN)."""
        lengths = tf.cast(lengths, tf.int32)
        target_lengths = tf.cast(target_lengths, tf.int32)
        targets = tf.cast(targets, tf.int32)
        blank = logits.shape[-1] - 1
        valid = tf.sequence_mask(target_lengths, tf.shape(targets)[1])
        bad_id = valid & ((targets < 0) | (targets >= blank))
        targets = require(tf.logical_not(tf.reduce_any(bad_id)), [
            f"Network layer '{layer}' (ctc loss): target {target!r} holds ids outside [0, {blank}) (its dim "
            f"is {blank}; the layer's last class {blank} is the blank); batch positions:",
            tf.where(tf.reduce_any(bad_id, axis=1))[:, 0], "ids:", tf.boolean_mask(targets, bad_id)], targets)
        labels, label_lengths = targets, target_lengths
        if self.auto_clip_target_len:  # as RETURNN: at most one label fewer than frames
            label_lengths = tf.minimum(label_lengths, tf.maximum(lengths - 1, 0))
        if self.target_collapse_repeated:
            labels, label_lengths = collapse_repeated(labels, label_lengths)
        loss_labels, loss_lengths = labels, label_lengths
        if self.preprocess_collapse_repeated:  # only what the loss sees; the label error keeps the repeats
            loss_labels, loss_lengths = collapse_repeated(labels, label_lengths)
        needed = loss_lengths
        if self.ctc_merge_repeated:
            mask = tf.sequence_mask(loss_lengths, tf.shape(loss_labels)[1])
            repeats = mask[:, 1:] & (loss_labels[:, 1:] == loss_labels[:, :-1])
            needed += tf.reduce_sum(tf.cast(repeats, tf.int32), axis=1)
        unalignable = needed > lengths
        if not self.ignore_longer_outputs_than_inputs:
            lengths = require(tf.logical_not(tf.reduce_any(unalignable)), [
                f"Network layer '{layer}' (ctc loss, target {target!r}): sequences with fewer frames than "
                "their labels need (a label repeated at once needs a blank between) cannot be aligned. "
                "Count:", tf.reduce_sum(tf.cast(unalignable, tf.int32)), "batch positions:",
                tf.where(unalignable)[:, 0], "frames:", tf.boolean_mask(lengths, unalignable),
                "labels needing frames:", tf.boolean_mask(needed, unalignable),
                "(shorten the targets, subsample less, or set loss_opts ctc_opts "
                "ignore_longer_outputs_than_inputs=True to give them loss 0)."], lengths)
        # TF's op refuses empty targets and has no finite value for unalignable ones: both get one dummy
        # label in the op (finite, so no inf or NaN reaches the gradient) and their own value here
        empty = tf.equal(loss_lengths, 0)
        dummy = unalignable | empty
        padded = tf.pad(loss_labels, [[0, 0], [0, 1]])
        per_seq = tf.compat.v1.nn.ctc_loss(
            sparse_labels(tf.where(dummy[:, None], tf.zeros_like(padded), padded),
                          tf.where(dummy, 1, loss_lengths)),
            logits, lengths, time_major=False, ctc_merge_repeated=self.ctc_merge_repeated,
            ignore_longer_outputs_than_inputs=True)  # a dummy label longer than its frames: 0
        frames = tf.sequence_mask(lengths, tf.shape(logits)[1])
        log_blank = tf.nn.log_softmax(logits)[:, :, blank]
        all_blank = -tf.reduce_sum(tf.where(frames, log_blank, tf.zeros_like(log_blank)), axis=1)
        per_seq = tf.where(unalignable, tf.zeros_like(per_seq), tf.where(empty, all_blank, per_seq))
        loss = tf.reduce_sum(per_seq)
        if training or self.beam_width <= 1:
            hyp, hyp_lengths = greedy_labels(logits, lengths, blank)
        else:
            hyp, hyp_lengths = beam_labels(logits, lengths, self.beam_width)
        errors = tf.reduce_sum(edit_distances(hyp, hyp_lengths, labels, label_lengths))
        return loss, errors, tf.cast(tf.reduce_sum(target_lengths), tf.float32)
