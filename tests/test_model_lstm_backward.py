"""The engine's own LSTM backward pass (``lstm._lstm_with_loop_backward``, what ``fused_lstm`` runs on the
CPU from ``lstm.LOOP_BACKWARD_FROM`` units up) against an independent reference: a plain LSTM unrolled
step by step in float64 in this file, differentiated by ``tf.GradientTape``.

The engine's path is called directly and pinned to the CPU, so the test checks it whatever device the
machine has: on a GPU ``fused_lstm`` itself runs TensorFlow's ``BlockLSTMGrad`` instead, and so does the
CPU for narrower LSTMs (checked against the same reference below; which op runs where is checked too).
The engine's backward is also compared with ``BlockLSTMGrad`` on the CPU (the same math, summed in another
order)."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from engine.model.layers import lstm
from engine.model.layers.lstm import fused_lstm

pytestmark = pytest.mark.tf_latest

CPU = "/CPU:0"
GPU_VISIBLE = bool(tf.config.list_logical_devices("GPU"))


def engine_backward_lstm(x, lengths, weights, bias, n_out):
    """The engine's custom-gradient LSTM, whatever ``fused_lstm`` would pick on this machine."""
    return lstm._lstm_with_loop_backward(x, lstm._steps(x, lengths), weights, bias, n_out)


def reference_gradients(x, lengths, weights, bias, upstream):
    """h, dx, dW, db of sum(h * upstream) for the LSTM of engine/model/layers/lstm.py's docstring, in float64:
    gates in the order input, cell input, forget, output; no forget bias; the steps run up to the longest
    sequence (never past T), outputs after them are 0."""
    time, batch, n_out = upstream.shape
    steps = min(max(lengths, default=0), time)
    x, weights, bias = (tf.constant(np.asarray(v, np.float64)) for v in (x, weights, bias))
    with tf.GradientTape() as tape:
        tape.watch([x, weights, bias])
        cell = out = tf.zeros([batch, n_out], tf.float64)
        outputs = []
        for t in range(steps):
            z = tf.matmul(tf.concat([x[t], out], axis=1), weights) + bias
            gate_in, cell_in, gate_forget, gate_out = (z[:, k * n_out:(k + 1) * n_out] for k in range(4))
            cell = tf.sigmoid(gate_in) * tf.tanh(cell_in) + tf.sigmoid(gate_forget) * cell
            out = tf.sigmoid(gate_out) * tf.tanh(cell)
            outputs.append(out)
        outputs += [tf.zeros([batch, n_out], tf.float64)] * (time - steps)
        h = tf.stack(outputs) if outputs else tf.zeros([0, batch, n_out], tf.float64)
        loss = tf.reduce_sum(h * upstream.astype(np.float64))
    grads = tape.gradient(loss, [x, weights, bias], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [h.numpy()] + [g.numpy() for g in grads]


def gradients(lstm_fn, x, lengths, weights, bias, upstream, device=None):
    """h, dx, dW, db of sum(h * upstream), traced with unknown time and batch as the engine's steps are."""
    x = tf.constant(x)

    @tf.function(input_signature=[tf.TensorSpec([None, None, x.shape[-1]]), tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([None, None, upstream.shape[-1]])])
    def run(x, lengths, upstream):
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = lstm_fn(x, lengths, weights, bias, upstream.shape[-1])
            loss = tf.reduce_sum(h * upstream)
        return [h] + tape.gradient(loss, [x, weights, bias])

    with tf.device(device) if device else contextlib.nullcontext():
        return [t.numpy() for t in run(x, tf.constant(lengths, tf.int32), tf.constant(upstream))]


def example(time, lengths, seed):
    rng = np.random.RandomState(seed)
    n_in, n_out = 5, 3
    weights = tf.Variable(rng.randn(n_in + n_out, 4 * n_out).astype("float32") * 0.5)
    bias = tf.Variable(rng.randn(4 * n_out).astype("float32") * 0.2)
    x = rng.randn(time, len(lengths), n_in).astype("float32")
    upstream = rng.randn(time, len(lengths), n_out).astype("float32")
    return x, weights, bias, upstream


def assert_match(ours, reference):
    for name, a, b in zip(("h", "dx", "dW", "db"), ours, reference):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6, err_msg=name)


CASES = [(9, [9, 4, 0, 7]), (12, [5, 3]), (6, [0, 0]), (0, [0, 0, 0]), (30, [30, 1, 17])]


@pytest.mark.parametrize("time, lengths", CASES)
def test_the_engines_backward_matches_a_plain_unrolled_lstm(time, lengths):
    """Outputs and every gradient, also with steps < T, zero-length sequences and an empty batch."""
    x, weights, bias, upstream = example(time, lengths, seed=time)
    ours = gradients(engine_backward_lstm, x, lengths, weights, bias, upstream, device=CPU)
    assert_match(ours, reference_gradients(x, lengths, weights.numpy(), bias.numpy(), upstream))
    if max(lengths, default=0) > 0:
        assert np.abs(ours[2]).sum() > 0  # the test compares real gradients, not zeros


def block_lstm_grad_lstm(x, lengths, weights, bias, n_out):
    """TensorFlow's BlockLSTM differentiated by its registered gradient (BlockLSTMGrad)."""
    zeros = tf.zeros([tf.shape(x)[1], n_out])
    peephole = tf.zeros([n_out])
    return tf.raw_ops.BlockLSTM(seq_len_max=tf.cast(lstm._steps(x, lengths), tf.int64), x=x, cs_prev=zeros,
                                h_prev=zeros, w=weights, wci=peephole, wcf=peephole, wco=peephole, b=bias,
                                forget_bias=0.0, cell_clip=-1.0, use_peephole=False)[6]


@pytest.mark.parametrize("time, lengths", CASES)
def test_the_engines_backward_matches_block_lstm_grad(time, lengths):
    """The same sums in another order: agreement to float32 rounding."""
    x, weights, bias, upstream = example(time, lengths, seed=time)
    ours = gradients(engine_backward_lstm, x, lengths, weights, bias, upstream, device=CPU)
    theirs = gradients(block_lstm_grad_lstm, x, lengths, weights, bias, upstream, device=CPU)
    for name, a, b in zip(("h", "dx", "dW", "db"), ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("time, lengths", CASES[:2])
def test_fused_lstm_on_this_machine_matches_the_plain_unrolled_lstm(time, lengths):
    """Whatever ``fused_lstm`` runs here (the engine's backward on the CPU, BlockLSTMGrad on a GPU)."""
    x, weights, bias, upstream = example(time, lengths, seed=time + 1)
    assert_match(gradients(fused_lstm, x, lengths, weights, bias, upstream),
                 reference_gradients(x, lengths, weights.numpy(), bias.numpy(), upstream))


def gradient_op_types(lstm_fn, n_out: int = 3) -> set[str]:
    """The op types of the gradient graph of ``lstm_fn``, nested functions (the while loop) included."""
    weights = tf.Variable(tf.zeros([5 + n_out, 4 * n_out]))
    bias = tf.Variable(tf.zeros([4 * n_out]))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 5]), tf.TensorSpec([None], tf.int32)])
    def run(x, lengths):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(lstm_fn(x, lengths, weights, bias, n_out))
        return tape.gradient(loss, [x, weights, bias])

    graph = run.get_concrete_function().graph.as_graph_def()
    nodes = list(graph.node) + [node for function in graph.library.function for node in function.node_def]
    return {node.op for node in nodes}


def test_fused_lstm_differentiates_through_the_engines_backward_on_the_cpu_from_its_width_only():
    narrow = gradient_op_types(fused_lstm, lstm.LOOP_BACKWARD_FROM - 1)
    wide = gradient_op_types(fused_lstm, lstm.LOOP_BACKWARD_FROM)
    assert "BlockLSTMGrad" in narrow and "LSTMBlockCellGrad" not in narrow, sorted(narrow)
    if GPU_VISIBLE:
        assert "BlockLSTMGrad" in wide and "LSTMBlockCellGrad" not in wide, sorted(wide)
    else:
        assert "LSTMBlockCellGrad" in wide and "BlockLSTMGrad" not in wide, sorted(wide)
    assert "LSTMBlockCellGrad" in gradient_op_types(engine_backward_lstm)


def test_backward_is_bitwise_repeatable():
    rng = np.random.RandomState(3)
    weights = tf.Variable(rng.randn(8, 12).astype("float32"))
    bias = tf.Variable(np.zeros(12, np.float32))
    x = rng.randn(20, 4, 5).astype("float32")
    upstream = rng.randn(20, 4, 3).astype("float32")
    first = gradients(engine_backward_lstm, x, [20, 11, 3, 17], weights, bias, upstream, device=CPU)
    second = gradients(engine_backward_lstm, x, [20, 11, 3, 17], weights, bias, upstream, device=CPU)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)
