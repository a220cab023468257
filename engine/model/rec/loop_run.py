"""One call of a ``RecSubnet`` (``subnet.py``): the values of its unit's layers as they are computed, in
front of the loop on all steps at once, in the ``tf.while_loop`` step by step (with the previous step of
what ``prev:`` reads and the cells' states), and behind it; ``search.py`` runs the same layers per step of
a beam search.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from engine.model.dropout import stateless_dropout
from engine.model.rec.frames import Template, Value, loose_batch, step_slice
from engine.model.rec.step_select import all_steps_value, step_value
from engine.model.rec.step_layers import EvalUnit, LinearUnit
from engine.model.rec.step_state import LastHiddenState, VariableUnit
from engine.model.rec.unit import Ref
from engine.runtime.errors import ConfigError

OWN_DRAWS = 1 << 20  # folded into a layer's seed for its own draws (its inputs' dropout folds 0, 1, ...)


def _own_draws(seed: tf.Tensor | None) -> tf.Tensor | None:
    """The seed of a layer's own draws (a self_attention's attention_dropout); None outside training."""
    return None if seed is None else tf.random.experimental.stateless_fold_in(seed, OWN_DRAWS)


def topological(layers: dict, names: tuple[str, ...]) -> list[str]:
    """``names`` ordered so that each comes after the layers of ``names`` it reads in the same step."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or name not in names:
            return
        for ref in layers[name].refs(training=False):
            if ref.kind == "cur":
                visit(ref.name)
        order.append(name)

    for name in names:
        visit(name)
    return order


class LoopRun:
    """One call of a ``RecSubnet``: the values of its layers by name as they are computed."""

    def __init__(self, subnet: Any, base: dict[str, tuple[tf.Tensor, tf.Tensor]], training: bool,
                 seed: tf.Tensor, source: tuple[tf.Tensor, tf.Tensor] | None = None) -> None:
        self.net = subnet
        self.source = None  # the rec layer's input, batch-major (B, T, F): ``data:source`` on every frame
        if source is not None:
            self.source = Value(tf.transpose(source[0], [1, 0, 2]), subnet.source, looped=True)
        self.training = training
        self.seed = seed
        self.base: dict[str, Value] = {}
        self.axis_lengths: dict[str, tf.Tensor] = {}
        self.axis_sizes: dict[str, tf.Tensor] = {}
        for name in subnet.base_layers:
            x, lengths = base[name]
            template = subnet.base_templates[name]
            if not template.axes or not template.axes[0].dynamic:  # a value per sequence
                self.base[name] = Value(x[0], template, looped=False)
                continue
            x = tf.transpose(x, [1, 0, *range(2, x.shape.rank)])
            self.base[name] = Value(x, template, looped=False)
            time = template.axes[0]
            if time.label in self.axis_lengths:  # the base layers a unit reads share their time axis
                tf.debugging.assert_equal(
                    lengths, self.axis_lengths[time.label], message=(
                        f"Network layer '{subnet.layer_name}': the base layers its unit reads must have the "
                        f"same frames, but base:{name}'s lengths differ from those of the others"))
            self.axis_lengths[time.label], self.axis_sizes[time.label] = lengths, tf.shape(x)[1]
        self.values: dict[str, Value] = {}  # computed on all steps (in front, behind, or stacked)
        self.rows: tf.Tensor | None = None  # the loop's rows (the batch, times the beam in a search)
        self.steps: tf.Tensor | None = None
        # what each loss layer's criterion reads: a softmax's logits, an eval's probabilities
        self.logits: dict[str, tf.Tensor] = {}

    def _initial(self, name: str, batch: tf.Tensor) -> tf.Tensor:
        """The layer's ``initial_output`` (its output "before" step 0), one step's shape."""
        template = self.net.templates[name]
        value = self.net.spec[name].opts.get("initial_output", 0)
        if value in (None, "zeros"):
            value = 0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{self.net.ctx.where(name)}: initial_output {value!r} is not implemented (a "
                              "number or 'zeros' is).")
        sizes = [self.axis_sizes[a.label] if a.dynamic else a.size for a in template.axes]
        shape = tf.stack([batch] + sizes + ([] if template.sparse else [template.dim]))
        dtype = tf.int32 if template.sparse else template.dtype
        return tf.fill(shape, tf.cast(value, dtype))

    def _shifted(self, name: str, value: Value, batch: tf.Tensor) -> Value:
        """``prev:`` of a layer computed on all steps: one step later, its initial output first."""
        first = tf.expand_dims(self._initial(name, batch), 1)
        return Value(tf.concat([first, value.tensor[:, :-1]], axis=1), value.template, looped=True)

    def _apply(self, name: str, inputs: list[Value], options: dict[str, Value], looped: bool,
               seed: tf.Tensor | None) -> Value:
        """``seed``: the layer's draws in training (None outside it)."""
        unit = self.net.units[name]
        rate = float(self.net.spec[name].opts.get("dropout", 0.0))
        if self.training and rate > 0.0:
            inputs = [self._dropout(v, rate, tf.random.experimental.stateless_fold_in(seed, i),
                                    getattr(unit, "full_noise", False)) for i, v in enumerate(inputs)]
        if hasattr(unit, "lengths"):
            unit.lengths = self.axis_lengths
        if hasattr(unit, "training"):
            unit.training = self.training
        if hasattr(unit, "seed"):  # its own draws (a self_attention's attention_dropout)
            unit.seed = _own_draws(seed)
        if isinstance(unit, VariableUnit):
            return Value(unit.make(self.rows, self.steps if looped else None), unit.template, looped)
        y = unit(inputs, looped, options)
        if isinstance(unit, LinearUnit) and unit.opts["class"] == "softmax":
            self.logits[name] = y
            y = tf.nn.softmax(y)
        elif isinstance(unit, EvalUnit) and unit.loss:  # its criterion reads the probabilities themselves
            self.logits[name] = y
        return Value(y, unit.template, looped)

    @staticmethod
    def _dropout(value: Value, rate: float, seed: tf.Tensor, full_noise: bool = False) -> Value:
        x = value.tensor  # dense: _build refuses dropout on a sparse source
        noise_shape = tf.concat([tf.ones([tf.rank(x) - 1], tf.int32), tf.shape(x)[-1:]], axis=0)
        noise_shape = tf.shape(x) if full_noise else noise_shape
        return Value(stateless_dropout(x, rate, seed, noise_shape),
                     value.template, value.looped)

    def _layer_seed(self, name: str) -> tf.Tensor:
        return tf.random.experimental.stateless_fold_in(self.seed, list(self.net.spec).index(name))

    def _all_steps(self, names: tuple[str, ...], batch: tf.Tensor) -> None:
        """Layers moved out of the loop, on all steps at once."""
        for name in topological(self.net.spec, names):
            if name in self.values:  # the choice: the target
                continue
            layer = self.net.spec[name]
            resolve = lambda ref: self._whole(ref, batch)  # noqa: E731
            self.values[name] = self._apply(name, [resolve(r) for r in layer.sources],
                                            {k: resolve(r) for k, r in layer.options.items()}, True,
                                            self._layer_seed(name) if self.training else None)

    def _whole(self, ref: Ref, batch: tf.Tensor) -> Value:
        if ref.kind == "base":
            return self.base[ref.name]
        if ref.kind == "step":  # a layer the plan moved behind the loop
            return all_steps_value(batch, self.steps)
        if ref.kind == "data":
            return self.source
        value = self.values[ref.name]
        return self._shifted(ref.name, value, batch) if ref.kind == "prev" else value

    def train(self, lengths: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, dict[str, tf.Tensor]]:
        plan, spec = self.net.plan, self.net.spec
        frames = self.values["output"] if self.net.choice else self.source  # what the loop runs over
        batch, steps = tf.shape(frames.tensor)[0], tf.shape(frames.tensor)[1]
        self.rows, self.steps = batch, steps
        self._all_steps(plan.inputs_moved_out, batch)
        # a choice is the target: never computed, also where the plan keeps it in the loop
        loop = [n for n in topological(spec, plan.in_loop) if n not in self.values]
        if loop:
            self._loop(loop, batch, steps)
        self._all_steps(plan.outputs_moved_out, batch)
        name = self.net.layer_name
        results = {}
        for unit_name, value in self.values.items():
            results[f"{name}/{unit_name}"] = value.tensor
            if unit_name in self.logits:
                results[f"{name}/{unit_name}:logits"] = self.logits[unit_name]
                results[f"{name}/{unit_name}:lengths"] = lengths
        output = self.values["output"].tensor
        return tf.transpose(output, [1, 0, *range(2, output.shape.rank)]), lengths, results

    def _loop(self, loop: list[str], batch: tf.Tensor, steps: tf.Tensor) -> None:
        spec, units = self.net.spec, self.net.units
        read_prev = sorted({r.name for n in loop for r in spec[n].sources + list(spec[n].options.values())
                            if r.kind == "prev" and r.name in loop})
        cells = [n for n in loop if units[n].stateful]
        # what the layers behind the loop read of the loop's layers (and the loss layers' logits)
        kept = [n for n in loop if any(r.name == n for m in self.net.plan.outputs_moved_out
                                       for r in spec[m].sources + list(spec[m].options.values()))
                or spec[n].opts.get("loss") or n == "output" or n in self.net.read_outside]
        prev0 = {n: self._initial(n, batch) for n in read_prev}
        cells0 = {n: units[n].initial_state(batch) for n in cells}
        prev0, cells0 = tf.nest.map_structure(loose_batch, (prev0, cells0))
        arrays = {n: tf.TensorArray(_array_dtype(self.net.templates[n]), size=steps) for n in kept}
        logit_arrays = {n: tf.TensorArray(tf.float32, size=steps) for n in kept if self._gives_loss_input(n)}
        # the layers moved in front, as the loop reads them (shifted once here, not at every step)
        outside = {(r.kind, r.name): self._whole(r, batch) for n in loop
                   for r in spec[n].sources + list(spec[n].options.values())
                   if r.kind == "data" or (r.kind in ("cur", "prev") and r.name not in loop)}

        def body(t, prev, cell_states, arrays, logit_arrays):
            frame: dict[str, Value] = {}
            new_cells: dict = {}

            def resolve(ref: Ref) -> Value:
                if ref.kind == "base":
                    return self.base[ref.name]
                if ref.kind == "step":
                    return step_value(batch, t)
                if ref.kind == "cur" and ref.name in frame:
                    return frame[ref.name]
                if ref.kind == "prev" and ref.name in prev:
                    return Value(prev[ref.name], self.net.templates[ref.name], looped=False)
                return step_slice(outside[(ref.kind, ref.name)], t)  # moved in front, or the input: step t

            for name in loop:
                frame[name] = self.step_layer(name, resolve, t, cell_states, new_cells)
            arrays = {n: a.write(t, frame[n].tensor) for n, a in arrays.items()}
            logit_arrays = {n: a.write(t, self.logits[n]) for n, a in logit_arrays.items()}
            return t + 1, {n: frame[n].tensor for n in prev}, new_cells, arrays, logit_arrays

        _, _, _, arrays, logit_arrays = tf.while_loop(
            lambda t, *_: t < steps, body, (tf.constant(0), prev0, cells0, arrays, logit_arrays))
        for name, array in arrays.items():
            stacked = array.stack()  # (L, B, ...)
            self.values[name] = Value(tf.transpose(stacked, [1, 0, *range(2, stacked.shape.rank)]),
                                      self.net.templates[name], looped=True)
        for name, array in logit_arrays.items():
            stacked = array.stack()
            self.logits[name] = tf.transpose(stacked, [1, 0, *range(2, stacked.shape.rank)])

    def step_layer(self, name: str, resolve: Any, t: tf.Tensor, cell_states: dict, new_cells: dict) -> Value:
        """Layer ``name`` at step ``t`` of the loop; ``resolve`` gives a reference's value at this step. An
        LSTM cell's new state goes into ``new_cells``."""
        layer, unit = self.net.spec[name], self.net.units[name]
        if isinstance(unit, LastHiddenState):  # before this step for prev:s, after it for s
            states = [cell_states[r.name] if r.kind == "prev" else new_cells[r.name] for r in layer.sources]
            return Value(unit.from_states(states), unit.template, looped=False)
        inputs = [resolve(r) for r in layer.sources]
        options = {k: resolve(r) for k, r in layer.options.items()}
        # no seeds outside training: in a search they were two random-number ops per layer and step
        seed = (tf.random.experimental.stateless_fold_in(self._layer_seed(name), tf.cast(t, tf.int64))
                if self.training else None)
        if not unit.stateful:
            return self._apply(name, inputs, options, False, seed)
        if self.training and layer.opts.get("dropout"):
            inputs = [self._dropout(v, float(layer.opts["dropout"]), seed) for v in inputs]
        if hasattr(unit, "seed"):  # its own draws (a self_attention's attention_dropout)
            unit.training = self.training
            unit.seed = _own_draws(seed)
        if hasattr(unit, "call_seed"):  # its own draws, the same at every step (variational masks)
            unit.call_seed = _own_draws(self._layer_seed(name)) if self.training else None
        y, new_cells[name] = unit.step(inputs, cell_states[name])
        return Value(y, self.net.templates[name], looped=False)

    def _gives_loss_input(self, name: str) -> bool:
        """A softmax (its logits) or an eval with a loss (its probabilities): ``self.logits``."""
        layer = self.net.spec[name]
        return layer.cls == "softmax" or (layer.cls == "eval" and bool(layer.opts.get("loss")))


def _array_dtype(template: Template) -> tf.DType:
    """How a layer's steps are kept: a compare's as bool, class ids as int32, features as float32."""
    if template.dtype == tf.bool:
        return tf.bool
    return tf.int32 if template.sparse else tf.float32
