"""The ``ce`` loss of a ``softmax`` layer with RETURNN's ``loss_opts``.

Per frame with target y, probabilities p = softmax(logits) and V classes (as RETURNN computes them):
- plain: -log p_y;
- ``label_smoothing`` s: cross-entropy against the soft target (1 - s on y, s / (V - 1) elsewhere),
  minus that target's own entropy (so a perfect fit scores 0);
- ``focal_loss_factor`` g: the above times (1 - p_y)^g (gradients flow through that factor too);
- ``scale`` (or the layer's ``loss_scale``): multiplies the loss in the objective (not the reported score,
  as in RETURNN);
- ``use_normalized_loss``: the objective takes this loss divided by the batch's target frames instead of
  its sum (RETURNN's default is the sum: ``engine/model/network.py``).
``use_fused`` picks between two formulations of the same value in RETURNN; here it changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from engine.runtime.errors import ConfigError

CE_OPTIONS = ("scale", "focal_loss_factor", "label_smoothing", "use_fused", "use_normalized_loss")


def _number(layer: str, key: str, value: Any, low: float, high: float | None = None) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= low and (
        high is None or value < high)
    if not ok:
        bound = f"in [{low:g}, {high:g})" if high is not None else f">= {low:g}"
        raise ConfigError(f"Network layer '{layer}': {key} must be a number {bound}, got {value!r}.")
    return float(value)


def loss_options(layer: str, opts: dict, loss: str, supported: tuple[str, ...] | None) -> dict:
    """The layer's ``loss_opts`` dict (empty when unset); with ``supported``, other keys are refused."""
    loss_opts = opts.get("loss_opts") or {}
    if not isinstance(loss_opts, dict):
        raise ConfigError(f"Network layer '{layer}': loss_opts must be a dict, got {loss_opts!r}.")
    unknown = sorted(set(loss_opts) - set(supported)) if supported is not None else []
    if unknown:
        raise ConfigError(f"Network layer '{layer}': loss_opts {unknown} are not supported for the '{loss}' "
                          f"loss; supported: {', '.join(supported)}.")
    return loss_opts


def loss_scale(layer: str, opts: dict, loss_opts: dict) -> float:
    """A loss layer's ``loss_scale``, or RETURNN's other spelling ``loss_opts`` ``scale`` (not both)."""
    scale = _number(layer, "loss_scale", opts.get("loss_scale", 1.0), float("-inf"))
    if "scale" in loss_opts:
        given = _number(layer, "loss_opts scale", loss_opts["scale"], float("-inf"))
        if "loss_scale" in opts and given != scale:
            raise ConfigError(f"Network layer '{layer}': loss_scale {scale:g} and loss_opts scale "
                              f"{given:g} disagree; give one of them.")
        scale = given
    return scale


def normalized_loss(layer: str, loss_opts: dict) -> bool:
    """``loss_opts`` ``use_normalized_loss``: RETURNN's objective divides this loss by its count."""
    value = loss_opts.get("use_normalized_loss", False)
    if not isinstance(value, bool):
        raise ConfigError(f"Network layer '{layer}': loss_opts use_normalized_loss must be True or False, "
                          f"got {value!r}.")
    return value


@dataclass(frozen=True)
class CrossEntropy:
    scale: float = 1.0
    focal_loss_factor: float = 0.0
    label_smoothing: float = 0.0
    normalized: bool = False  # use_normalized_loss

    @classmethod
    def from_layer_options(cls, layer: str, opts: dict, num_classes: int) -> "CrossEntropy":
        """From ``loss_scale`` and ``loss_opts`` of the layer's options."""
        loss_opts = loss_options(layer, opts, "ce", CE_OPTIONS)
        if not isinstance(loss_opts.get("use_fused", True), bool):
            raise ConfigError(f"Network layer '{layer}': loss_opts use_fused must be True or False.")
        scale = loss_scale(layer, opts, loss_opts)
        smoothing = _number(layer, "loss_opts label_smoothing", loss_opts.get("label_smoothing", 0.0),
                            0.0, 1.0)
        if smoothing and num_classes < 2:
            raise ConfigError(f"Network layer '{layer}': label_smoothing needs at least 2 classes.")
        focal = _number(layer, "loss_opts focal_loss_factor", loss_opts.get("focal_loss_factor", 0.0), 0.0)
        return cls(scale, focal, smoothing, normalized_loss(layer, loss_opts))

    def frame_losses(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Unscaled loss per frame: ``logits`` (..., V), ``labels`` (...) valid class ids."""
        target_loss = sparse_cross_entropy(logits, labels)  # -log p_y
        if self.label_smoothing:
            num_classes = tf.shape(logits)[-1]
            on = 1.0 - self.label_smoothing
            off = self.label_smoothing / tf.cast(num_classes - 1, logits.dtype)
            soft = tf.one_hot(labels, num_classes, on_value=on, off_value=off, dtype=logits.dtype)
            entropy = -(on * tf.math.log(on)
                        + tf.cast(num_classes - 1, logits.dtype) * off * tf.math.log(off + 1e-20))
            loss = tf.nn.softmax_cross_entropy_with_logits(labels=soft, logits=logits) - entropy
        else:
            loss = target_loss
        if self.focal_loss_factor:
            # p_y as exp(-(-log p_y)): RETURNN gathers it from the softmax, the same value to rounding;
            # over thousands of classes a second softmax, a one-hot and their gradients would cost a third
            # of a Conformer hybrid's step
            loss *= (1.0 - tf.exp(-target_loss)) ** self.focal_loss_factor
        return loss


@tf.custom_gradient
def sparse_cross_entropy(logits: tf.Tensor, labels: tf.Tensor):
    """-log softmax(logits)_y per row of ``logits`` (N, C) with ``labels`` (N,), and its gradient
    softmax - onehot(y): what ``tf.nn.sparse_softmax_cross_entropy_with_logits`` computes, from TensorFlow's
    softmax kernel (oneDNN's on the CPU), which over 9001 classes took a third of that op's time, with
    its gradient. log p_y = l_y - logsumexp(l), and logsumexp(l) = l_j - log p_j for the most probable
    class j, whose p_j >= 1 / C never underflows: so a p_y below float32's range still gives its loss."""
    probs = tf.nn.softmax(logits)
    best = tf.argmax(logits, axis=-1, output_type=tf.int32)
    rows = labels.shape.rank or 1

    def at(values: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        return tf.gather(values, index, axis=-1, batch_dims=rows)

    loss = at(logits, best) - at(logits, labels) - tf.math.log(at(probs, best))

    def gradient(upstream: tf.Tensor):
        # (probs - onehot) * upstream as probs * upstream with upstream taken off at the labels: one pass
        # over the (frames, classes) tensor instead of three (a one-hot, a difference, a product)
        classes = tf.shape(logits)[-1]
        flat_upstream = tf.reshape(upstream, [-1])
        scaled = tf.reshape(probs, [-1, classes]) * flat_upstream[:, None]
        at_labels = tf.stack([tf.range(tf.size(flat_upstream)), tf.reshape(labels, [-1])], axis=1)
        return tf.reshape(tf.tensor_scatter_nd_sub(scaled, at_labels, flat_upstream), tf.shape(logits)), None
    return loss, gradient


def _at_least_passing_gradient(x: tf.Tensor, low: float) -> tf.Tensor:
    """max(x, low) whose gradient is 1 everywhere (RETURNN's maximum_with_identity_grad)."""
    return x + tf.stop_gradient(tf.maximum(x, low) - x)


@dataclass(frozen=True)
class ProbabilityCrossEntropy:
    """The ``ce`` loss of a layer whose output is probabilities but not a softmax's (an ``eval`` layer such
    as ``tf.exp(log_probs)``), as RETURNN computes it there: -log(max(p_y, 1e-20)), the max passing the
    gradient (its ``safe_log`` of the gathered target probability; no renormalisation). ``frame_losses``
    reads the probabilities where the softmax's criterion reads logits."""
    scale: float = 1.0
    normalized: bool = False

    def frame_losses(self, probabilities: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        target = tf.gather(probabilities, labels, axis=-1, batch_dims=labels.shape.rank)
        return -tf.math.log(_at_least_passing_gradient(target, 1e-20))
