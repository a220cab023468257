"""The few functions of RETURNN's ``TFUtil`` (``returnn.tf.util.basic``) that configs call in eval layers and
SpecAugment functions, written for this engine, and the ``tf`` an eval expression sees.

Config code gets them by ``from TFUtil import where_bc`` (``returnn_imports.py``), eval expressions by
name, as in RETURNN. Loaded on first use only: it imports TensorFlow.
"""
from __future__ import annotations

import math
import types
from typing import Any

import tensorflow as tf

# ops that only move or rename values: a softmax seen through them is still the softmax (RETURNN looks
# through these too when it replaces log(softmax(z)) by log_softmax(z))
_MOVING_OPS = {
    "Identity": lambda inner, op: tf.identity(inner),
    "Reshape": lambda inner, op: tf.reshape(inner, op.inputs[1]),
    "Transpose": lambda inner, op: tf.transpose(inner, op.inputs[1]),
}


def _through_moves(x: tf.Tensor, op_type: str, replacement: Any) -> tf.Tensor | None:
    """``replacement(z)`` moved as ``x`` is, if ``x`` is ``op_type(z)`` moved by ``_MOVING_OPS``; else
    None. Only a graph (a ``tf.function``, where training runs) records how a tensor was made; eagerly
    this finds nothing."""
    if tf.executing_eagerly() or not hasattr(x, "op"):
        return None
    op = x.op
    if op.type in _MOVING_OPS:
        inner = _through_moves(op.inputs[0], op_type, replacement)
        return None if inner is None else _MOVING_OPS[op.type](inner, op)
    return replacement(op.inputs[0]) if op.type == op_type else None


def _clip_passing_gradient(x: tf.Tensor, low: Any, high: Any) -> tf.Tensor:
    """``clip(x, low, high)`` whose gradient is the incoming one everywhere (RETURNN's
    ``*_with_identity_grad``): a clipped value still tells which way to go."""

    @tf.custom_gradient
    def clip(value):
        out = value
        if low is not None:
            out = tf.maximum(out, tf.cast(low, value.dtype))
        if high is not None:
            out = tf.minimum(out, tf.cast(high, value.dtype))
        return out, lambda dy: dy

    return clip(x)


def safe_log(x: Any, eps: float = 1e-20, use_fake_grad: bool = True) -> tf.Tensor:
    """log(max(x, eps)), with the gradient passed through the max (``use_fake_grad``); ``log`` of a
    softmax, sigmoid or exp (in a graph) is log_softmax, log_sigmoid or the exponent itself."""
    x = tf.convert_to_tensor(x)
    for op_type, replacement in (("Exp", tf.identity), ("Softmax", tf.nn.log_softmax),
                                 ("Sigmoid", tf.math.log_sigmoid)):
        found = _through_moves(x, op_type, replacement)
        if found is not None:
            return found
    x = _clip_passing_gradient(x, eps, None) if use_fake_grad else tf.maximum(x, tf.cast(eps, x.dtype))
    return tf.math.log(x)


def safe_exp(x: Any, eps: float = 1e-20) -> tf.Tensor:
    """exp(x) with x clipped to [log eps, -log eps] (gradient passed through the clip), so never inf nor
    exactly 0; ``exp`` of a log, log_softmax or log_sigmoid (in a graph) is its argument, softmax or
    sigmoid."""
    x = tf.convert_to_tensor(x)
    for op_type, replacement in (("Log", tf.identity), ("LogSoftmax", tf.nn.softmax),
                                 ("LogSigmoid", tf.sigmoid)):
        found = _through_moves(x, op_type, replacement)
        if found is not None:
            return found
    return tf.exp(_clip_passing_gradient(x, math.log(eps), -math.log(eps)))


def _expanded(x: tf.Tensor, rank: int) -> tf.Tensor:
    """``x`` with axes of size 1 appended up to ``rank`` (RETURNN's where_bc broadcasts from the left)."""
    for _ in range(rank - x.shape.rank):
        x = tf.expand_dims(x, -1)
    return x


def where_bc(condition: Any, x: Any, y: Any, allow_broadcast_all_sources: Any = None,
             name: str = "where_bc") -> tf.Tensor:
    """``tf.where(condition, x, y)`` with broadcasting, where an operand of lower rank gets its missing
    axes at the end (not at the front, as numpy would); a Python number takes the other operand's dtype.
    ``allow_broadcast_all_sources`` only relaxed RETURNN's own shape check; TensorFlow's applies here."""
    with tf.name_scope(name):
        condition = tf.convert_to_tensor(condition)
        if tf.is_tensor(x) and not tf.is_tensor(y):
            y = tf.convert_to_tensor(y, dtype=x.dtype)
        elif tf.is_tensor(y) and not tf.is_tensor(x):
            x = tf.convert_to_tensor(x, dtype=y.dtype)
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        rank = max(condition.shape.rank, x.shape.rank, y.shape.rank)
        return tf.where(_expanded(condition, rank), _expanded(x, rank), _expanded(y, rank))


def get_shape(x: Any) -> list:
    """Each axis's size: an int where the graph knows it, else a scalar tensor."""
    x = tf.convert_to_tensor(x)
    dynamic = tf.shape(x)
    return [dim if dim is not None else dynamic[i] for i, dim in enumerate(x.shape.as_list())]


def dropout(x: Any, keep_prob: Any, noise_shape: Any = None, seed: int | None = None, name: str | None = None,
            cond_on_train: bool = False, apply_correction_factor: bool = True,
            grad_checkpointing: bool = False) -> tf.Tensor:
    """RETURNN's ``dropout``: ``x`` times a 0/1 mask (floor of keep_prob plus a uniform draw, so 1 at
    probability ``keep_prob``; a draw per entry of ``noise_shape``, whose None entries are x's sizes and 1s
    share a draw along that axis), divided by ``keep_prob`` with ``apply_correction_factor``.
    ``grad_checkpointing`` (recomputing the mask in the backward pass, to save memory) changes no value.
    ``cond_on_train`` is refused: config code has no train flag here; ``network.cond_on_train`` has."""
    from engine.runtime.errors import ConfigError

    if cond_on_train:
        raise ConfigError("TFUtil.dropout(..., cond_on_train=True) is not available in this engine: config "
                          "code sees no train flag; wrap the call in network.cond_on_train(train_fn, "
                          "eval_fn) as RETURNN's SpecAugment functions do.")
    x = tf.convert_to_tensor(x)
    if isinstance(keep_prob, (float, int)):
        if not 0 < keep_prob <= 1:
            raise ConfigError(f"TFUtil.dropout: keep_prob must be in (0, 1], got {keep_prob!r}.")
        if keep_prob == 1:
            return x
    keep_prob = tf.cast(keep_prob, x.dtype)
    sizes = tf.shape(x)
    shape = sizes if noise_shape is None else [sizes[i] if size is None else size
                                               for i, size in enumerate(noise_shape)]
    mask = tf.floor(keep_prob + tf.random.uniform(shape, seed=seed, dtype=x.dtype))
    return x * (mask / keep_prob if apply_correction_factor else mask)


class TfWithV1Names(types.ModuleType):
    """TensorFlow 2's ``tf``, where a name it lacks comes from ``tf.compat.v1``: eval expressions written
    for RETURNN on TensorFlow 1 say ``tf.to_float`` or ``tf.log_sigmoid``."""

    def __init__(self) -> None:
        super().__init__("tensorflow", "TensorFlow 2 with TensorFlow 1's names where TensorFlow 2 lacks them")

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(tf, name)
        except AttributeError:
            return getattr(tf.compat.v1, name)


# the names an eval expression sees besides tf, source, self and eval_locals (RETURNN: all of TFUtil)
EVAL_NAMES = {"where_bc": where_bc, "safe_log": safe_log, "safe_exp": safe_exp, "get_shape": get_shape,
              "dropout": dropout}
