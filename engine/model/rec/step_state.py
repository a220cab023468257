"""Unit layers whose output is not computed from their sources' outputs: ``variable`` (a parameter of the
unit, the same on every step) and ``get_last_hidden_state`` (an ``rnn_cell``'s state, not its output);
and ``reduce`` over the features, which RETURNN's LSTM attention decoders use for their energies.

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
from engine.model.rec.frames import Template, Value
from engine.model.rec.step_layers import UnitContext, UnitLayer
from engine.runtime.errors import ConfigError

# RETURNN's state keys of TensorFlow's LSTMStateTuple (c, h): by name, by position, or all concatenated
_LSTM_STATE_KEYS = {"c": 0, "h": 1, 0: 0, 1: 1}


class VariableUnit(UnitLayer):
    """``variable``: a trainable vector, the same for every row and step (no sources)."""

    sourceless = True

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        shape = opts.get("shape")
        if (not isinstance(shape, (list, tuple)) or len(shape) != 1 or isinstance(shape[0], bool)
                or not isinstance(shape[0], int) or shape[0] < 1):
            raise ConfigError(f"{ctx.where(name)}: variable 'shape' {shape!r} is not implemented inside a "
                              "rec unit here: one positive feature size, such as [1] or [512], is (the "
                              "shapes of RETURNN's published setups).")
        if opts.get("add_time_axis") or opts.get("dtype", "float32") != "float32":
            raise ConfigError(f"{ctx.where(name)}: variable with add_time_axis or a dtype other than float32 "
                              "is not implemented inside a rec unit here.")
        if not isinstance(opts.get("add_batch_axis", False), bool):
            raise ConfigError(f"{ctx.where(name)}: add_batch_axis must be True or False.")
        return Template((), shape[0])

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

    reads_state = True

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        return Template((), positive_int(ctx.where(name), opts, "n_out"))

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext, cell_dims: list[int] | None = None) -> None:
        super().__init__(name, opts, sources, template)
        where = ctx.where(name)
        self.key = opts.get("key", "*")
        self.combine = opts.get("combine", "concat")
        if self.key not in ("*", "flat") and self.key not in _LSTM_STATE_KEYS:
            raise ConfigError(f"{where}: key {self.key!r} is not a state of an LSTM cell (c, h): RETURNN "
                              "takes '*' or 'flat' (both concatenated), 'c', 'h', 0 or 1.")
        if self.combine not in ("concat", "add"):
            raise ConfigError(f"{where}: combine {self.combine!r}: RETURNN takes 'concat' or 'add'.")
        if opts.get("dropout"):
            raise ConfigError(f"{where}: 'dropout' would apply to its sources' outputs, which this layer "
                              "does not read (it reads their state): RETURNN drops nothing here, so it is "
                              "refused.")
        sizes = [n * (2 if self.key in ("*", "flat") else 1) for n in cell_dims or []]
        dim = sum(sizes) if self.combine == "concat" or len(sizes) == 1 else sizes[0]
        if self.combine == "add" and len(set(sizes)) > 1:
            raise ConfigError(f"{where}: combine 'add' needs states of one size, got {sizes}.")
        if dim != template.dim:
            raise ConfigError(f"{where}: n_out {template.dim} is not the size of the state it reads ({dim}: "
                              f"key {self.key!r} of cells of {cell_dims} units).")

    def from_states(self, states: list[tuple[tf.Tensor, tf.Tensor]]) -> tf.Tensor:
        """The cells' (c, h) states of this step, as the layer's output (B, n_out)."""
        parts = [tf.concat(state, -1) if self.key in ("*", "flat") else state[_LSTM_STATE_KEYS[self.key]]
                 for state in states]
        if len(parts) == 1:
            return parts[0]
        return tf.concat(parts, -1) if self.combine == "concat" else tf.add_n(parts)


_REDUCE_MODES = {"sum": tf.reduce_sum, "max": tf.reduce_max, "min": tf.reduce_min, "mean": tf.reduce_mean,
                 "avg": tf.reduce_mean, "logsumexp": tf.reduce_logsumexp}
_FEATURE_AXES = ("f", "F", "feature", "dim")


class ReduceFeatures(UnitLayer):
    """``reduce`` over the feature axis with ``keep_dims`` (the energy of an attention with a learned
    vector: ``{"class": "reduce", "axes": "f", "mode": "sum", "keep_dims": True}``): dim 1, the axes kept."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        axes = opts.get("axes", opts.get("axis"))
        axes = axes[0] if isinstance(axes, (list, tuple)) and len(axes) == 1 else axes
        if axes not in _FEATURE_AXES or opts.get("keep_dims") is not True or len(sources) != 1:
            raise ConfigError(f"{ctx.where(name)}: reduce inside a rec unit is implemented over the feature "
                              f"axis of one source with keep_dims True (axes 'f'); got axes {axes!r}, "
                              f"keep_dims {opts.get('keep_dims')!r}: without keep_dims RETURNN makes another "
                              "axis the feature, which the unit's templates do not follow.")
        if str(opts.get("mode", "")).lower() not in _REDUCE_MODES:
            raise ConfigError(f"{ctx.where(name)}: reduce mode {opts.get('mode')!r}: implemented "
                              f"{', '.join(_REDUCE_MODES)}.")
        if opts.get("n_out", 1) != 1 or sources[0].sparse:
            raise ConfigError(f"{ctx.where(name)}: reduce over the features of dense features gives dim 1, "
                              f"got n_out {opts.get('n_out')!r} on {sources[0].describe()}.")
        return Template(sources[0].axes, 1)

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        return _REDUCE_MODES[self.opts["mode"].lower()](values[0].tensor, axis=-1, keepdims=True)


CLASSES: dict[str, type[UnitLayer]] = {"variable": VariableUnit, "get_last_hidden_state": LastHiddenState,
                                       "reduce": ReduceFeatures}
