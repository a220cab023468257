"""The cheaper forms of ops that small networks run many of: dropout as a product with a scaled mask, and
adam / nadam as TensorFlow's fused ``ApplyAdam`` (the LSTM backward chosen by width: its test is in
test_model_lstm_backward.py). Each must compute what the form it replaced computed."""

import numpy as np
import pytest
import tensorflow as tf

from engine.model.dropout import stateless_dropout
from engine.training.update.updater import Updater, optimizer_from_config

SEED = tf.constant([5, 9], tf.int64)


@pytest.mark.parametrize("rate", [0.1, 0.5])
@pytest.mark.parametrize("feature_mask", [False, True])
def test_dropout_equals_tensorflows_bit_for_bit(rate, feature_mask):
    x = tf.constant(np.random.RandomState(0).randn(7, 3, 11).astype(np.float32))
    noise_shape = tf.constant([1, 1, 11]) if feature_mask else None
    weights = tf.cos(x)

    @tf.function
    def both(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            theirs = tf.nn.experimental.stateless_dropout(x, rate=rate, seed=SEED, noise_shape=noise_shape)
            ours = stateless_dropout(x, rate, SEED, noise_shape)
            losses = [tf.reduce_sum(theirs * weights), tf.reduce_sum(ours * weights)]
        return theirs, ours, [tape.gradient(loss, x) for loss in losses]

    theirs, ours, (grad_theirs, grad_ours) = both(x)
    assert np.array_equal(theirs.numpy(), ours.numpy())
    assert np.array_equal(grad_theirs.numpy(), grad_ours.numpy())
    if rate == 0.5:  # the check is not vacuous (at 0.1 the 11 feature draws may all keep)
        assert 0.0 < (ours.numpy() == 0).mean() < 1.0
    with pytest.raises(ValueError, match=r"dropout rate must be in \[0, 1\)"):
        stateless_dropout(x, 1.0, SEED)


@pytest.mark.parametrize("name", ["adam", "nadam"])
def test_adam_is_one_fused_op_per_variable_and_equals_tensorflow1(name):
    start, grad = np.array([1.0, -2.0, 0.5], np.float32), np.array([0.3, -0.1, 2.0], np.float32)
    ours, theirs = tf.Variable(start), tf.Variable(start)
    updater = Updater([ours], optimizer_from_config(name), learning_rate=0.1)
    if name == "adam":
        tf.compat.v1.train.AdamOptimizer(0.1, epsilon=1e-16).apply_gradients([(tf.constant(grad), theirs)])
    apply = tf.function(lambda g: updater.apply_gradients([g]))
    apply(tf.constant(grad))
    ops = [op.type for op in apply.get_concrete_function(tf.constant(grad)).graph.get_operations()]
    assert ops.count("ResourceApplyAdam") == 1 and "AssignSubVariableOp" not in ops
    m, v = 0.1 * grad, 0.001 * grad * grad
    direction = m if name == "adam" else 0.9 * m + 0.1 * grad
    expected = start - 0.1 * np.sqrt(0.001) / 0.1 * direction / (np.sqrt(v) + 1e-16)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-6)
    if name == "adam":  # the kernel RETURNN's optimizer runs: the same bits
        assert np.array_equal(ours.numpy(), theirs.numpy())
