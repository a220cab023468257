"""The LSTM of ``rec`` layers through cuDNN on a GPU, and its CPU twin; same parameters as ``lstm.py``.

On a GPU, ``cudnn_lstm`` calls ``CudnnRNNV3`` (the op Keras' LSTM runs on a GPU, ``gpu_lstm`` in Keras
2) with this engine's variables converted at run time into cuDNN's flat parameter vector
(``cudnn_params``): per gate one input matrix and one recurrent matrix, each transposed (cuDNN reads
rows as units), in cuDNN's gate order input, forget, cell input, output, then eight biases. Ours keep
the columns of ``W`` (rows [input; recurrent]) in the order input, cell input, forget, output, and one
bias, so the conversion reorders the gate blocks, transposes, and puts ``b`` (with the forget bias of
``TF_CELL_UNITS`` already added by ``Rec``) in the recurrent half of cuDNN's biases, zeros in the input
half, as Keras does. The variables are unchanged: a checkpoint moves between CPU and GPU as it is, and
the gradient reaches ``W`` and ``b`` through the conversion.

Variable lengths: right-padded time-major input and the sequence lengths go to the op; cuDNN stops each
sequence at its length and writes 0 after it (``lstm.fused_lstm`` runs every sequence to the longest
and leaves values there that nothing reads: later layers and losses mask them). A sequence of length 0
goes in as length 1 (cuDNN refuses 0) and its outputs are zeroed after.

The CPU twin (``cudnn_twin``): no CPU kernel exists for ``CudnnRNNV3``, so the twin is the standard LSTM
of plain ops that Keras runs in its place on a CPU (``standard_lstm``), but reading the very parameter
vector the GPU op gets, in cuDNN's documented layout, and with the op's semantics (two bias halves
added, state held and output 0 past each length). What the twin proves on the CPU: that the reading of
the vector agrees with its writing (``_unpack`` undoes ``cudnn_params``), the length handling and the
gradients through the conversion to our variables. What it cannot prove: that the layout is cuDNN's (an
error that writing and reading share leaves the twin right), for which the vector is compared with the
one Keras builds for cuDNN (tests/test_lstm_cudnn.py, and ``make gpu-check`` with the real kernel on a
GPU, ``benchmarks/lstm_layout_probe.py``); nor the cuDNN kernel itself. No GPU run has been made here.
"""
from __future__ import annotations

import tensorflow as tf

# cuDNN's gate order (input, forget, cell input, output) as block indices of our W's columns
# (input, cell input, forget, output)
CUDNN_GATES = (0, 2, 1, 3)


def cudnn_params(weights: tf.Tensor, bias: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    """The flat parameter vector of ``CudnnRNNV3`` (one layer, one direction, LSTM) from our ``W``
    (n_in + n_out, 4 n_out) and bias (4 n_out, forget bias included)."""
    gates_in = tf.split(weights[:n_in], 4, axis=1)
    gates_re = tf.split(weights[n_in:], 4, axis=1)
    biases = tf.split(bias, 4)
    blocks = [tf.reshape(tf.transpose(gates_in[g]), [-1]) for g in CUDNN_GATES]
    blocks += [tf.reshape(tf.transpose(gates_re[g]), [-1]) for g in CUDNN_GATES]
    blocks += [tf.zeros([4 * n_out], bias.dtype)]  # the input half of cuDNN's biases
    blocks += [biases[g] for g in CUDNN_GATES]
    return tf.concat(blocks, axis=0)


def _unpack(params: tf.Tensor, n_in: int, n_out: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """cuDNN's vector back as (n_in, 4n), (n, 4n) and (4n,), gate columns in cuDNN's order: how the op reads
    it (8 row-major unit-by-input matrices, then 8 biases)."""
    sizes = [n_out * n_in] * 4 + [n_out * n_out] * 4 + [n_out] * 8
    parts = tf.split(params, sizes)
    kernel = tf.concat([tf.transpose(tf.reshape(p, [n_out, n_in])) for p in parts[:4]], axis=1)
    recurrent = tf.concat([tf.transpose(tf.reshape(p, [n_out, n_out])) for p in parts[4:8]], axis=1)
    return kernel, recurrent, tf.concat(parts[8:12], 0) + tf.concat(parts[12:], 0)


def _op_lengths(lengths: tf.Tensor) -> tf.Tensor:
    return tf.maximum(tf.cast(lengths, tf.int32), 1)


def _zero_past_lengths(h: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    valid = tf.transpose(tf.sequence_mask(lengths, tf.shape(h)[0]))  # (T, B)
    return tf.where(valid[:, :, None], h, tf.zeros_like(h))


def cudnn_lstm(x: tf.Tensor, lengths: tf.Tensor, weights: tf.Tensor, bias: tf.Tensor,
               n_out: int) -> tf.Tensor:
    """``CudnnRNNV3`` over time-major ``x`` (T, B, in) -> h (T, B, n_out), 0 past each length. GPU only."""
    n_in = int(x.shape[-1])
    zeros = tf.zeros([1, tf.shape(x)[1], n_out], x.dtype)
    h, _, _, _, _ = tf.raw_ops.CudnnRNNV3(
        input=x, input_h=zeros, input_c=zeros, params=cudnn_params(weights, bias, n_in, n_out),
        sequence_lengths=_op_lengths(lengths), rnn_mode="lstm", input_mode="linear_input",
        direction="unidirectional", is_training=True, time_major=True)
    return _zero_past_lengths(h, lengths)


def cudnn_twin(x: tf.Tensor, lengths: tf.Tensor, weights: tf.Tensor, bias: tf.Tensor,
               n_out: int) -> tf.Tensor:
    """What ``cudnn_lstm`` computes, in plain ops on any device (see the module docstring)."""
    n_in = int(x.shape[-1])
    kernel, recurrent, full_bias = _unpack(cudnn_params(weights, bias, n_in, n_out), n_in, n_out)
    batch = tf.shape(x)[1]
    projected = tf.reshape(tf.matmul(tf.reshape(x, [-1, n_in]), kernel) + full_bias, [-1, batch, 4 * n_out])
    running = tf.transpose(tf.sequence_mask(_op_lengths(lengths), tf.shape(x)[0]))[:, :, None]  # (T, B, 1)
    zeros = tf.zeros([batch, n_out], x.dtype)

    def step(state, inputs):
        cell, out = state
        z_t, valid = inputs
        gate_in, forget, cell_in, gate_out = tf.split(z_t + tf.matmul(out, recurrent), 4, axis=1)
        new_cell = tf.sigmoid(forget) * cell + tf.sigmoid(gate_in) * tf.tanh(cell_in)
        new_out = tf.sigmoid(gate_out) * tf.tanh(new_cell)
        # past its length a sequence keeps its state, as the op does
        return tf.where(valid, new_cell, cell), tf.where(valid, new_out, out)

    _, h = tf.scan(step, (projected, running), initializer=(zeros, zeros))
    return _zero_past_lengths(h, lengths)
