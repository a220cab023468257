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

from engine.model.layers.base import Layer
from engine.model.losses.regularization import l2_factor
from engine.model.rec.frames import Template, Value
from engine.model.rec.loop_run import LoopRun, topological
from engine.model.rec.search import BEAM_KEYS, BeamSearch, choice_options
from engine.model.rec.step_layers import GenericAttention, LinearUnit, UnitContext, UnitLayer
from engine.model.rec.step_select import STEP, Switch
from engine.model.rec.step_state import LastHiddenState
from engine.model.rec.templates import unit_class, unit_templates
from engine.model.rec.unit import LoopPlan, Ref, max_len_layers, parse_unit, plan_loop
from engine.model.rec.unit_options import SWITCH_OPTIONS
from engine.model.rec.unit_subnetwork import subnetwork_loads
from engine.runtime import log
from engine.runtime.errors import ConfigError, DataError


class RecSubnet(Layer):
    """The ``rec`` layer of a network whose ``unit`` is a dict of layers."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, base: dict[str, Template], *, target_dims: dict[str, int],
                 random_seed: int, config: Any = None, source: Template | None = None) -> None:
        """``source``: one frame of the rec layer's input (its sources concatenated), which the loop runs
        over (``data:source``); None: the loop runs over the labels of its choice's target."""
        self.spec = parse_unit(name, opts["unit"])
        self.load_on_init = subnetwork_loads(opts["unit"])  # subnetwork layer -> checkpoint
        self.read_outside: set[str] = set()  # unit layers read as "<rec>/<layer>" (outside.py)
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
        self._check_states_in_loop(self.plan, search=False)
        for line in self.plan.log_lines(name, search=False, training=True):
            log.info(line)

    def _build(self, name: str) -> UnitLayer:
        layer = self.spec[name]
        sources = [self._template(ref) for ref in layer.sources]
        if layer.opts.get("dropout") and any(s.sparse for s in sources):
            raise ConfigError(f"{self.ctx.where(name)}: 'dropout' on class ids (a sparse source such as the "
                              "choice's labels) is not implemented; put it on a layer of features.")
        cls = unit_class(layer)
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
        if layer.cls == "switch":  # its template may have been derived from one branch
            found = Switch.switch_template(name, *(self._template(layer.options[k]) for k in SWITCH_OPTIONS),
                                           self.ctx)
            if found != self.templates[name]:
                raise ConfigError(f"{self.ctx.where(name)}: switch's branches give {found.describe()}, but "
                                  f"the unit's layers read it as {self.templates[name].describe()}.")
        if layer.cls == "generic_attention":
            return GenericAttention(name, layer.opts, sources, self.templates[name], self.ctx,
                                    self._template(layer.options["weights"]),
                                    self._template(layer.options["base"]))
        return cls(name, layer.opts, sources, self.templates[name], self.ctx)

    def _check_states_in_loop(self, plan: LoopPlan, search: bool) -> None:
        """A cell's state exists only step by step: a get_last_hidden_state that nothing in the loop reads
        would be moved out of it, where RETURNN hands it the cell's stacked outputs instead."""
        moved = [n for n in plan.inputs_moved_out + plan.outputs_moved_out
                 if self.spec[n].cls == "get_last_hidden_state"]
        if moved:
            raise ConfigError(f"Network layer '{self.layer_name}': get_last_hidden_state layers {moved} are "
                              "read by no layer of the loop, so the move-out optimisation would run them "
                              "outside it, where no cell state exists: not implemented (read them in the "
                              "loop, or set optimize_move_layers_out False).")
        if not self.optimize:
            return
        # RETURNN moves a cell that no recurrence of the loop reads out of it, where its state is the one
        # after the sequence's last frame: a get_last_hidden_state of it then differs from the step's state
        returnn_plan = plan_loop(self.spec, search=search, cells_stay=False)
        outside = set(returnn_plan.inputs_moved_out + returnn_plan.outputs_moved_out)
        for name in plan.in_loop:
            if self.spec[name].cls == "get_last_hidden_state":
                cells = [r.name for r in self.spec[name].sources if r.name in outside]
                if cells:
                    raise ConfigError(
                        f"Network layer '{self.layer_name}', unit layer '{name}': RETURNN's plan moves the "
                        f"cell(s) {cells} out of the loop (no recurrence of the loop reads them), where "
                        "get_last_hidden_state gives the state after each sequence's last frame; this "
                        "engine runs cells step by step only: not implemented. Feed the cell from a "
                        "previous step ('prev:...') to keep it in the loop.")

    def _template(self, ref: Ref) -> Template:
        if ref.kind == "step":
            return STEP
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
        """Unit layer name -> the object of each unit layer with a loss (``loss``, ``target``,
        ``criterion``, ``only_on_eval`` as the network's loss layers have them): a softmax's, an eval."""
        return {name: unit.dense if isinstance(unit, LinearUnit) else unit
                for name, unit in self.units.items() if unit.opts.get("loss")}

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
        divided by length with ``decide_by_length``) and their scores (``<rec>:scores``), and the final beam
        (``<rec>:beam`` (B, K, L), ``<rec>:beam_lengths``, ``<rec>:beam_scores`` (B, K)). ``source``: the
        rec layer's input (time-major, its lengths) for a loop over its frames: then the output is the unit's
        ``output`` on every frame, (T, B, F), with the input's lengths."""
        if search and self.choice:
            return self._search(base, decide_by_length)
        if source is not None:  # a loop over the input frames
            run = LoopRun(self, base, training, seed, source)
            return run.train(tf.cast(source[1], tf.int32))
        if not streams or self.target not in streams:
            raise DataError(f"Network layer '{self.layer_name}': the decoder loop runs over the labels of "
                            f"target {self.target!r}, which this run does not read (search, which runs "
                            "without them, is not implemented yet).")
        ids = tf.cast(streams[self.target], tf.int32)
        lengths = tf.cast(stream_lengths[self.target], tf.int32)
        run = LoopRun(self, base, training, seed)
        run.values["output"] = Value(ids, self.templates["output"], looped=True)
        return run.train(lengths)

    def _search(self, base: dict[str, tuple[tf.Tensor, tf.Tensor]],
                decide_by_length: bool) -> tuple[tf.Tensor, tf.Tensor, dict[str, tf.Tensor]]:
        plan = plan_loop(self.spec, search=True, optimize=self.optimize)
        self._check_states_in_loop(plan, search=True)
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
        run = LoopRun(self, tiled, False, tf.constant([0, 0], tf.int64))
        run.rows = batch * beam
        loop = topological(self.spec, plan.in_loop + plan.inputs_moved_out)
        (hyps, lengths, scores), beam = BeamSearch(run, loop, batch, beam, max_len).search(decide_by_length)
        extras = {f"{self.layer_name}:{key}": value for key, value in zip(BEAM_KEYS, beam)}
        return tf.transpose(hyps), lengths, {f"{self.layer_name}:scores": scores, **extras}

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
