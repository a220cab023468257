"""Where a network's tensors change layout. Layers run time-major (T, B, F): the fused LSTM kernel wants
that. TensorFlow's 2-D window ops are batch-major (B, T, S, C), so a chain of them (a VGG front-end:
convolutions, poolings and the activations between them) runs batch-major, transposed once into the chain
and once out of it instead of around every layer. Outputs go back to (B, T, F) where something reads them.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.layers.base import Layer
from engine.model.layers.conv2d import Conv2D, Pool2D
from engine.model.layers.elementwise import Activation


def time_major_ids(ids: tf.Tensor, lengths: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A sparse stream (B, L) as a layer reads it: (L, B), with 0 in the padding (padded ids may be out of
    range), and its lengths."""
    lengths = tf.cast(lengths, tf.int32)
    ids = tf.transpose(tf.cast(ids, tf.int32))
    mask = tf.transpose(tf.sequence_mask(lengths, tf.shape(ids)[0]))
    return tf.where(mask, ids, tf.zeros_like(ids)), lengths


def to_batch_major(x: tf.Tensor) -> tf.Tensor:
    """(T, B, ...) -> (B, T, ...), and back (the same swap)."""
    return tf.transpose(x, [1, 0, *range(2, x.shape.rank)])


def runs_batch_major(layer: Layer, sources: tuple[str, ...], chain: dict[str, tf.Tensor]) -> bool:
    """Whether the layer runs on batch-major (B, T, S, C) and keeps its output so: a window over time and a
    static axis (one of a frame at a time runs on either layout, so it does where its sources are), or an
    activation of such outputs. ``chain``: the batch-major outputs so far."""
    from_chain = bool(sources) and all(src in chain for src in sources)
    if isinstance(layer, (Conv2D, Pool2D)):
        return from_chain or not layer.frame_by_frame
    return isinstance(layer, Activation) and from_chain


def call_batch_major(layer: Layer, x: tf.Tensor, from_chain: bool, lengths: tf.Tensor,
                     training: bool) -> tf.Tensor:
    """The layer's (B, T, S, C) output from its input ``x``: batch-major when its sources are in the chain
    (``from_chain``), else time-major (T, B, ...)."""
    if not isinstance(layer, (Conv2D, Pool2D)):
        return layer(x, lengths, training)  # an activation
    x = layer.with_channels(x)
    return layer.on_batch_major(x if from_chain else tf.transpose(x, [1, 0, 2, 3]), lengths)
