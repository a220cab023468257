"""The LSTM of ``rec`` layers, in two implementations with the same math and parameters.

Weights W: rows [input; recurrent], gate columns in the order input, cell input, forget, output; bias b.
Per step: z = [x_t, h] W + b; c = sigmoid(z_i) tanh(z_c) + sigmoid(z_f) c; h = sigmoid(z_o) tanh(c).
Outputs after the longest sequence are 0.

- ``fused_lstm``: TensorFlow's fused ``BlockLSTM`` kernel forward, one op for all time steps, and on the
  CPU for ``n_out`` >= ``LOOP_BACKWARD_FROM`` a backward pass of our own (the fast one there, see
  ``benchmarks/bench_lstm.py``), else TensorFlow's ``BlockLSTMGrad``. Its gradient has no
  gradient of its own.
- ``scan_lstm``: the same steps in a ``tf.scan`` of plain ops, which can be differentiated twice
  (``maximize_grad_norm`` differentiates the gradient's norm).

Why a backward of our own: TensorFlow's ``BlockLSTMGrad`` multiplies each step's gate gradients by the
transposed weight matrix and adds [x_t, h]^T times them to the weight gradient, two small matrix products
per step whose operands Eigen re-packs from strided memory every step. On the CPU that packing was 43% of
a whole training step (perf, 1 thread, 2x LSTM-128, docs/performance.md). Here each step runs
``LSTMBlockCellGrad`` (the same elementwise gate math, one op) and one product with the recurrent weights
transposed once before the loop; the weight and input gradients of all steps are then three large
matrix products. Same math, the sums in a different order (gradients agree to float rounding); a step
took half the CPU time. On a GPU, ``BlockLSTMGrad``'s products are cuBLAS calls that read transposed
operands directly, so the GPU keeps it. So does the CPU for narrow LSTMs (``n_out`` up to
``LOOP_BACKWARD_FROM`` - 1): there the packing is cheap, and the loop's per-step cost (a dozen small ops
through TensorFlow's executor, ~300 steps per batch in a Transformer's front end) is what remains; at
``n_out`` 32 ``BlockLSTMGrad`` took half the time of the loop, at 64 a little less, at 128 1.5x more.
"""
from __future__ import annotations

import tensorflow as tf

# the narrowest LSTM whose CPU backward runs our loop (below it: TensorFlow's BlockLSTMGrad, see above)
LOOP_BACKWARD_FROM = 65


def _steps(x: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """Time steps to run: the longest sequence (never past T)."""
    longest = tf.reduce_max(tf.concat([lengths, [0]], axis=0))
    return tf.minimum(longest, tf.shape(x)[0])


def _block_lstm(x: tf.Tensor, steps: tf.Tensor, weights: tf.Tensor, bias: tf.Tensor, n_out: int) -> list:
    """BlockLSTM's outputs (i, cs, f, o, ci, co, h), each (T, B, n_out)."""
    zeros = tf.zeros([tf.shape(x)[1], n_out], x.dtype)
    peephole = tf.zeros([n_out], x.dtype)
    return tf.raw_ops.BlockLSTM(
        seq_len_max=tf.cast(steps, tf.int64), x=x, cs_prev=zeros, h_prev=zeros, w=weights, wci=peephole,
        wcf=peephole, wco=peephole, b=bias, forget_bias=0.0, cell_clip=-1.0, use_peephole=False)


def fused_lstm(x: tf.Tensor, lengths: tf.Tensor, weights: tf.Tensor, bias: tf.Tensor,
               n_out: int) -> tf.Tensor:
    """The LSTM over time-major ``x`` (T, B, in) -> h (T, B, n_out); ``lengths`` (B,) bound the steps run."""
    steps = _steps(x, lengths)
    if n_out < LOOP_BACKWARD_FROM or tf.config.list_logical_devices("GPU"):
        return _block_lstm(x, steps, weights, bias, n_out)[6]
    return _lstm_with_loop_backward(x, steps, weights, bias, n_out)


def _lstm_with_loop_backward(x: tf.Tensor, steps: tf.Tensor, weights: tf.Tensor, bias: tf.Tensor,
                             n_out: int) -> tf.Tensor:
    n_in = int(x.shape[-1])

    @tf.custom_gradient
    def lstm(x, weights, bias):
        outputs = _block_lstm(x, steps, weights, bias, n_out)
        gate_in, cell, gate_forget, gate_out, cell_in, cell_out, h = outputs

        def backward(dh):
            batch, dtype = tf.shape(x)[1], x.dtype
            zeros = tf.zeros([batch, n_out], dtype)
            peephole = tf.zeros([n_out], dtype)
            recurrent_t = tf.transpose(weights[n_in:])  # (4n, n), contiguous: cheap to pack per step
            cell_prev = tf.concat([zeros[None], cell[:-1]], axis=0)
            h_prev = tf.concat([zeros[None], h[:-1]], axis=0)

            def step(t, dh_next, dcell_next, dgates):
                t = t - 1
                dcell_prev, dgate, _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
                    x=x[t], cs_prev=cell_prev[t], h_prev=h_prev[t], w=weights, wci=peephole, wcf=peephole,
                    wco=peephole, b=bias, i=gate_in[t], cs=cell[t], f=gate_forget[t], o=gate_out[t],
                    ci=cell_in[t], co=cell_out[t], cs_grad=dcell_next, h_grad=dh[t] + dh_next,
                    use_peephole=False)
                return t, tf.matmul(dgate, recurrent_t), dcell_prev, dgates.write(t, dgate)

            gates = tf.TensorArray(dtype, size=steps, element_shape=tf.TensorShape([None, 4 * n_out]))
            _, _, _, gates = tf.while_loop(lambda t, *_: t > 0, step, (steps, zeros, zeros, gates))
            dgates = tf.cond(steps > 0, lambda: tf.reshape(gates.stack(), [-1, 4 * n_out]),  # (steps * B, 4n)
                             lambda: tf.zeros([0, 4 * n_out], dtype))  # an empty list does not stack
            inputs = tf.reshape(x[:steps], [-1, n_in])
            outputs = tf.reshape(h_prev[:steps], [-1, n_out])
            dweights = tf.concat([tf.matmul(inputs, dgates, transpose_a=True),
                                  tf.matmul(outputs, dgates, transpose_a=True)], axis=0)
            dx = tf.reshape(tf.matmul(dgates, weights[:n_in], transpose_b=True), [steps, batch, n_in])
            dx = tf.pad(dx, [[0, tf.shape(x)[0] - steps], [0, 0], [0, 0]])
            return dx, dweights, tf.reduce_sum(dgates, axis=0)

        return h, backward

    return lstm(x, weights, bias)


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
