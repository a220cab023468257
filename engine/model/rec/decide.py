"""RETURNN's ``decide`` layer: the best hypothesis of a searched rec layer (by its score, divided by its
length with ``length_normalization``; the rec layer's search decides with this layer's option). Without
search (training and scoring) its source holds one sequence per batch entry (the target), which it passes
on. Its ``edit_distance`` loss counts the edit distance of that sequence to the target, label by label,
divided by the target's labels (RETURNN's EditDistanceLoss on class ids: statistics only, no gradient)."""
from __future__ import annotations

import tensorflow as tf

from engine.model.layers.base import Layer
from engine.model.losses import check_loss_name
from engine.model.losses.cross_entropy import loss_options
from engine.model.losses.decoding import edit_distance_sum
from engine.runtime.errors import ConfigError


class Decide(Layer):
    def __init__(self, name: str, opts: dict, n_out: int, target_dims: dict[str, int]) -> None:
        super().__init__(n_out)
        self.layer_name = name
        self.loss = opts.get("loss")
        self.target = opts.get("target", "classes")
        self.only_on_eval = opts.get("only_on_eval", False)
        self.criterion = None
        check_loss_name(f"Network layer '{name}'", "decide", self.loss)
        if self.loss:
            loss_options(name, opts, "edit_distance", ("debug_print",))
            if self.target not in target_dims:
                raise ConfigError(f"Network layer '{name}': loss target {self.target!r} is not a data "
                                  "stream; "
                                  f"known targets: {sorted(target_dims)}.")
        self.length_normalization = opts.get("length_normalization", False)  # RETURNN's default
        if not isinstance(self.length_normalization, bool):
            raise ConfigError(f"Network layer '{name}': length_normalization must be True or False.")

    def sums(self, ids: tf.Tensor, lengths: tf.Tensor, targets: tf.Tensor,
             target_lengths: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(0, edit-distance sum, target labels): ``ids`` (B, L) batch-major."""
        errors = edit_distance_sum(tf.cast(ids, tf.int32), lengths, tf.cast(targets, tf.int32),
                                   target_lengths)
        return tf.constant(0.0), errors, tf.cast(tf.reduce_sum(target_lengths), tf.float32)
