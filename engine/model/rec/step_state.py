"""More unit layers of RETURNN's LSTM attention decoders: ``variable`` (a parameter of the unit, the same on
every step), ``get_last_hidden_state`` (an LSTM cell's state, not its output: ``step_cells.py``), and
``reduce`` over the features (an attention energy).

RETURNN's ``variable`` has no batch axis by default (``add_batch_axis`` False since November 2021, True
before; the change "should not have any influence on behavior", its commit says): here it is broadcast
over the batch either way, which computes the same values and the same gradient (the sum over the rows).
Its parameter is ``<rec>/rec/<layer>/<layer>``, as RETURNN's ``get_variable(name=layer)`` in the layer's
scope names it. ``get_last_hidden_state`` of ``prev:s`` is the cell's state before this step, of ``s`` the
state after it: for TensorFlow's LSTM cell the tuple (c, h), which RETURNN's key ``"*"`` concatenates.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.initializers import parse_initializer
from engine.model.layers.base import positive_int
from engine.model.layers.reduce import REDUCE_OPS
from engine.model.rec.frames import Template, Value
from engine.model.rec.step_layers import UnitContext, UnitLayer
from engine.runtime.errors import ConfigError

# RETURNN's state keys of one part of an LSTM's state tuple (c, h): by name or by position
_LSTM_STATE_POSITIONS = {"c": 0, "h": 1, 0: 0, 1: 1}


class VariableUnit(UnitLayer):
    """``variable``: a trainable vector, the same for every row and step (no sources)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        return Template((), opts["shape"][0])  # checked by unit_options

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        if sources:
            raise ConfigError(f"{ctx.where(name)}: a variable reads no sources (RETURNN's rule), got 'from' "
                              f"{opts.get('from')!r}.")
        init = parse_initializer(ctx.where(name), "init", opts.get("init", 0))
        self.params[name] = init.variable(f"{ctx.rec_name}/rec/{name}/{name}", (template.dim,),
                                          ctx.random_seed)

    def make(self, rows: tf.Tensor, steps: tf.Tensor | None) -> tf.Tensor:
        """The vector for ``rows`` rows, on ``steps`` steps at once (None: one step)."""
        shape = [rows] + ([] if steps is None else [steps]) + [self.template.dim]
        return tf.broadcast_to(self.params[self.name], tf.stack(shape))


class LastHiddenState(UnitLayer):
    """``get_last_hidden_state``: the state of one or more ``rnn_cell`` layers (``combine`` concat or add)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        return Template((), positive_int(ctx.where(name), opts, "n_out"))

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext, cell_dims: list[int] | None = None) -> None:
        super().__init__(name, opts, sources, template)
        where = ctx.where(name)
        self.key = opts.get("key", "*")
        self.combine = opts.get("combine", "concat")
        sizes = [n * (2 if self.key in ("*", "flat") else 1) for n in cell_dims or []]
        dim = sum(sizes) if self.combine == "concat" or len(sizes) == 1 else sizes[0]
        if self.combine == "add" and len(set(sizes)) > 1:
            raise ConfigError(f"{where}: combine 'add' needs states of one size, got {sizes}.")
        if dim != template.dim:
            raise ConfigError(f"{where}: n_out {template.dim} is not the size of the state it reads ({dim}: "
                              f"key {self.key!r} of cells of {cell_dims} units).")

    def from_states(self, states: list[tuple[tf.Tensor, tf.Tensor]]) -> tf.Tensor:
        """The cells' (c, h) states of this step, as the layer's output (B, n_out)."""
        parts = [tf.concat(state, -1) if self.key in ("*", "flat") else state[_LSTM_STATE_POSITIONS[self.key]]
                 for state in states]
        if len(parts) == 1:
            return parts[0]
        return tf.concat(parts, -1) if self.combine == "concat" else tf.add_n(parts)


class ReduceFeatures(UnitLayer):
    """``reduce`` over the feature axis with ``keep_dims`` (the energy of an attention with a learned
    vector: ``{"class": "reduce", "axes": "f", "mode": "sum", "keep_dims": True}``): dim 1, the axes kept
    (the options: ``unit_options``)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        if len(sources) != 1 or sources[0].sparse:
            raise ConfigError(f"{ctx.where(name)}: reduce takes one source of dense features here, got "
                              f"{[s.describe() for s in sources]}.")
        return Template(sources[0].axes, 1)

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        return REDUCE_OPS[self.opts["mode"].lower()](values[0].tensor, axis=-1, keepdims=True)


CLASSES: dict[str, type[UnitLayer]] = {"variable": VariableUnit, "get_last_hidden_state": LastHiddenState,
                                       "reduce": ReduceFeatures}
