"""The ``edit_distance`` loss (RETURNN's ``EditDistanceLoss``): statistics only, not differentiable.

On a layer whose output is CTC label probabilities (the target's dim + 1, the blank last), e.g. a
``copy`` of a ctc ``softmax`` layer, with ``loss_opts`` ``ctc_decode`` True: the output is decoded by
TF's CTC beam search (width 100, as RETURNN), ``label_map`` is applied to the decoded labels and the
target, and the error is the summed edit distance; RETURNN divides it by the summed target lengths.
The loss adds nothing to the objective or the score.
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from engine.model.losses.cross_entropy import _number, loss_options
from engine.model.losses.data_checks import require
from engine.model.losses.decoding import beam_labels, edit_distances
from engine.runtime.errors import ConfigError

EDIT_DISTANCE_OPTIONS = ("ctc_decode", "label_map", "output_in_log_space", "debug_print", "scale",
                         "use_flatten_frames")
BEAM_WIDTH = 100  # RETURNN decodes with tf.nn.ctc_beam_search_decoder's default width


@dataclass(frozen=True)
class EditDistance:
    label_map: tuple[tuple[int, int], ...] = ()
    output_in_log_space: bool = False
    debug_print: bool = False
    scale: float = 1.0

    @classmethod
    def from_layer_options(cls, layer: str, opts: dict) -> "EditDistance":
        loss_opts = loss_options(layer, opts, "edit_distance", EDIT_DISTANCE_OPTIONS)
        if loss_opts.get("ctc_decode") is not True:
            raise ConfigError(f"Network layer '{layer}': the 'edit_distance' loss needs loss_opts ctc_decode "
                              "True here: without it RETURNN expects a layer whose output is sparse label "
                              "ids, and this engine's layers output dense values.")
        flags = {}
        for key in ("output_in_log_space", "debug_print", "use_flatten_frames"):
            flags[key] = loss_opts.get(key, key == "use_flatten_frames")
            if not isinstance(flags[key], bool):
                raise ConfigError(f"Network layer '{layer}': loss_opts {key} must be True or False.")
        label_map = loss_opts.get("label_map") or {}
        ids = [i for pair in label_map.items() for i in pair] if isinstance(label_map, dict) else [None]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ConfigError(f"Network layer '{layer}': loss_opts label_map must be a dict of label id -> "
                              f"label id (ints >= 0), got {label_map!r}.")
        scale = _number(layer, "loss_opts scale", loss_opts.get("scale", opts.get("loss_scale", 1.0)),
                        float("-inf"))
        return cls(tuple(sorted(label_map.items())), flags["output_in_log_space"], flags["debug_print"],
                   scale)

    def sums(self, output: tf.Tensor, lengths: tf.Tensor, targets: tf.Tensor, target_lengths: tf.Tensor, *,
             layer: str, target: str) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(0, edit-distance sum, target-label count): ``output`` (B, T, V + 1) probabilities (or
        log-probabilities with ``output_in_log_space``), ``targets`` (B, L) ids < V."""
        blank = output.shape[-1] - 1
        targets = tf.cast(targets, tf.int32)
        valid = tf.sequence_mask(target_lengths, tf.shape(targets)[1])
        bad_id = valid & ((targets < 0) | (targets >= blank))
        targets = require(tf.logical_not(tf.reduce_any(bad_id)), [
            f"Network layer '{layer}' (edit_distance loss): target {target!r} holds ids outside "
            f"[0, {blank}); batch positions:", tf.where(tf.reduce_any(bad_id, axis=1))[:, 0],
            "ids:", tf.boolean_mask(targets, bad_id)], targets)
        logits = output if self.output_in_log_space else tf.math.log(tf.maximum(output, 1e-30))
        hyp, hyp_lengths = beam_labels(logits, lengths, BEAM_WIDTH)
        hyp, ref = self._map(hyp), self._map(targets)
        if self.debug_print:
            tf.print(f"layer '{layer}' first sequence: output", hyp[0, :hyp_lengths[0]], "target",
                     ref[0, :target_lengths[0]], summarize=-1)
        errors = tf.reduce_sum(edit_distances(hyp, hyp_lengths, ref, target_lengths))
        return tf.constant(0.0), errors, tf.cast(tf.reduce_sum(target_lengths), tf.float32)

    def _map(self, labels: tf.Tensor) -> tf.Tensor:
        mapped = labels
        for old, new in self.label_map:  # each entry looks at the original ids: a map, not a chain
            mapped = tf.where(tf.equal(labels, old), new, mapped)
        return mapped
