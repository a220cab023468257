"""``rec`` with unit ``layernormvariantslstm``: RETURNN's LayerNormVariantsLSTMCell, an LSTM with layer
norms where its ``unit_opts`` (``lstm_norm_options.py``) put them, and dropout inside the recurrence.

One step, gates in RETURNN's order (i, j, f, o), ``norm`` a layer norm over the features with a gamma
and (mostly) a beta of its own, each named ``<where>`` below as RETURNN names its variables:

- ``z`` = norm_input_below(x W_ff) + norm_state_below(h' W_re) with ``global_norm`` (the default; the
  second norm has no beta); norm_lstm_in(x W_ff + h' W_re) with ``global_norm_joined``; x W_ff + h' W_re
  (+ bias_ff) otherwise. ``with_concat``: one matrix W_ff_re over [x; h'] (+ bias_ff_re) instead.
- i, j, f, o = the four blocks of ``z``, each normed on its own with ``per_gate_norm`` (``<g>_gate``);
- c = sigmoid(f) c_prev + sigmoid(i) tanh(j); with ``cell_norm`` (default) the state is norm_new_c(c),
  which the output reads too unless ``cell_norm_in_output`` is False;
- h = sigmoid(o) tanh(c), normed (new_h) with ``hidden_norm``.

The parameters keep RETURNN's names, shapes and layouts (the checkpoint names are ``<layer>/rec/<key>``).
Their initial values are RETURNN's: W_ff from ``forward_weights_init``, W_re and W_ff_re from
``recurrent_weights_init`` (each falling back on the other, then glorot), gammas ``norm_gain``, betas
``norm_shift``, biases 0, and a positive ``forget_bias`` added to the bias's forget block or, as RETURNN
does, to the whole beta of the norm that holds the forget gate (input_below, lstm_in) or to beta_f_gate.

Training (``training`` True) applies the two dropouts as RETURNN does: one mask (B, n) a call, the same
at every step; ``dropout`` on tanh(j), ``dropout_h`` on h_prev where it enters the recurrent weights (the
state keeps the undropped h). RETURNN draws both masks from one seed, so they come from one uniform draw
here too: a unit is kept where the draw is at least the rate, and equal rates give the same mask.

The recurrence runs in a ``tf.scan`` of plain ops (in float32 under ``tf_amp``); ``lstm_implementation``
does not apply. ``direction`` -1 reverses each sequence's valid part, as for the plain LSTM units.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.initializers import GLOROT_UNIFORM, Initializer, parse_initializer
from engine.model.layers.base import Layer, positive_int, time_mask
from engine.model.layers.lstm_norm_options import norm_lstm_options
from engine.runtime.errors import ConfigError

GATES = ("i", "j", "f", "o")  # RETURNN's order of the four column blocks


def dropout_masks(seed: tf.Tensor, batch: tf.Tensor, n: int,
                  rates: tuple[float, ...]) -> list[tf.Tensor | None]:
    """A mask (batch, n) per rate (None for rate 0), all from one uniform draw: RETURNN's cell gives its
    masks one seed. A unit is kept where the draw is at least the rate; kept units are scaled by
    1 / (1 - rate)."""
    uniform = tf.random.stateless_uniform(tf.stack([batch, n]), seed=seed)
    return [tf.floor((1.0 - rate) + uniform) / (1.0 - rate) if rate else None for rate in rates]


class NormLstmRec(Layer):
    """``rec`` with unit ``layernormvariantslstm`` (see the module docstring)."""

    needs_seed = True  # its dropout masks
    runs = "layernormvariantslstm (plain ops, tf.scan)"  # for the placement line

    def __init__(self, name: str, opts: dict, in_dim: int, *, random_seed: int) -> None:
        super().__init__(in_dim)
        self.n_out = n = positive_int(name, opts, "n_out")
        self.direction = opts.get("direction", 1)
        if self.direction not in (1, -1):
            raise ConfigError(f"Network layer '{name}': direction must be 1 or -1, got {self.direction!r}.")
        if opts.get("bias_init") is not None:
            raise ConfigError(f"Network layer '{name}': bias_init on unit {opts.get('unit')!r} is refused: "
                              "RETURNN's LayerNormVariantsLSTMCell does not read it (its biases start at 0, "
                              "or at forget_bias in the forget block); remove it.")
        self.options = o = norm_lstm_options(f"Network layer '{name}'", opts.get("unit_opts"))
        given = {key: parse_initializer(name, key, opts[key])
                 for key in ("forward_weights_init", "recurrent_weights_init") if opts.get(key) is not None}
        forward, recurrent = given.get("forward_weights_init"), given.get("recurrent_weights_init")
        fallback = recurrent or forward or GLOROT_UNIFORM  # RETURNN's rec variable scope's initializer
        self.layer_name, self.random_seed = name, random_seed
        forget = o.forget_bias if o.forget_bias > 0 else 0.0  # RETURNN adds only a positive one
        plain = not (o.global_norm or o.global_norm_joined or o.per_gate_norm)
        if o.with_concat:
            self._weights("W_ff_re", (in_dim + n, 4 * n), recurrent or fallback)
            if not (o.per_gate_norm or o.global_norm_joined):
                self._bias("bias_ff_re", forget)
        else:
            self._weights("W_ff", (in_dim, 4 * n), forward or fallback)
            if plain:
                self._bias("bias_ff", forget)
            if o.global_norm:
                self._norm_params("input_below", 4 * n, forget)
            self._weights("W_re", (n, 4 * n), recurrent or fallback)
            if o.global_norm:
                self._norm_params("state_below", 4 * n, None)
        if o.global_norm_joined:
            self._norm_params("lstm_in", 4 * n, forget)
        if o.per_gate_norm:
            for gate in GATES:
                self._norm_params(f"{gate}_gate", n, forget if gate == "f" else 0.0)
        if o.cell_norm:
            self._norm_params("new_c", n, 0.0)
        if o.hidden_norm:
            self._norm_params("new_h", n, 0.0)

    def _weights(self, key: str, shape: tuple[int, int], init: Initializer) -> None:
        self.params[key] = tf.Variable(init.values(f"{self.layer_name}/{key}", shape, self.random_seed),
                                       name=f"{self.layer_name}/{key}")

    def _bias(self, key: str, forget: float) -> None:
        n = self.n_out
        value = tf.concat([tf.zeros([2 * n]), tf.fill([n], forget), tf.zeros([n])], 0)
        self.params[key] = tf.Variable(value, name=f"{self.layer_name}/{key}")

    def _norm_params(self, where: str, size: int, forget: float | None) -> None:
        """gamma_<where>, and beta_<where> unless ``forget`` is None (no beta)."""
        gamma = f"gamma_{where}"
        self.params[gamma] = tf.Variable(tf.fill([size], self.options.norm_gain),
                                         name=f"{self.layer_name}/{gamma}")
        if forget is not None:
            beta = f"beta_{where}"
            self.params[beta] = tf.Variable(tf.fill([size], self.options.norm_shift + forget),
                                            name=f"{self.layer_name}/{beta}")

    def _norm(self, x: tf.Tensor, where: str) -> tf.Tensor:
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        normalized = (x - mean) * tf.math.rsqrt(variance + self.options.variance_epsilon)
        y = normalized * self.params[f"gamma_{where}"]
        beta = self.params.get(f"beta_{where}")
        return y if beta is None else y + beta

    def transformed_input(self, x: tf.Tensor) -> tf.Tensor:
        """The input's share of a step, (..., 4n), for any number of steps at once (RETURNN's
        ``get_input_transformed``); with_concat's [x; h] W_ff_re is x W[:in] + h W[in:]."""
        o, p = self.options, self.params
        if o.with_concat:
            below, bias = tf.tensordot(x, p["W_ff_re"][:self.in_dim], 1), p.get("bias_ff_re")
        else:
            below, bias = tf.tensordot(x, p["W_ff"], 1), p.get("bias_ff")
        if bias is not None:
            below += bias
        return self._norm(below, "input_below") if o.global_norm else below

    def dropout_masks(self, seed: tf.Tensor | None, batch: tf.Tensor,
                      training: bool) -> tuple[tf.Tensor | None, tf.Tensor | None]:
        """The masks of ``dropout`` and ``dropout_h`` (None where not applied): in training one pair per
        call, the same at every step (RETURNN makes them outside its loop)."""
        o = self.options
        if not (training and (o.dropout or o.dropout_h)):
            return None, None
        if seed is None:
            raise ValueError("NormLstmRec needs a seed for its dropout in training")
        mask_j, mask_h = dropout_masks(seed, batch, self.n_out, (o.dropout, o.dropout_h))
        return mask_j, mask_h

    def step(self, state: tuple[tf.Tensor, tf.Tensor], below: tf.Tensor, mask_j: tf.Tensor | None,
             mask_h: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        """One step: the new (c, h) from the state and the input's share ``below`` (B, 4n)."""
        o, p = self.options, self.params
        c, h = state
        if mask_h is not None:
            h = h * mask_h
        from_h = tf.matmul(h, p["W_ff_re"][self.in_dim:] if o.with_concat else p["W_re"])
        if o.global_norm:
            from_h = self._norm(from_h, "state_below")
        z = below + from_h
        if o.global_norm_joined:
            z = self._norm(z, "lstm_in")
        gates = dict(zip(GATES, tf.split(z, 4, axis=-1)))
        if o.per_gate_norm:
            gates = {g: self._norm(value, f"{g}_gate") for g, value in gates.items()}
        cell_in = tf.tanh(gates["j"])
        if mask_j is not None:
            cell_in *= mask_j
        c = tf.sigmoid(gates["f"]) * c + tf.sigmoid(gates["i"]) * cell_in
        c_out = c
        if o.cell_norm:
            c = self._norm(c, "new_c")
            c_out = c if o.cell_norm_in_output else c_out
        h = tf.sigmoid(gates["o"]) * tf.tanh(c_out)
        if o.hidden_norm:
            h = self._norm(h, "new_h")
        return c, h

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool,
                 seed: tf.Tensor | None = None) -> tf.Tensor:
        x = tf.cast(x, tf.float32)  # tf_amp: the recurrence stays float32, as for the plain LSTM units
        if self.direction == -1:
            x = tf.reverse_sequence(x, lengths, seq_axis=0, batch_axis=1)
        batch = tf.shape(x)[1]
        mask_j, mask_h = self.dropout_masks(seed, batch, training)
        zeros = tf.zeros(tf.stack([batch, self.n_out]))
        _, h = tf.scan(lambda state, below: self.step(state, below, mask_j, mask_h),
                       self.transformed_input(x), initializer=(zeros, zeros))
        if self.direction == -1:
            h = tf.reverse_sequence(h, lengths, seq_axis=0, batch_axis=1)
        # RETURNN's output is 0 past each sequence's end
        return tf.cast(time_mask(h, lengths), self.compute_dtype)
