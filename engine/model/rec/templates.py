"""Each unit layer's ``Template`` before any parameter exists. A layer may read its own or another's
previous step (``prev:x``) before x's template is known (``accum_att_weights`` reads itself, the decoder
state reads the attention that reads the state): such a reference is left out where a layer's template
does not need it (a linear layer's axes come from its other sources, an LSTM's from nothing), as
RETURNN builds its templates around the uninitialised ones.
"""
from __future__ import annotations

from engine.model.layers.lstm_norm_options import NORM_LSTM_UNIT
from engine.model.rec.frames import Template
from engine.model.rec.step_attention import CLASSES as ATTENTION_CLASSES
from engine.model.rec.step_cells import CLASSES as CELL_CLASSES
from engine.model.rec.step_cells import NormLstmCell
from engine.model.rec.step_layers import CLASSES, EvalUnit, GenericAttention, UnitContext, UnitLayer
from engine.model.rec.step_select import STEP, Switch
from engine.model.rec.step_state import CLASSES as STATE_CLASSES
from engine.model.rec.step_state import ReduceTime
from engine.model.rec.unit import Ref, UnitLayerSpec
from engine.model.rec.unit_options import SWITCH_OPTIONS, reduces_time
from engine.runtime.errors import ConfigError

# every class a unit layer can have (the Transformer's in step_attention.py)
UNIT_CLASSES = {**CLASSES, **ATTENTION_CLASSES, **CELL_CLASSES, **STATE_CLASSES, "switch": Switch}


def unit_class(layer: UnitLayerSpec) -> type[UnitLayer]:
    """The class that runs ``layer``: by its class, and an rnn_cell's by its unit."""
    if layer.cls == "rnn_cell" and str(layer.opts.get("unit")).lower() == NORM_LSTM_UNIT:
        return NormLstmCell
    if layer.cls == "reduce" and reduces_time(layer.opts):
        return ReduceTime
    return UNIT_CLASSES[layer.cls]


# classes whose template comes from their options alone (an LSTM cell's, a variable's, a state's size)
_FROM_OPTIONS = {"rnn_cell", "rec", "variable", "get_last_hidden_state"}


def unit_templates(layers: dict[str, UnitLayerSpec], base: dict[str, Template], ctx: UnitContext,
                   source: Template | None = None) -> dict[str, Template]:
    """The templates of all unit layers; ``base``: those of the network's layers the unit reads;
    ``source``: one frame of the rec layer's input (``data:source``), None where it has no sources."""
    templates: dict[str, Template] = {}

    def of(ref: Ref, reader: str) -> Template | None:
        if ref.kind == "base":
            return base[ref.name]
        if ref.kind in ("cur", "prev"):
            return templates.get(ref.name)
        if ref.kind == "data" and source is not None:
            return source
        if ref.kind == "data":
            raise ConfigError(f"{ctx.where(reader)}: '{ref}' is the rec layer's input frame, but the rec "
                              "layer has no sources ('from': []): its loop runs over output labels.")
        return STEP  # ':i' (parse_unit has checked its reader)

    def attempt(layer: UnitLayerSpec, relaxed: bool) -> Template | None:
        if layer.cls == "choice":
            return _choice_template(layer, ctx)
        if layer.cls == "generic_attention":
            weights, values = of(layer.options["weights"], layer.name), of(layer.options["base"], layer.name)
            if weights is None or values is None:
                return None
            return GenericAttention.attention_template(layer.name, weights, values, ctx)
        if layer.cls == "switch":  # a branch's previous step may wait, as a source's does
            condition, true, false = (of(layer.options[key], layer.name) for key in SWITCH_OPTIONS)
            waiting = [layer.options[k] for k, t in (("true_from", true), ("false_from", false)) if t is None]
            if condition is None or len(waiting) == 2 or (waiting and (not relaxed
                                                                       or waiting[0].kind == "cur")):
                return None
            return Switch.switch_template(layer.name, condition, true or false, false or true, ctx)
        if layer.cls == "eval" and "shape" in (layer.opts.get("out_type") or {}):
            labels = {a.label for ref in layer.sources if ref.kind == "base" for a in base[ref.name].axes
                      if a.dynamic} or {a.label for t in base.values() for a in t.axes if a.dynamic}
            return EvalUnit.declared_template(layer.name, layer.opts, ctx, labels)
        sources = []
        for ref in layer.sources:
            template = of(ref, layer.name)
            if template is None and (ref.kind == "cur" or not relaxed):
                return None
            if template is not None:
                sources.append(template)
        if not sources and layer.cls not in _FROM_OPTIONS:
            return None
        return unit_class(layer).out_template(layer.name, layer.opts, sources, ctx)

    pending = list(layers)
    while pending:
        progress = False
        for relaxed in (False, True):
            for name in list(pending):
                template = attempt(layers[name], relaxed)
                times = [a.label for a in template.axes if a.dynamic] if template is not None else []
                if len(times) > 1:
                    raise ConfigError(f"{ctx.where(name)}: its sources are on different time axes ({times}: "
                                      "base layers whose frames differ, e.g. before and after a pooling); a "
                                      "unit layer here reads one time axis.")
                if template is not None:
                    templates[name] = template
                    pending.remove(name)
                    progress = True
                    if relaxed:
                        break  # back to strict: the others may now have all they need
            if progress:
                break
        if not progress:
            raise ConfigError(f"Network layer '{ctx.rec_name}': the shapes of unit layers {pending} cannot "
                              "be "
                              "derived (each reads another of them before it is known); give them 'n_out' "
                              "or an 'out_type'.")
    return templates


def _choice_template(layer: UnitLayerSpec, ctx: UnitContext) -> Template:
    target = layer.opts.get("target")
    if not isinstance(target, str) or target not in ctx.target_dims:
        raise ConfigError(f"{ctx.where(layer.name)}: choice needs 'target', a data stream of class ids "
                          f"(known: {sorted(ctx.target_dims)}), got {target!r}.")
    return Template((), ctx.target_dims[target], sparse=True)
