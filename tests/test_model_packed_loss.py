"""The cross-entropy of softmax layers as the engine computes it fast: TensorFlow's softmax kernel for the
sparse cross-entropy (``sparse_cross_entropy``), and the logits of only the frames the loss scores
(``packed_ce_sums``), each against TensorFlow's fused op and the padded computation, values and
gradients, with RETURNN's ``loss_opts``."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.model.base import masked_ce_sums, packed_ce_sums
from engine.model.losses.cross_entropy import CrossEntropy, sparse_cross_entropy
from engine.runtime.errors import DataError


@pytest.mark.parametrize("scale", [1.0, 30.0, 300.0])  # 300: p_y far below float32's smallest number
def test_sparse_cross_entropy_is_tensorflows_fused_op(scale):
    rng = np.random.RandomState(int(scale))
    logits = tf.constant((rng.randn(2, 7, 501) * scale).astype(np.float32))
    labels = tf.constant(rng.randint(0, 501, (2, 7)).astype(np.int32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours = sparse_cross_entropy(logits, labels)
        fused = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        focal = [tf.reduce_sum(ce * (1.0 - tf.exp(-ce)) ** 2 * np.arange(7)) for ce in (ours, fused)]
    assert np.isfinite(ours.numpy()).all()
    np.testing.assert_allclose(ours.numpy(), fused.numpy(), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(tape.gradient(focal[0], logits).numpy(),
                               tape.gradient(focal[1], logits).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("criterion", [CrossEntropy(), CrossEntropy(focal_loss_factor=2.0),
                                       CrossEntropy(label_smoothing=0.1, focal_loss_factor=1.0)])
def test_packed_logits_score_what_the_padded_ones_score(criterion):
    rng = np.random.RandomState(3)
    lengths = tf.constant([6, 2, 0, 4])
    inputs = tf.constant(rng.randn(4, 6, 5).astype(np.float32))
    labels = rng.randint(0, 11, (4, 6)).astype(np.int32)
    labels[1, 2:] = 99  # the padding may hold anything, even ids out of range
    weights = tf.Variable(rng.randn(5, 11).astype(np.float32))
    bias = tf.Variable(rng.randn(11).astype(np.float32))

    def project(rows):
        return tf.nn.bias_add(tf.matmul(tf.reshape(rows, [-1, 5]), weights), bias)

    with tf.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        padded = masked_ce_sums(tf.reshape(project(inputs), [4, 6, 11]), tf.constant(labels), lengths, "out",
                                criterion)
        packed = packed_ce_sums(tf.transpose(inputs, [1, 0, 2]), project, tf.constant(labels), lengths, "out",
                                criterion)
    np.testing.assert_allclose([float(v) for v in packed], [float(v) for v in padded], rtol=1e-6)
    assert float(packed[2]) == 12.0
    for source in (inputs, weights, bias):
        np.testing.assert_allclose(tape.gradient(packed[0], source).numpy(),
                                   tape.gradient(padded[0], source).numpy(), rtol=1e-5, atol=1e-6)


def test_a_target_of_other_length_is_still_a_data_error():
    with pytest.raises(DataError, match="'out' is frame-wise"):
        packed_ce_sums(tf.zeros([5, 2, 3]), lambda rows: rows, tf.zeros([2, 4], tf.int32),
                       tf.constant([5, 4]), "out")


def test_a_networks_softmax_loss_equals_the_loss_of_its_padded_logits():
    model = build_model({"hidden": {"class": "linear", "activation": "tanh", "n_out": 6, "from": "data"},
                         "output": {"class": "softmax", "loss": "ce", "from": "hidden",
                                    "loss_opts": {"focal_loss_factor": 2.0}}},
                        input_dim=4, input_sparse=False, target_dims={"classes": 9})
    rng = np.random.RandomState(0)
    data = tf.constant(rng.randn(3, 7, 4).astype(np.float32))
    lengths = tf.constant([7, 3, 5])
    targets = {"classes": tf.constant(rng.randint(0, 9, (3, 7)).astype(np.int32))}
    outputs = model(data, lengths)
    assert "output:logits_input" in outputs
    loss = model.compute_losses(outputs, targets, {"classes": lengths})
    reference = masked_ce_sums(outputs["output:logits"], targets["classes"], lengths, "output",
                               model.loss_objects["output"].criterion)
    np.testing.assert_allclose([float(loss.loss), float(loss.error), float(loss.num_frames)],
                               [float(v) for v in reference], rtol=1e-6)
