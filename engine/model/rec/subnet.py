"""RETURNN's ``rec`` layer with a subnetwork ``unit``: a decoder that runs once per output label.

In training (and scoring) the loop runs over the target's labels, ``choice`` being the target. The plan
(``unit.py``) splits the unit in three: the layers moved in front run on all steps at once before the
loop (``prev:x`` of such a layer is x shifted by one step, ``initial_output`` first), the layers left in
the loop run step by step in a ``tf.while_loop`` (carrying the previous step of every layer something
reads as ``prev:``, and an LSTM cell's state), and the layers moved behind run on all steps after it.
The rec layer's output is its ``output`` layer's (B, L) class ids; the unit's loss layers come back as
``<rec>/<layer>:logits`` and ``:lengths`` for the network's losses. A rec layer with sources instead
loops over their frames (``data:source`` is the frame), and its output is the unit's dense ``output`` on
every frame.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from engine.model.dropout import stateless_dropout
from engine.model.layers.base import Layer
from engine.model.losses.regularization import l2_factor
from engine.model.rec.frames import Template, Value, loose_batch, step_slice
from engine.model.rec.search import BeamSearch, choice_options
from engine.model.rec.step_layers import GenericAttention, LinearUnit, UnitContext, UnitLayer
from engine.model.rec.step_state import LastHiddenState, VariableUnit
from engine.model.rec.templates import UNIT_CLASSES, unit_templates
from engine.model.rec.unit import LoopPlan, Ref, max_len_layers, parse_unit, plan_loop
from engine.runtime import log
from engine.runtime.errors import ConfigError, DataError

OWN_DRAWS = 1 << 20  # folded into a layer's seed for its own draws (its inputs' dropout folds 0, 1, ...)


def _own_draws(seed: tf.Tensor | None) -> tf.Tensor | None:
    """The seed of a layer's own draws (a self_attention's attention_dropout); None outside training."""
    return None if seed is None else tf.random.experimental.stateless_fold_in(seed, OWN_DRAWS)


def _topological(layers: dict, names: tuple[str, ...]) -> list[str]:
    """``names`` ordered so that each comes after the layers of ``names`` it reads in the same step."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or name not in names:
            return
        for ref in layers[name].sources + list(layers[name].options.values()):
            if ref.kind == "cur":
                visit(ref.name)
        order.append(name)

    for name in names:
        visit(name)
    return order


class RecSubnet(Layer):
    """The ``rec`` layer of a network whose ``unit`` is a dict of layers."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, base: dict[str, Template], *, target_dims: dict[str, int],
                 random_seed: int, config: Any = None, source: Template | None = None) -> None:
        """``source``: one frame of the rec layer's input (its sources concatenated), which the loop runs
        over (``data:source``); None: the loop runs over the labels of its choice's target."""
        self.spec = parse_unit(name, opts["unit"])
        super().__init__(0)
        self.layer_name = name
        if opts.get("cheating"):
            raise ConfigError(f"Network layer '{name}': 'cheating' (the target kept in the beam) is not "
                              "implemented.")
        self.ctx = UnitContext(name, target_dims, random_seed, config)
        self.base_templates = base
        self.source = source
        self.templates = unit_templates(self.spec, base, self.ctx, source)
        output = self.templates["output"]
        self.choice = self.spec["output"].cls == "choice"
        if self.choice and source is not None:
            raise ConfigError(f"Network layer '{name}': a choice in a loop over the rec layer's input frames "
                              "(a transducer's search) is not implemented; a decoder loop over labels has "
                              "'from': [].")
        if not self.choice and (source is None or output.axes or output.sparse):
            raise ConfigError(f"Network layer '{name}': its unit's 'output' is {output.describe()}; a loop "
                              "over labels needs a choice layer as 'output', a loop over input frames (the "
                              "rec layer's 'from') a dense output of one frame.")
        self.target = opts.get("target", self.spec["output"].opts.get("target")) if self.choice else None
        self.opts_max_seq_len = opts.get("max_seq_len")
        self.n_out = output.dim
        self.units: dict[str, UnitLayer] = {}
        for unit_name, layer in self.spec.items():
            if layer.cls == "choice":
                continue
            self.units[unit_name] = self._build(unit_name)
            params = self.units[unit_name].params
            if layer.opts.get("trainable", True) is False:  # kept at their initial or loaded values
                params.update({key: tf.Variable(var, trainable=False, name=var.name.split(":")[0])
                               for key, var in params.items()})
            factor = l2_factor(f"{name}/{unit_name}", layer.opts)
            for key, var in params.items():
                self.params[f"{unit_name}/{key}"] = var
                if factor:  # RETURNN adds a unit layer's constraints to the rec layer's
                    self.inner_l2[f"{unit_name}/{key}"] = factor
        self.optimize = opts.get("optimize_move_layers_out",
                                 config.bool("optimize_move_layers_out", True) if config else True)
        if not isinstance(self.optimize, bool):
            raise ConfigError(f"Network layer '{name}': optimize_move_layers_out must be True or False.")
        self.plan: LoopPlan = plan_loop(self.spec, search=False, optimize=self.optimize)
        self._check_states_in_loop(self.plan)
        for line in self.plan.log_lines(name, search=False, training=True):
            log.info(line)

    def _build(self, name: str) -> UnitLayer:
        layer = self.spec[name]
        sources = [self._template(ref) for ref in layer.sources]
        if layer.opts.get("dropout") and any(s.sparse for s in sources):
            raise ConfigError(f"{self.ctx.where(name)}: 'dropout' on class ids (a sparse source such as the "
                              "choice's labels) is not implemented; put it on a layer of features.")
        cls = UNIT_CLASSES[layer.cls]
        if layer.cls == "get_last_hidden_state":
            cells = [ref.name for ref in layer.sources
                     if ref.kind in ("cur", "prev") and self.spec[ref.name].cls == "rnn_cell"]
            if not cells or len(cells) < len(layer.sources):
                raise ConfigError(f"{self.ctx.where(name)}: get_last_hidden_state reads the state of "
                                  "rnn_cell layers of the unit (as 's' or 'prev:s'; RETURNN's rec layers "
                                  "give none of a previous step); its 'from' "
                                  f"{[str(r) for r in layer.sources]} names other layers.")
            return LastHiddenState(name, layer.opts, sources, self.templates[name], self.ctx,
                                   [self.templates[c].dim for c in cells])
        if layer.cls == "generic_attention":
            return GenericAttention(name, layer.opts, sources, self.templates[name], self.ctx,
                                    self._template(layer.options["weights"]),
                                    self._template(layer.options["base"]))
        return cls(name, layer.opts, sources, self.templates[name], self.ctx)

    def _check_states_in_loop(self, plan: LoopPlan) -> None:
        """A cell's state exists only step by step: a get_last_hidden_state that nothing in the loop reads
        would be moved out of it, where RETURNN hands it the cell's stacked outputs instead."""
        moved = [n for n in plan.inputs_moved_out + plan.outputs_moved_out
                 if self.spec[n].cls == "get_last_hidden_state"]
        if moved:
            raise ConfigError(f"Network layer '{self.layer_name}': get_last_hidden_state layers {moved} are "
                              "read by no layer of the loop, so the move-out optimisation would run them "
                              "outside it, where no cell state exists: not implemented (read them in the "
                              "loop, or set optimize_move_layers_out False).")

    def _template(self, ref: Ref) -> Template:
        if ref.kind == "base":
            return self.base_templates[ref.name]
        if ref.kind == "data":  # unit_templates has refused it where the rec layer has no sources
            return self.source
        return self.templates[ref.name]

    @property
    def base_layers(self) -> list[str]:
        """The network's layers the unit reads (``base:``, and those ``max_seq_len`` names)."""
        return sorted({r.name for layer in self.spec.values()
                       for r in layer.sources + list(layer.options.values()) if r.kind == "base"}
                      | set(max_len_layers(self.opts_max_seq_len)))

    @property
    def loss_units(self) -> dict[str, Any]:
        """Unit layer name -> the softmax object of each unit layer with a loss (``loss``, ``target``,
        ``criterion``, ``only_on_eval`` as the network's loss layers have them)."""
        return {name: unit.dense for name, unit in self.units.items()
                if isinstance(unit, LinearUnit) and unit.opts.get("loss")}

    def split_info(self, key: str) -> list[list[int]] | None:
        """How RETURNN splits the unit parameter ``key`` ("<unit layer>/<name>") into blocks when its
        pretraining copies a subset: a linear layer's weights by source and output (None: one block, as
        RETURNN sets none for TensorFlow's LSTM cell)."""
        layer, _, param = key.partition("/")
        unit = self.units.get(layer)
        if isinstance(unit, LinearUnit) and param == "W" and not unit.dense.sparse_input:
            return [[s.dim for s in unit.sources], [unit.template.dim]]
        return None

    # ----- running -----
    def run(self, base: dict[str, tuple[tf.Tensor, tf.Tensor]], streams: dict[str, tf.Tensor] | None,
            stream_lengths: dict[str, tf.Tensor] | None, training: bool,
            seed: tf.Tensor, search: bool = False, decide_by_length: bool = False,
            source: tuple[tf.Tensor, tf.Tensor] | None = None) -> tuple[tf.Tensor, tf.Tensor, dict]:
        """``base``: layer -> (its time-major output, its lengths). Returns the output's (L, B) ids, their
        lengths (B,), and the unit layers' outputs (batch-major, ``<rec>/<layer>``; loss layers also
        ``:logits`` and ``:lengths``). With ``search``: the beam search's decided hypotheses (by score,
        divided by length with ``decide_by_length``) and their scores (``<rec>:scores``). ``source``: the
        rec layer's input (time-major, its lengths) for a loop over its frames: then the output is the unit's
        ``output`` on every frame, (T, B, F), with the input's lengths."""
        if search and self.choice:
            return self._search(base, decide_by_length)
        if source is not None:  # a loop over the input frames
            run = _Run(self, base, training, seed, source)
            return run.train(tf.cast(source[1], tf.int32))
        if not streams or self.target not in streams:
            raise DataError(f"Network layer '{self.layer_name}': the decoder loop runs over the labels of "
                            f"target {self.target!r}, which this run does not read (search, which runs "
                            "without them, is not implemented yet).")
        ids = tf.cast(streams[self.target], tf.int32)
        lengths = tf.cast(stream_lengths[self.target], tf.int32)
        run = _Run(self, base, training, seed)
        run.values["output"] = Value(ids, self.templates["output"], looped=True)
        return run.train(lengths)

    def _search(self, base: dict[str, tuple[tf.Tensor, tf.Tensor]],
                decide_by_length: bool) -> tuple[tf.Tensor, tf.Tensor, dict[str, tf.Tensor]]:
        plan = plan_loop(self.spec, search=True, optimize=self.optimize)
        self._check_states_in_loop(plan)
        # the layers RETURNN moves in front (a variable, what reads only it or the encoder) give the same on
        # every step: the search computes them in its loop
        if plan.outputs_moved_out:
            raise ConfigError(f"Network layer '{self.layer_name}': in search, layers "
                              f"{list(plan.outputs_moved_out)} are read by no layer of the loop; running "
                              "them after the search loop is not implemented.")
        for line in plan.log_lines(self.layer_name, search=True, training=False):
            log.info(line)
        beam, _, _ = choice_options(self.ctx.where("output"), self.spec["output"].opts)
        batch = tf.shape(next(iter(base.values()))[0])[1]
        max_len = self._max_len(base)
        tiled = {name: (tf.repeat(x, beam, axis=1), tf.repeat(lengths, beam, axis=0))
                 for name, (x, lengths) in base.items()}
        run = _Run(self, tiled, False, tf.constant([0, 0], tf.int64))
        run.rows = batch * beam
        loop = _topological(self.spec, plan.in_loop + plan.inputs_moved_out)
        hyps, lengths, scores = BeamSearch(run, loop, batch, beam, max_len).search(decide_by_length)
        return tf.transpose(hyps), lengths, {f"{self.layer_name}:scores": scores}

    def _max_len(self, base: dict[str, tuple[tf.Tensor, tf.Tensor]]) -> tf.Tensor:
        """``max_seq_len``: an int, or RETURNN's string such as "max_len_from('base:encoder') * 2"."""
        value = self.opts_max_seq_len
        if isinstance(value, int) and not isinstance(value, bool):
            return tf.constant(value)
        if not isinstance(value, str):
            raise ConfigError(f"Network layer '{self.layer_name}': search needs 'max_seq_len' (an int or a "
                              f"string like \"max_len_from('base:encoder')\"), got {value!r}.")

        def max_len_from(name: str) -> tf.Tensor:
            layer = name[len("base:"):] if name.startswith("base:") else name
            return tf.reduce_max(base[layer][1])

        try:
            return tf.cast(eval(value, {"max_len_from": max_len_from, "tf": tf}), tf.int32)
        except Exception as exc:  # config text: name the layer and the string
            raise ConfigError(f"Network layer '{self.layer_name}': max_seq_len {value!r} failed: "
                              f"{exc}") from None


class _Run:
    """One call of a ``RecSubnet``: the values of its layers by name as they are computed."""

    def __init__(self, subnet: RecSubnet, base: dict[str, tuple[tf.Tensor, tf.Tensor]], training: bool,
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
            x = tf.transpose(x, [1, 0, *range(2, x.shape.rank)])
            template = subnet.base_templates[name]
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
        for name in _topological(self.net.spec, names):
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
        loop = [n for n in _topological(spec, plan.in_loop) if n not in self.values]
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
                or spec[n].opts.get("loss") or n == "output"]
        prev0 = {n: self._initial(n, batch) for n in read_prev}
        cells0 = {n: units[n].initial_state(batch) for n in cells}
        prev0, cells0 = tf.nest.map_structure(loose_batch, (prev0, cells0))
        arrays = {n: tf.TensorArray(tf.int32 if self.net.templates[n].sparse else tf.float32, size=steps)
                  for n in kept}
        logit_arrays = {n: tf.TensorArray(tf.float32, size=steps) for n in kept if self._is_softmax(n)}
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
        y, new_cells[name] = unit.step(inputs, cell_states[name])
        return Value(y, self.net.templates[name], looped=False)

    def _is_softmax(self, name: str) -> bool:
        return self.net.spec[name].cls == "softmax"
