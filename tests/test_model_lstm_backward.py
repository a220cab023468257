"""The CPU backward pass of ``lstm.fused_lstm`` against TensorFlow's own ``BlockLSTMGrad``."""

import numpy as np
import pytest
import tensorflow as tf

from engine.model.lstm import fused_lstm

pytestmark = pytest.mark.tf_latest


def reference_lstm(x, lengths, weights, bias, n_out):
    """BlockLSTM differentiated by TensorFlow's registered gradient (BlockLSTMGrad)."""
    steps = tf.minimum(tf.reduce_max(tf.concat([lengths, [0]], 0)), tf.shape(x)[0])
    zeros = tf.zeros([tf.shape(x)[1], n_out])
    peephole = tf.zeros([n_out])
    return tf.raw_ops.BlockLSTM(seq_len_max=tf.cast(steps, tf.int64), x=x, cs_prev=zeros, h_prev=zeros,
                                w=weights, wci=peephole, wcf=peephole, wco=peephole, b=bias, forget_bias=0.0,
                                cell_clip=-1.0, use_peephole=False)[6]


def gradients(lstm, x, lengths, weights, bias, upstream):
    x = tf.constant(x)

    @tf.function(input_signature=[tf.TensorSpec([None, None, x.shape[-1]]), tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([None, None, upstream.shape[-1]])])
    def run(x, lengths, upstream):
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = lstm(x, lengths, weights, bias, upstream.shape[-1])
            loss = tf.reduce_sum(h * upstream)
        return [h] + tape.gradient(loss, [x, weights, bias])

    return [t.numpy() for t in run(x, tf.constant(lengths, tf.int32), tf.constant(upstream))]


@pytest.mark.parametrize("time, lengths", [(9, [9, 4, 0, 7]), (12, [5, 3]), (6, [0, 0]), (0, [0, 0, 0])])
def test_gradients_match_block_lstm_grad(time, lengths):
    """Outputs and every gradient, also with steps < T, zero-length sequences and an empty batch."""
    rng = np.random.RandomState(time)
    n_in, n_out = 5, 3
    weights = tf.Variable(rng.randn(n_in + n_out, 4 * n_out).astype("float32") * 0.5)
    bias = tf.Variable(rng.randn(4 * n_out).astype("float32") * 0.2)
    x = rng.randn(time, len(lengths), n_in).astype("float32")
    upstream = rng.randn(time, len(lengths), n_out).astype("float32")
    ours = gradients(fused_lstm, x, lengths, weights, bias, upstream)
    theirs = gradients(reference_lstm, x, lengths, weights, bias, upstream)
    for name, a, b in zip(("h", "dx", "dW", "db"), ours, theirs):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
    if max(lengths, default=0) > 0:
        assert np.abs(ours[2]).sum() > 0  # the test compares real gradients, not zeros


def test_backward_is_bitwise_repeatable():
    rng = np.random.RandomState(3)
    weights = tf.Variable(rng.randn(8, 12).astype("float32"))
    bias = tf.Variable(np.zeros(12, np.float32))
    x = rng.randn(20, 4, 5).astype("float32")
    upstream = rng.randn(20, 4, 3).astype("float32")
    first = gradients(fused_lstm, x, [20, 11, 3, 17], weights, bias, upstream)
    second = gradients(fused_lstm, x, [20, 11, 3, 17], weights, bias, upstream)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)
