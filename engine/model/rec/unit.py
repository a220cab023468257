"""A ``rec`` layer's subnetwork ``unit`` as data, and RETURNN's plan of which of its layers run in the loop.

Inside the unit a layer names its sources as RETURNN does: ``x`` (layer x of the unit at this step),
``prev:x`` (x at the step before; its ``initial_output`` at step 0), ``base:x`` (layer x of the network
around the rec layer, whole sequences), ``data:source`` (the rec layer's input frame) and ``:i`` (the
step). No TensorFlow here: ``rnn.py --check`` plans without building.

The plan follows RETURNN's optimisation (``_SubnetworkRecCell._move_outside_loop``, RETURNN 1.2026): every
layer the needed outputs depend on (through current or previous steps) starts in the loop; then layers
nothing else in the loop reads are moved behind it ("output layers moved out"), greedily, and layers that
read nothing in the loop are moved in front ("input layers moved out"), alternating until neither
applies. In training a ``choice`` layer is the target, reads nothing, and so moves in front; in search it
stays in the loop, with everything that depends on it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from engine.model.losses import check_loss_name, check_loss_only_on_non_search, check_loss_opts
from engine.model.rec.unit_options import STEP_READERS, SWITCH_OPTIONS, check_options, explicit_search_sources
from engine.model.rec.unit_subnetwork import flatten_subnetworks
from engine.runtime import log
from engine.runtime.errors import ConfigError

# classes of the unit, with the options each takes beyond the common ones (engine/model/rec/step_layers.py)
UNIT_CLASS_OPTIONS: dict[str, set[str]] = {
    "choice": {"target", "beam_size", "input_type", "initial_output", "length_normalization",
               "explicit_search_source", "explicit_search_sources", "custom_score_combine", "cheating"},
    "compare": {"kind", "value", "initial_output"},
    "linear": {"n_out", "activation", "with_bias", "forward_weights_init", "bias_init", "initial_output",
               "use_transposed_weights"},
    "softmax": {"n_out", "target", "loss", "loss_scale", "loss_opts", "with_bias", "forward_weights_init",
                "bias_init", "initial_output", "use_transposed_weights", "loss_only_on_non_search"},
    "combine": {"kind", "n_out", "initial_output"},
    "activation": {"activation", "initial_output"},
    "copy": {"initial_output"},
    "softmax_over_spatial": {"energy_factor", "initial_output"},
    "generic_attention": {"weights", "base", "initial_output"},
    "merge_dims": {"axes", "keep_order", "initial_output"},
    "split_dims": {"axis", "dims", "initial_output"},
    "rnn_cell": {"unit", "n_out", "initial_output", "unit_opts"},  # step_cells.py
    "reduce_out": {"mode", "num_pieces", "initial_output"},
    "eval": {"eval", "out_type", "n_out", "initial_output", "loss", "target", "loss_scale"},
    # the Transformer decoder's (step_attention.py)
    "layer_norm": {"epsilon", "initial_output"},
    "dropout": {"dropout_noise_shape", "initial_output"},
    "dot": {"red1", "red2", "var1", "var2", "add_var2_if_empty", "initial_output"},
    "self_attention": {"num_heads", "total_key_dim", "n_out", "attention_dropout", "attention_left_only",
                       "forward_weights_init", "initial_output"},
    "positional_encoding": {"add_to_input", "n_out", "initial_output"},
    # step_state.py
    "variable": {"shape", "add_batch_axis", "add_time_axis", "init", "dtype", "initial_output"},
    "get_last_hidden_state": {"n_out", "combine", "key", "initial_output"},
    "reduce": {"mode", "axes", "axis", "keep_dims", "n_out", "initial_output"},
    "rec": {"unit", "n_out", "direction", "forward_weights_init", "recurrent_weights_init", "bias_init",
            "initial_output"},  # step_cells.py
    "reinterpret_data": {"enforce_batch_major", "initial_output"},  # a copy: the layout is the engine's
    "switch": {*SWITCH_OPTIONS, "initial_output"},  # step_select.py
}
_COMMON = {"class", "from", "dropout", "is_output_layer", "trainable", "L2"}
# options RETURNN's layers take that change nothing computed: accepted with an info line
NO_EFFECT = {"param_device": "where RETURNN places the layer's parameters; a placement, not a computation"}
# classes that carry state from step to step of their own, beyond their output (RETURNN's rec_vars_outputs)
STATEFUL_CLASSES = {"rnn_cell", "rec"}
# options naming other layers of the unit (or base:/prev: ones), besides 'from'
LAYER_OPTIONS = {"generic_attention": ("weights", "base"), "switch": SWITCH_OPTIONS}


STEP = ":i"  # the step: a reference, and a node of RETURNN's plan


def max_len_layers(max_seq_len: Any) -> list[str]:
    """The network's layers a ``max_seq_len`` string reads (``max_len_from('base:encoder')``)."""
    if not isinstance(max_seq_len, str):
        return []
    return re.findall(r"max_len_from\(\s*['\"](?:base:)?([^'\"]+)['\"]\s*\)", max_seq_len)


@dataclass(frozen=True)
class Ref:
    """One reference: ``kind`` "cur", "prev", "base", "data" or "step", and the name after the prefix."""

    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> "Ref":
        if text == ":i":
            return cls("step", ":i")
        for prefix, kind in (("prev:", "prev"), ("base:", "base"), ("data:", "data")):
            if text.startswith(prefix):
                return cls(kind, text[len(prefix):])
        return cls("cur", text)

    def __str__(self) -> str:
        return {"cur": self.name, "step": ":i"}.get(self.kind, f"{self.kind}:{self.name}")


@dataclass
class UnitLayerSpec:
    name: str
    cls: str
    sources: list[Ref]
    opts: dict[str, Any]
    options: dict[str, Ref] = field(default_factory=dict)  # weights=..., base=...
    # a choice's explicit_search_sources, in the config's order
    search_refs: list[Ref] = field(default_factory=list)

    def refs(self, training: bool) -> list[Ref]:
        """What the layer reads; in training a choice is the target and reads nothing (RETURNN drops its
        'from' then, so the optimisation can move it out); in search it also reads its
        explicit_search_sources (RETURNN resolves them in search only, before its 'from': its plan lists
        them first)."""
        if self.cls == "choice" and training:
            return []
        return self.search_refs + self.sources + list(self.options.values())


def parse_unit(rec_name: str, unit: dict) -> dict[str, UnitLayerSpec]:
    """The unit's layers (a subnetwork's as its own: ``unit_subnetwork.py``); ConfigError names the rec
    layer and the sublayer."""
    unit = flatten_subnetworks(rec_name, unit)
    layers = {}
    for name, opts in unit.items():
        where = f"Network layer '{rec_name}', unit layer '{name}'"
        if not isinstance(name, str) or name.startswith(("prev:", "base:", "data:")) or name == ":i":
            raise ConfigError(f"Network layer '{rec_name}': the unit's layer name {name!r} is not allowed.")
        if not isinstance(opts, dict):
            raise ConfigError(f"{where} must be a dict like {{'class': 'linear', ...}}, got {opts!r}.")
        cls = opts.get("class")
        if cls not in UNIT_CLASS_OPTIONS:
            raise ConfigError(f"{where}: class {cls!r} is not implemented inside a rec unit here; the unit "
                              f"takes {', '.join(sorted(UNIT_CLASS_OPTIONS))}.")
        for key in sorted(set(opts) & set(NO_EFFECT)):
            log.info(f"{where}: option '{key}' has no effect here ({NO_EFFECT[key]}).")
        if not isinstance(opts.get("trainable", True), bool):
            raise ConfigError(f"{where}: 'trainable' must be True or False, got {opts['trainable']!r}.")
        if opts.get("reuse_params") is not None:  # None: RETURNN's default (tied_params False in its setups)
            raise ConfigError(f"{where}: 'reuse_params' {opts['reuse_params']!r} is not implemented inside a "
                              "rec unit here: its layers do not share parameters (None, the default, is "
                              "accepted).")
        if "target" in opts and "target" not in UNIT_CLASS_OPTIONS[cls]:
            log.info(f"{where}: option 'target' has no effect on a {cls} layer (RETURNN reads a layer's "
                     "target for its loss or its output size; this class takes neither).")
        unknown = sorted(set(opts) - _COMMON - {"reuse_params", "target"} - set(NO_EFFECT)
                         - UNIT_CLASS_OPTIONS[cls])
        if unknown:
            raise ConfigError(f"{where}: option(s) {unknown} of a {cls} layer are not implemented inside a "
                              "rec unit here.")
        if "loss" in UNIT_CLASS_OPTIONS[cls]:
            check_loss_name(where, cls, opts.get("loss"))
            check_loss_opts(where, opts.get("loss"), opts.get("loss_opts"))
            check_loss_only_on_non_search(where, opts)
        check_options(where, cls, opts)
        no_from = ("generic_attention", "variable", "switch")
        sources = opts.get("from", [] if cls in no_from else "data:source")
        sources = [sources] if isinstance(sources, str) else sources
        if not isinstance(sources, (list, tuple)) or not all(isinstance(s, str) for s in sources):
            raise ConfigError(f"{where}: 'from' must be a layer name or a list of names, got {sources!r}.")
        options = {key: Ref.parse(opts[key]) for key in LAYER_OPTIONS.get(cls, ()) if key in opts}
        search_refs = [Ref.parse(s) for s in explicit_search_sources(where, opts)] if cls == "choice" else []
        layers[name] = UnitLayerSpec(name, cls, [Ref.parse(s) for s in sources], dict(opts), options,
                                     search_refs)
    if "output" not in layers:
        raise ConfigError(f"Network layer '{rec_name}': the unit has no layer 'output' (RETURNN's rec layer "
                          "outputs it).")
    for layer in layers.values():
        for ref in layer.refs(training=False):
            if ref.kind in ("cur", "prev") and ref.name not in layers:
                raise ConfigError(f"Network layer '{rec_name}', unit layer '{layer.name}' reads '{ref}', "
                                  f"which is not a layer of the unit; its layers: {', '.join(layers)}.")
            if ref.kind == "step" and layer.cls not in STEP_READERS:
                raise ConfigError(f"Network layer '{rec_name}', unit layer '{layer.name}' reads ':i' (the "
                                  f"step); here a {' or '.join(STEP_READERS)} layer reads it, a {layer.cls} "
                                  "layer does not (RETURNN's other readers of it, gather_nd positions of the "
                                  "RNN-transducer setups, are not implemented).")
            if ref.kind == "data" and ref.name != "source":
                raise ConfigError(f"Network layer '{rec_name}', unit layer '{layer.name}' reads '{ref}'; "
                                  "inside a unit this engine provides 'data:source' (the rec layer's input "
                                  "frame); read other data streams through the network ('base:...').")
    _check_cycles(rec_name, layers)
    return layers


def _check_cycles(rec_name: str, layers: dict[str, UnitLayerSpec]) -> None:
    """A cycle of current-step references has no order to compute in (prev: ones break cycles)."""
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join(path[path.index(name):] + [name])
            raise ConfigError(f"Network layer '{rec_name}': its unit has a cycle within one step: {cycle} "
                              "(read one of them as 'prev:...').")
        state[name] = 1
        for ref in layers[name].refs(training=False):
            if ref.kind == "cur":
                visit(ref.name, path + [name])
        state[name] = 2

    for name in layers:
        visit(name, [])


@dataclass(frozen=True)
class LoopPlan:
    """RETURNN's three lists (its log's "Input layers moved out of loop", "Output layers moved out of
    loop", "Layers in loop"), and the unit's layers nothing needs."""

    inputs_moved_out: tuple[str, ...]
    outputs_moved_out: tuple[str, ...]
    in_loop: tuple[str, ...]
    unused: tuple[str, ...]
    # where ':i' is in RETURNN's lists (no layer of the unit: not run, only logged), if read
    step_at: tuple[str, int] | None = None

    def log_lines(self, rec_name: str, search: bool, training: bool) -> list[str]:
        lines = [f"Rec layer '{rec_name}' (search {search}, train {training}) sub net:"]
        lists = {"outputs": list(self.outputs_moved_out), "loop": list(self.in_loop)}
        if self.step_at is not None:
            lists[self.step_at[0]].insert(self.step_at[1], STEP)
        for title, names in (("Input layers moved out of loop", self.inputs_moved_out),
                             ("Output layers moved out of loop", lists["outputs"]),
                             ("Layers in loop", lists["loop"]), ("Unused layers", self.unused)):
            lines.append(f"  {title}: (#: {len(names)})")
            lines += [f"    {name}" for name in names] or ["    None"]
        return lines


def needed_outputs(layers: dict[str, UnitLayerSpec], search: bool) -> list[str]:
    """What the loop must give: 'output', the loss layers (not in search), is_output_layer ones, and in
    search (where the length is unknown) 'end'."""
    needed = {"output"} | {n for n, layer in layers.items() if layer.opts.get("is_output_layer")}
    if not search:
        needed |= {n for n, layer in layers.items() if layer.opts.get("loss")}
    if search:
        if "end" not in layers:
            raise ConfigError("A rec unit searched without a known length needs an 'end' layer (RETURNN's "
                              "rule): add e.g. {'class': 'compare', 'from': 'output', 'value': 0}.")
        needed.add("end")
    return sorted(needed)


def plan_loop(layers: dict[str, UnitLayerSpec], search: bool, optimize: bool = True,
              cells_stay: bool = True) -> LoopPlan:
    """RETURNN's move-out optimisation (see the module docstring) on the unit's dependency graph; without
    ``optimize`` (RETURNN's ``optimize_move_layers_out`` False) every layer of the unit runs in the loop.
    ``cells_stay``: a layer with a state of its own stays in the loop (here it runs step by step only);
    RETURNN also moves such a cell out where no recurrence of the loop reads it (False: its plan)."""
    if not optimize:
        needed_outputs(layers, search)  # its checks
        reads = any(r.kind == "step" for layer in layers.values() for r in layer.refs(not search))
        return LoopPlan((), (), tuple(sorted(layers)), (), step_at=("loop", 0) if reads else None)
    training = not search
    # ':i' is a node of RETURNN's plan too (never moved in front), listed where it ends up
    deps = {name: [r.name if r.kind != "step" else STEP for r in layer.refs(training)
                   if r.kind in ("cur", "prev", "step")]
            for name, layer in layers.items()}
    deps[STEP] = []
    for name, layer in layers.items():  # a layer with its own state reads its previous step
        if cells_stay and layer.cls in STATEFUL_CLASSES and name not in deps[name]:
            deps[name].append(name)
    loop: list[str] = []

    def visit(names: list[str]) -> None:
        for name in names:
            if name not in loop:
                loop.append(name)
                visit(deps[name])

    visit(needed_outputs(layers, search))
    searched = {n for n in loop if search and n != STEP and layers[n].cls == "choice"}

    def output_movable(name: str) -> bool:
        if name == "end" or name in searched or name in deps[name]:
            return False
        return not any(name in deps[other] for other in loop if other != name)

    def input_movable(name: str) -> bool:
        if name in ("end", STEP) or name in searched:
            return False
        return not any(other in deps[name] for other in loop)

    inputs: list[str] = []
    outputs: list[str] = []
    while True:  # first output layers alone, then both, output layers first each time (RETURNN's order)
        found = next((n for n in loop if output_movable(n)), None)
        if found is None:
            break
        loop.remove(found)
        outputs.append(found)
    while True:
        found = next((n for n in loop if output_movable(n)), None)
        if found is not None:
            loop.remove(found)
            outputs.append(found)
            continue
        found = next((n for n in loop if input_movable(n)), None)
        if found is None:
            break
        loop.remove(found)
        inputs.append(found)
    used = set(inputs) | set(outputs) | set(loop)
    step_at = next(((kind, names.index(STEP)) for kind, names in (("outputs", outputs), ("loop", loop))
                    if STEP in names), None)
    return LoopPlan(tuple(inputs), tuple(n for n in outputs if n != STEP),
                    tuple(n for n in loop if n != STEP), tuple(sorted(set(layers) - used)), step_at)
