"""The LSTM of ``rec`` layers, in two implementations with the same math and parameters.

Weights W: rows [input; recurrent], gate columns in the order input, cell input, forget, output; bias b.
Per step: z = [x_t, h] W + b; c = sigmoid(z_i) tanh(z_c) + sigmoid(z_f) c; h = sigmoid(z_o) tanh(c).
Outputs after the longest sequence are 0.

- ``fused_lstm``: TensorFlow's ``BlockLSTM`` kernel, one op for all time steps (the fast one, see
  ``benchmarks/bench_lstm.py``). Its gradient op has no gradient of its own.
- ``scan_lstm``: the same steps in a ``tf.scan`` of plain ops, which can be differentiated twice
  (``maximize_grad_norm`` differentiates the gradient's norm).
"""
from __future__ import annotations

import tensorflow as tf


def _steps(x: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """Time steps to run: the longest sequence (never past T)."""
    longest = tf.reduce_max(tf.concat([lengths, [0]], axis=0))
    return tf.minimum(longest, tf.shape(x)[0])


def fused_lstm(x: tf.Tensor, lengths: tf.Tensor, weights: tf.Tensor, bias: tf.Tensor,
               n_out: int) -> tf.Tensor:
    zeros = tf.zeros([tf.shape(x)[1], n_out], x.dtype)
    peephole = tf.zeros([n_out], x.dtype)
    return tf.raw_ops.BlockLSTM(
        seq_len_max=tf.cast(_steps(x, lengths), tf.int64), x=x, cs_prev=zeros, h_prev=zeros, w=weights,
        wci=peephole, wcf=peephole, wco=peephole, b=bias, forget_bias=0.0, cell_clip=-1.0, use_peephole=False,
    )[6]


def scan_lstm(x: tf.Tensor, lengths: tf.Tensor, weights: tf.Tensor, bias: tf.Tensor, n_out: int) -> tf.Tensor:
    zeros = tf.zeros([tf.shape(x)[1], n_out], x.dtype)

    def step(state, x_t):
        cell, out = state
        gate_in, cell_in, forget, gate_out = tf.split(
            tf.matmul(tf.concat([x_t, out], 1), weights) + bias, 4, 1)
        cell = tf.sigmoid(gate_in) * tf.tanh(cell_in) + tf.sigmoid(forget) * cell
        return cell, tf.sigmoid(gate_out) * tf.tanh(cell)

    _, outputs = tf.scan(step, x, initializer=(zeros, zeros))
    running = tf.range(tf.shape(x)[0]) < _steps(x, lengths)
    return outputs * tf.cast(running, x.dtype)[:, None, None]
