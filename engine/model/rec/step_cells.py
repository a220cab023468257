"""The unit layers that carry an LSTM state from step to step (``STATEFUL_CLASSES``): ``rnn_cell`` and ``rec``
with an LSTM unit, one step at a time.

- ``rnn_cell`` with an LSTMBlock-like unit: TensorFlow's LSTMCell, as RETURNN runs LSTMBlock,
  LSTMBlockFused, StandardLSTM and BasicLSTM on one step (gates i, j, f, o, unit_opts forget_bias [1];
  parameters ``<rec>/rec/<layer>/rec/lstm_cell/kernel`` and ``.../bias``); unit ZoneoutLSTM is that cell
  with zoneout;
- ``rnn_cell`` with unit ``layernormvariantslstm``: RETURNN's LayerNormVariantsLSTMCell (``lstm_norm.py``);
- ``rec`` with an LSTM unit: RETURNN's NativeLstm2 on one frame (RETURNN adds a time axis of 1 and takes the
  previous step's state as initial state): parameters ``<rec>/rec/<layer>/rec/W`` (in, 4n), ``.../W_re``
  (n, 4n), ``.../b``, gates (cell input, input, forget, output), no forget bias, state (c, h). TensorFlow
  2's RETURNN maps lstm, lstmp, LSTMBlock and LSTMBlockFused there to NativeLstm2.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.dropout import stateless_dropout
from engine.model.initializers import option_variable
from engine.model.layers.base import positive_int
from engine.model.layers.lstm_norm import NormLstmRec
from engine.model.layers.recurrent import initializers
from engine.model.rec.frames import Template, Value
from engine.model.rec.step_layers import UnitContext, UnitLayer
from engine.model.rec.unit_options import (LSTM_CELL_UNITS, ZONEOUT_UNIT, lstm_cell_forget_bias,
                                           zoneout_options)
from engine.runtime.errors import ConfigError


class LstmCell(UnitLayer):
    """``rnn_cell`` with an LSTMBlock-like unit: TensorFlow's LSTMCell on one step, state (c, h)
    (``unit_options.check_options`` has checked the unit). Unit ZoneoutLSTM (RETURNN's ZoneoutLSTMCell)
    then zones c and h out with their ``zoneout_factor_cell`` / ``_output`` z: in training each unit keeps
    its previous value at probability z (RETURNN: (1 - z) * dropout(new - prev, keep 1 - z) + prev),
    otherwise (1 - z) * new + z * prev; the output is the LSTM's own h unless ``use_zoneout_output``."""

    stateful = True

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        return Template((), positive_int(ctx.where(name), opts, "n_out"))

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        if any(s.axes or s.sparse for s in sources):
            raise ConfigError(f"{ctx.where(name)}: {opts['class']} takes dense sources of one step without "
                              f"time axes, got {[s.describe() for s in sources]}.")
        self.make_params(name, opts, sum(s.dim for s in sources), template.dim, ctx)
        zoneout = opts["class"] == "rnn_cell" and str(opts.get("unit")).lower() == ZONEOUT_UNIT
        self.zoneout = zoneout_options(ctx.where(name), opts.get("unit_opts")) if zoneout else None
        plain = opts["class"] == "rnn_cell" and str(opts.get("unit")).lower() in LSTM_CELL_UNITS
        self.forget_bias = lstm_cell_forget_bias(ctx.where(name), opts.get("unit_opts")) if plain else 1.0
        self.training, self.seed = False, None  # set by the loop before each step

    def make_params(self, name: str, opts: dict, in_dim: int, n: int, ctx: UnitContext) -> None:
        prefix = f"{ctx.rec_name}/rec/{name}/rec/lstm_cell"
        # RETURNN's rnn_cell: TF's glorot_uniform over the whole [input; recurrent] kernel, zero bias
        self.params["rec/lstm_cell/kernel"] = option_variable(
            ctx.where(name), {}, "forward_weights_init", f"{prefix}/kernel", (in_dim + n, 4 * n),
            ctx.random_seed)
        self.params["rec/lstm_cell/bias"] = tf.Variable(tf.zeros([4 * n]), name=f"{prefix}/bias")

    def initial_state(self, batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        zeros = tf.zeros(tf.stack([batch, self.template.dim]))
        return zeros, zeros

    def step(self, values: list[Value], state: tuple[tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, tuple]:
        c, h = state
        x = tf.concat([v.tensor for v in values] + [h], axis=-1)
        gates = tf.matmul(x, self.params["rec/lstm_cell/kernel"]) + self.params["rec/lstm_cell/bias"]
        i, j, f, o = tf.split(gates, 4, axis=-1)
        new_c = tf.sigmoid(f + self.forget_bias) * c + tf.sigmoid(i) * tf.tanh(j)
        new_h = tf.sigmoid(o) * tf.tanh(new_c)
        if self.zoneout is None:
            return new_h, (new_c, new_h)
        cell, output, use_output = self.zoneout
        zoned_c, zoned_h = self._zoned(c, new_c, cell, 0), self._zoned(h, new_h, output, 1)
        return zoned_h if use_output else new_h, (zoned_c, zoned_h)

    def _zoned(self, prev: tf.Tensor, new: tf.Tensor, factor: float, part: int) -> tf.Tensor:
        if not factor:
            return new
        if self.training:
            seed = tf.random.experimental.stateless_fold_in(self.seed, part)
            return (1.0 - factor) * stateless_dropout(new - prev, factor, seed) + prev
        return (1.0 - factor) * new + factor * prev


class NormLstmCell(LstmCell):
    """``rnn_cell`` with unit ``layernormvariantslstm``: RETURNN's LayerNormVariantsLSTMCell on one step
    (``layers/lstm_norm.py`` computes it; parameters ``<rec>/rec/<layer>/rec/<RETURNN's name>``). Its
    dropout masks are drawn once per loop in training (``call_seed``, set by the loop), the same at every
    step, as RETURNN draws them outside its loop."""

    def make_params(self, name: str, opts: dict, in_dim: int, n: int, ctx: UnitContext) -> None:
        cell_opts = {key: opts[key] for key in ("unit", "unit_opts", "forward_weights_init",
                                                "recurrent_weights_init") if key in opts}
        self.cell = NormLstmRec(f"{ctx.rec_name}/rec/{name}/rec", {**cell_opts, "n_out": n}, in_dim,
                                random_seed=ctx.random_seed)
        self.params = {f"rec/{key}": variable for key, variable in self.cell.params.items()}
        self.call_seed = None

    def step(self, values: list[Value], state: tuple[tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, tuple]:
        x = tf.concat([v.tensor for v in values], axis=-1)
        mask_j, mask_h = self.cell.dropout_masks(self.call_seed, tf.shape(x)[0], self.training)
        c, h = self.cell.step(state, self.cell.transformed_input(x), mask_j, mask_h)
        return h, (c, h)


class NativeLstmStep(LstmCell):
    """``rec`` with an LSTM unit inside a unit: one NativeLstm2 step, state (c, h)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        return Template((), positive_int(ctx.where(name), opts, "n_out"))  # the unit: unit_options

    def make_params(self, name: str, opts: dict, in_dim: int, n: int, ctx: UnitContext) -> None:
        prefix = f"{ctx.rec_name}/rec/{name}/rec"
        forward, recurrent, bias = initializers(ctx.where(name), opts, opts["unit"].lower())
        self.params["rec/W"] = forward.variable(f"{prefix}/W", (in_dim, 4 * n), ctx.random_seed)
        self.params["rec/W_re"] = recurrent.variable(f"{prefix}/W_re", (n, 4 * n), ctx.random_seed)
        self.params["rec/b"] = bias.variable(f"{prefix}/b", (4 * n,), ctx.random_seed)

    def step(self, values: list[Value], state: tuple[tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, tuple]:
        c, h = state
        x = tf.concat([v.tensor for v in values], axis=-1)
        gates = (tf.matmul(x, self.params["rec/W"]) + tf.matmul(h, self.params["rec/W_re"])
                 + self.params["rec/b"])
        cell_in, gate_in, forget, gate_out = tf.split(gates, 4, axis=-1)
        c = tf.sigmoid(gate_in) * tf.tanh(cell_in) + tf.sigmoid(forget) * c
        h = tf.sigmoid(gate_out) * tf.tanh(c)
        return h, (c, h)


CLASSES: dict[str, type[UnitLayer]] = {"rnn_cell": LstmCell, "rec": NativeLstmStep}
