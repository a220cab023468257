"""More unit layers of RETURNN's LSTM attention decoders: ``variable`` (a parameter of the unit, the same on
every step), ``get_last_hidden_state`` (an LSTM cell's state, not its output: ``step_cells.py``), and
``reduce`` over the features (an attention energy) or over the time axis of the base layers (a coverage).

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
from engine.model.layers.reduce import MASKED, REDUCE_OPS
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


class ReduceTime(UnitLayer):
    """``reduce`` over the time axis of its source (a base layer's frames, the one dynamic axis: the
    coverage of 2019-asr-e2e-trafo-vs-lstm's decoders, ``{"class": "reduce", "axes": "t", "mode": "sum"}``)
    over each sequence's valid frames, without ``keep_dims`` (RETURNN's default): that axis goes."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        dynamic = [a for a in sources[0].axes if a.dynamic] if len(sources) == 1 else []
        if len(sources) != 1 or sources[0].sparse or not dynamic:
            raise ConfigError(f"{ctx.where(name)}: reduce over time takes one source of dense features with "
                              f"a time axis here, got {[s.describe() for s in sources]}.")
        return Template(tuple(a for a in sources[0].axes if not a.dynamic), sources[0].dim)

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        self.axis = next(a for a in sources[0].axes if a.dynamic)
        self.mode = opts["mode"].lower()
        self.lengths: dict[str, tf.Tensor] = {}  # set per call by the unit: axis label -> (B,)

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        value = values[0]
        x = value.tensor
        axis = value.axis_position(self.axis.label)
        lengths = self.lengths[self.axis.label]
        valid = tf.sequence_mask(lengths, tf.shape(x)[axis])  # (B, T)
        valid = tf.reshape(valid, tf.stack([tf.shape(x)[i] if i in (0, axis) else 1
                                            for i in range(x.shape.rank)]))
        fill = {"max": x.dtype.min, "min": x.dtype.max}.get(self.mode, 0.0)
        y = MASKED[self.mode](tf.where(valid, x, tf.cast(fill, x.dtype)), axis=axis)
        if self.mode in ("avg", "mean"):
            counts = tf.cast(tf.maximum(lengths, 1), x.dtype)
            y /= tf.reshape(counts, [-1] + [1] * (y.shape.rank - 1))
        return y


CLASSES: dict[str, type[UnitLayer]] = {"variable": VariableUnit, "get_last_hidden_state": LastHiddenState,
                                       "reduce": ReduceFeatures}
