"""Label sequences from frame scores, and how far two label sequences are apart.

Used by the ``ctc`` loss (its label error), the ``edit_distance`` loss and decoding in forward. Label
sequences are dense and padded: ``labels`` (B, L) int32 with ``label_lengths`` (B,); what lies past a
sequence's length is 0 and means nothing.
"""
from __future__ import annotations

import tensorflow as tf


def compact(values: tf.Tensor, keep: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The entries of ``values`` (B, T) where ``keep`` (B, T) bool is set, moved to the front of each row:
    (labels (B, L) padded with 0, lengths (B,))."""
    keep = tf.cast(keep, tf.bool)
    counts = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
    slots = tf.cumsum(tf.cast(keep, tf.int32), axis=1, exclusive=True)
    where = tf.where(keep)
    rows = tf.cast(where[:, 0], tf.int32)
    cols = tf.gather_nd(slots, where)
    width = tf.reduce_max(tf.concat([counts, [0]], axis=0))
    dense = tf.scatter_nd(tf.stack([rows, cols], axis=1), tf.gather_nd(tf.cast(values, tf.int32), where),
                          tf.stack([tf.shape(values)[0], width]))
    return dense, counts


def collapse_repeated(labels: tf.Tensor, lengths: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Each run of equal neighbouring labels as one label (``a a b a`` -> ``a b a``)."""
    labels = tf.cast(labels, tf.int32)
    mask = tf.sequence_mask(lengths, tf.shape(labels)[1])
    first = tf.concat([tf.ones_like(labels[:, :1], tf.bool), labels[:, 1:] != labels[:, :-1]], axis=1)
    return compact(labels, mask & first)


def greedy_labels(logits: tf.Tensor, lengths: tf.Tensor, blank: int) -> tuple[tf.Tensor, tf.Tensor]:
    """CTC best-path decoding: the best class of each frame ``t < lengths[b]`` of ``logits`` (B, T, C),
    runs of one class merged, then blanks dropped (as TF's ``ctc_greedy_decoder``)."""
    best = tf.argmax(logits, axis=-1, output_type=tf.int32)
    mask = tf.sequence_mask(lengths, tf.shape(best)[1])
    previous = tf.pad(best[:, :-1], [[0, 0], [1, 0]], constant_values=-1)
    return compact(best, mask & (best != blank) & (best != previous))


def beam_labels(logits: tf.Tensor, lengths: tf.Tensor, beam_width: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The best labelling of TF's CTC beam search (``ctc_beam_search_decoder``, blank = the last class),
    as RETURNN decodes in eval: ``logits`` (B, T, C), ``lengths`` (B,)."""
    decoded = tf.nn.ctc_beam_search_decoder(tf.transpose(logits, [1, 0, 2]), tf.cast(lengths, tf.int32),
                                            beam_width=beam_width, top_paths=1)[0][0]
    batch = tf.shape(logits)[0]
    counts = tf.math.unsorted_segment_sum(tf.ones_like(decoded.indices[:, 0], tf.int32),
                                          tf.cast(decoded.indices[:, 0], tf.int32), batch)
    return tf.cast(tf.sparse.to_dense(decoded), tf.int32), counts


def sparse_labels(labels: tf.Tensor, lengths: tf.Tensor) -> tf.SparseTensor:
    """Padded labels as the ``tf.SparseTensor`` (int32 values) TF's CTC ops take."""
    where = tf.where(tf.sequence_mask(lengths, tf.shape(labels)[1]))
    return tf.SparseTensor(where, tf.gather_nd(tf.cast(labels, tf.int32), where),
                           tf.shape(labels, out_type=tf.int64))


def edit_distances(hyp: tf.Tensor, hyp_lengths: tf.Tensor, ref: tf.Tensor,
                   ref_lengths: tf.Tensor) -> tf.Tensor:
    """Levenshtein distance (insertions, deletions, substitutions; not normalised) of each hypothesis to
    its reference: (B,) float32."""
    return tf.edit_distance(sparse_labels(hyp, hyp_lengths), sparse_labels(ref, ref_lengths), normalize=False)


def edit_distance_sum(hyp: tf.Tensor, hyp_lengths: tf.Tensor, ref: tf.Tensor,
                      ref_lengths: tf.Tensor) -> tf.Tensor:
    """The batch's summed edit distance (float32 scalar): divided by the summed reference lengths, the
    label error rate."""
    return tf.reduce_sum(edit_distances(hyp, hyp_lengths, ref, ref_lengths))
