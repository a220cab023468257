"""What a network layer reads, and where the network's tensors change layout.

A layer's input is its sources' outputs, concatenated on the feature axis (sparse ones as one-hot), cast
to what it computes in, with its input dropout (``layer_input``). Layers run time-major (T, B, F): the
fused LSTM kernel wants that. TensorFlow's 2-D window ops are batch-major (B, T, S, C), so a chain of them
(a VGG front-end: convolutions, poolings and the activations between them) runs batch-major, transposed
once into the chain and once out of it instead of around every layer. Outputs go back to (B, T, F) where
something reads them.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.dropout import stateless_dropout
from engine.model.layers.base import Layer
from engine.model.layers.conv2d import Conv2D, Pool2D
from engine.model.layers.elementwise import Activation
from engine.model.spec import LayerSpec


def layer_input(spec: LayerSpec, layer: Layer, outs: dict[str, tf.Tensor], sparse_dims: dict[str, int],
                training: bool, seed: tf.Tensor) -> tf.Tensor | list[tf.Tensor]:
    """The layer's sources concatenated (or as a list, for a layer with ``separate_sources``), with
    one-hot sparse data (``sparse_dims``: source -> classes) and input dropout."""
    if layer.sparse_input:
        return outs[spec.sources[0]]
    parts = []
    for src in spec.sources:
        part = outs[src]
        if src in sparse_dims:
            part = tf.one_hot(part, sparse_dims[src], dtype=tf.float32)
        parts.append(tf.cast(part, layer.compute_dtype))  # tf_amp; no op in float32
    if layer.separate_sources:
        return parts  # such a layer takes no input dropout (``Combine`` refuses the option)
    x = parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
    rate = float(spec.opts.get("dropout", 0.0))
    if training and rate > 0.0:
        # RETURNN's default mask (Data.get_bc_shape): one per feature, shared by the batch and time
        noise_shape = tf.concat([tf.ones([tf.rank(x) - 1], tf.int32), tf.shape(x)[-1:]], axis=0)
        x = stateless_dropout(x, rate, seed, noise_shape)
    return x


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
