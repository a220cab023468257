"""The losses of a ``network`` dict's model (``NetworkModel``): each loss layer's sums as RETURNN's
``LossHolder`` gives them, and the objective RETURNN minimises from them with its constraints (L2, darc1).
"""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from engine.model.base import LossResult, masked_ce_sums, packed_ce_sums
from engine.model.layers.base import scope_name
from engine.model.losses.regularization import darc1_term, l2_term
from engine.model.rec.decide import Decide
from engine.runtime.errors import ConfigError, DataError

# ``model``: a NetworkModel (engine/model/network.py, which calls these): its loss_layers, loss_objects,
# registered (the streams it computes), owners(), l2 and darc1


def layer_loss_sums(model: Any, model_outputs: dict[str, tf.Tensor], targets: dict[str, tf.Tensor],
                    target_lengths: dict[str, tf.Tensor], training: bool = False,
                    layers: Sequence[str] | None = None) -> dict[str, tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """Per loss layer (in training without the ``only_on_eval`` ones; ``layers``: only these): its loss sum
    (unscaled), its error sum and its count, as RETURNN's ``LossHolder`` gives them; a rec unit's as
    ``<rec>/<layer>``."""
    targets, target_lengths = dict(targets), dict(target_lengths)
    for stream, layer_name in model.registered.items():  # register_as_extern_data: (B, T) and (B,)
        targets[stream] = model_outputs[layer_name]
        target_lengths[stream] = model_outputs[f"{layer_name}:lengths"]
    sums = {}
    for name in model.loss_layers if layers is None else layers:
        layer = model.loss_objects[name]
        if training and layer.only_on_eval:
            continue
        if layer.target not in targets or layer.target not in target_lengths:
            raise DataError(
                f"Network layer '{name}' needs target {layer.target!r}, but the batch has only "
                f"{sorted(targets)}."
            )
        with tf.name_scope(f"{scope_name(name)}/loss/"):  # in the layer's scope: profiles name them so
            sums[name] = _layer_sums(name, layer, model_outputs, targets[layer.target],
                                     target_lengths[layer.target], training)
    return sums


def _layer_sums(name: str, layer: Any, model_outputs: dict[str, tf.Tensor], target: tf.Tensor,
                target_length: tf.Tensor, training: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    output, lengths = model_outputs[name], model_outputs[f"{name}:lengths"]
    if isinstance(layer, Decide):
        return layer.sums(output, lengths, target, target_length)
    if layer.loss == "edit_distance":
        return layer.criterion.sums(output, lengths, target, target_length, layer=name, target=layer.target)
    if layer.loss == "ctc":
        return layer.criterion.sums(model_outputs[f"{name}:logits"], lengths, target, target_length,
                                    layer=name, target=layer.target, training=training)
    if f"{name}:logits_input" in model_outputs:  # a softmax layer: logits of the scored frames only
        return packed_ce_sums(model_outputs[f"{name}:logits_input"], _projection(layer), target,
                              target_length, where=name, criterion=layer.criterion)
    return masked_ce_sums(model_outputs[f"{name}:logits"], target, target_length, where=name,
                          criterion=layer.criterion)


def _projection(layer: Any):
    """A softmax layer's logits of frames given as rows (its call maps the features of each position)."""
    return lambda rows: tf.cast(layer(rows, None, False), tf.float32)  # tf_amp: float32 logits


def network_losses(model: Any, model_outputs: dict[str, tf.Tensor], targets: dict[str, tf.Tensor],
                   target_lengths: dict[str, tf.Tensor], training: bool = False) -> LossResult:
    """The reported loss (the first loss layer's, unscaled), the main layer's error and count, RETURNN's
    objective (each loss times its scale) and the constraints."""
    if not model.loss_layers:
        raise ConfigError(
            "The network has no layer with a loss (a 'softmax' layer with 'loss': 'ce' or 'ctc'), "
            "so it cannot be trained or scored."
        )
    loss = error = frames = None
    terms = []
    sums = model.layer_loss_sums(model_outputs, targets, target_lengths, training)
    for name, (value, err, n) in sums.items():
        layer = model.loss_objects[name]
        if error is None:  # the main loss layer: its error and count are reported
            error, frames = err, n
        if layer.loss == "edit_distance":
            continue  # statistics only: no loss value (RETURNN's EditDistanceLoss has none)
        if loss is None:  # the first loss value is reported unscaled, as RETURNN's score_<layer>
            loss = value
        # RETURNN's objective: each loss summed over the batch, times its scale, and divided by its
        # count only with use_normalized_loss (LossHolder in returnn/tf/network.py)
        term = layer.criterion.scale * value
        terms.append(term / tf.maximum(n, 1.0) if layer.criterion.normalized else term)
    owners = model.owners()  # RETURNN adds no reused parameter to the reusing layer's (nor to its L2)
    regularized = [l2_term(factor, owners[name].params.values()) for name, factor in model.l2.items()
                   if factor and name in owners and owners[name].params]
    regularized += [l2_term(factor, [layer.params[key]]) for layer in owners.values()
                    for key, factor in layer.inner_l2.items()]
    darc1 = [darc1_term(factor, model_outputs[f"{name}:logits"], model_outputs[f"{name}:lengths"])
             for name, factor in model.darc1.items() if factor]
    zero = tf.constant(0.0)
    return LossResult(loss=zero if loss is None else loss, error=error, num_frames=frames,
                      objective=tf.add_n(terms) if terms else zero,
                      regularizer=tf.add_n(regularized) if regularized else 0.0,
                      data_regularizer=tf.add_n(darc1) if darc1 else 0.0)
