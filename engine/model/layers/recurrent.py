"""Recurrent layers of the ``network`` dict: ``rec`` with an LSTM unit (its kernels: ``lstm.py`` and
``lstm_cudnn.py``, chosen by ``lstm_choice.py``)."""

from __future__ import annotations

import tensorflow as tf

from engine.model.dropout import stateless_dropout
from engine.model.initializers import GLOROT_UNIFORM, ZEROS, Initializer, parse_initializer
from engine.model.layers.base import Layer, glorot_variable, positive_int
from engine.model.layers.lstm_choice import LstmKernel, choose_lstm, on_gpu
from engine.model.layers.lstm_norm_options import rec_weight_dropout
from engine.runtime.errors import ConfigError

# RETURNN's TF-2 units that run as TensorFlow's LSTM cell (StandardLSTM; TF 2 has no BasicLSTM, so RETURNN
# takes StandardLSTM): one glorot matrix over [input; recurrent], and forget bias 1 added at run time
# (returnn/tf/layers/rec.py, get_rnn_cell_class). Every other unit runs as NativeLSTM2 (lstm, lstmp, and in
# TF 2 also LSTMBlock, LSTMBlockFused and CudnnLSTM without a GPU): input and recurrent weights each
# glorot on their own (NativeLstmLowMem: one kernel, one glorot matrix), and no forget bias.
TF_CELL_UNITS = ("basiclstm", "standardlstm")
# the units whose RETURNN cell keeps input and recurrent weights in one variable, as this engine's W does
# (the rest keep W and W_re: engine/training/checkpoints/returnn_format.py, LSTM_LAYOUTS)
ONE_KERNEL_UNITS = TF_CELL_UNITS + ("nativelstmlowmem",)
# the units whose RETURNN cell is a fused native op that gets its W, W_re and b from the rec layer's
# forward_weights_init, recurrent_weights_init and bias_init (NativeLstm2, NativeLstmCell)
INIT_OPTION_UNITS = ("lstm", "lstmp", "nativelstm2", "lstmblock", "lstmblockfused", "cudnnlstm", "nativelstm")
INIT_OPTIONS = ("forward_weights_init", "recurrent_weights_init", "bias_init")


def initializers(name: str, opts: dict, unit: str) -> tuple[Initializer, Initializer, Initializer]:
    """The initializers of W, W_re and b, as RETURNN picks them: an absent weights option falls back on
    the other one (the recurrent one first), then on glorot_uniform; the bias starts at 0."""
    given = {key: parse_initializer(name, key, opts[key])
             for key in INIT_OPTIONS if opts.get(key) is not None}
    if given and unit not in INIT_OPTION_UNITS:
        raise ConfigError(f"Network layer '{name}': {', '.join(given)} on unit {opts.get('unit')!r} is not "
                          "supported: this engine takes them on the units that RETURNN runs as NativeLstm2 "
                          f"or NativeLstmCell ({', '.join(INIT_OPTION_UNITS)}).")
    forward, recurrent = given.get("forward_weights_init"), given.get("recurrent_weights_init")
    fallback = recurrent or forward or GLOROT_UNIFORM  # RETURNN's variable scope default
    return forward or fallback, recurrent or fallback, given.get("bias_init", ZEROS)


class Rec(Layer):
    """``rec`` with an LSTM unit; ``direction`` -1 runs over the valid part of each sequence reversed.
    Its parameters start as RETURNN's unit's do (``TF_CELL_UNITS``), and it computes what that unit does.

    The LSTM kernel is chosen by ``lstm_choice.choose_lstm`` (``lstm_implementation``: cuDNN on a GPU, the
    engine's own on a CPU); every kernel takes the same ``W`` and ``b``, so checkpoints do not depend on it.
    Padding cannot leak into valid frames: forward, padded frames come after all valid ones; backward,
    the valid part is reversed in place (``tf.reverse_sequence``) so the padding still comes last.
    """

    def __init__(self, name: str, opts: dict, in_dim: int, *, random_seed: int,
                 twice_differentiable: bool = False, implementation: str | None = None) -> None:
        super().__init__(in_dim)
        self.n_out = positive_int(name, opts, "n_out")  # its unit is an LSTM (``spec.py`` checks)
        self.direction = opts.get("direction", 1)
        if self.direction not in (1, -1):
            raise ConfigError(f"Network layer '{name}': direction must be 1 or -1, got {self.direction!r}.")
        self.kernel: LstmKernel = choose_lstm(implementation, gpu=on_gpu(),
                                              twice_differentiable=twice_differentiable)
        self.unit = opts.get("unit", "lstm").lower()
        n = self.n_out
        inits = initializers(name, opts, self.unit)
        if self.unit in ONE_KERNEL_UNITS:  # RETURNN draws its one kernel at once
            self.params["W"] = glorot_variable(f"{name}/W", (in_dim + n, 4 * n), random_seed)
        else:
            weights = tf.concat([inits[0].values(f"{name}/W", (in_dim, 4 * n), random_seed),
                                 inits[1].values(f"{name}/W_re", (n, 4 * n), random_seed)], axis=0)
            self.params["W"] = tf.Variable(weights, name=f"{name}/W")
        self.forget_bias = 1.0 if self.unit in TF_CELL_UNITS else 0.0
        # the variable holds RETURNN's bias (bias_init, default 0); the forget bias is added where it is used
        self.params["b"] = inits[2].variable(f"{name}/b", (4 * n,), random_seed)
        # W's rows as RETURNN's variables: W (input) and W_re (recurrent), or one kernel (model.returnn_parts)
        self.returnn_parts = {} if self.unit in ONE_KERNEL_UNITS else {"W": (in_dim, n)}
        self.rec_weight_dropout, self.rec_weight_dropout_shape = rec_weight_dropout(
            name, self.unit, opts.get("unit_opts"))
        self.needs_seed = self.rec_weight_dropout > 0.0

    def _weights(self, training: bool, seed: tf.Tensor | None) -> tf.Tensor:
        """W; in training with ``rec_weight_dropout``, its recurrent rows (RETURNN's W_re) dropped as
        RETURNN's NativeLstm2 drops them: one mask per training step, the same for every sequence and
        frame."""
        weights = self.params["W"]
        if not (training and self.rec_weight_dropout):
            return weights
        n_in = weights.shape[0] - self.n_out
        recurrent = weights[n_in:]
        shape = self.rec_weight_dropout_shape
        noise = None if shape is None else [tf.shape(recurrent)[i] if size is None else size
                                            for i, size in enumerate(shape)]
        return tf.concat([weights[:n_in], stateless_dropout(recurrent, self.rec_weight_dropout, seed, noise)],
                         axis=0)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool,
                 seed: tf.Tensor | None = None) -> tf.Tensor:
        if self.direction == -1:
            x = tf.reverse_sequence(x, lengths, seq_axis=0, batch_axis=1)
        bias = self.params["b"]
        if self.forget_bias:
            n = self.n_out
            bias = bias + tf.concat([tf.zeros([2 * n]), tf.fill([n], self.forget_bias), tf.zeros([n])], 0)
        # tf_amp: the recurrence stays float32 (no bfloat16 kernels; the cell state sums over all steps)
        h = tf.cast(self.kernel.run(tf.cast(x, tf.float32), lengths, self._weights(training, seed), bias,
                                    self.n_out),
                    self.compute_dtype)
        if self.direction == -1:
            h = tf.reverse_sequence(h, lengths, seq_axis=0, batch_axis=1)
        return h
