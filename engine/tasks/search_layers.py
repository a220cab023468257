"""Which layers ``task = "search"`` writes and scores (the task itself: ``search.py``).

``search_output_layer`` names what is written, as in RETURNN: a ``decide`` layer (one hypothesis per
sequence), a ``rec`` layer with a searched subnetwork unit (its whole final beam per sequence, as a list
of (score, hypothesis) pairs, best first), or a list of such layers (a dict per sequence, layer name ->
its value; RETURNN allows that in the ``py`` format only). All of them must belong to one searched rec
layer, with at most one decide layer among them.

What is scored (``search_do_eval``) is the decided hypothesis: that of the decide layer among the
outputs, else of the network's decide layer of that rec layer (RETURNN reports its ``edit_distance``
error whether or not it is written), else the rec layer's best one. Beside it the loss layers of the
network that RETURNN's search reports (``scored_loss_layers``).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.config.loader import Config
from engine.model.base import SeqModel
from engine.model.rec.decide import Decide
from engine.model.rec.subnet import RecSubnet
from engine.runtime.errors import ConfigError


@dataclass(frozen=True)
class SearchLayers:
    outputs: list[str]  # written, in the config's order
    as_dict: bool  # a list in the config: a dict per sequence
    rec: str  # the searched rec layer
    decide: str | None  # the decide layer whose hypothesis is scored (None: the rec layer's best)

    @property
    def decided(self) -> str:
        """The layer whose decided hypotheses the search step returns."""
        return self.decide or self.rec

    def beam_outputs(self) -> list[str]:
        return [name for name in self.outputs if name == self.rec]


def search_layers(config: Config, model: SeqModel) -> SearchLayers:
    value = config.typed("search_output_layer")
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    layers = getattr(model, "layers", {})
    searchable = [name for name, obj in layers.items()
                  if isinstance(obj, Decide) or (isinstance(obj, RecSubnet) and obj.choice)]
    if not names or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"search_output_layer must name a layer or list layers, got {value!r}.")
    recs = {}
    for name in names:
        obj = layers.get(name)
        if isinstance(obj, Decide):
            recs[name] = model.specs[name].sources[0]
        elif isinstance(obj, RecSubnet) and obj.choice:
            recs[name] = name
        else:
            what = "neither a decide layer nor a rec layer with a choice"
            if obj is None:
                what = "not a layer of the network"
            elif isinstance(obj, RecSubnet):
                what = "a rec layer without a searched subnetwork unit (no choice layer)"
            raise ConfigError(f"search_output_layer {name!r} is {what}; it must name a decide layer or a "
                              f"searched rec layer (the network's: {searchable or 'none'}).")
    if len(set(recs.values())) > 1:
        raise ConfigError(f"search_output_layer {names} belong to different rec layers "
                          f"({sorted(set(recs.values()))}); one search writes the layers of one searched rec "
                          "layer: list those of one.")
    decides = [name for name in names if isinstance(layers[name], Decide)]
    if len(decides) > 1:
        raise ConfigError(f"search_output_layer {names} lists the decide layers {decides} of one rec layer; "
                          "list one (they decide among the same beam).")
    rec = recs[names[0]]
    if not decides:  # the network's decide layer of that rec layer, reported by RETURNN all the same
        decides = [name for name, obj in layers.items()
                   if isinstance(obj, Decide) and model.specs[name].sources[0] == rec][:1]
    return SearchLayers(names, isinstance(value, (list, tuple)), rec, decides[0] if decides else None)


def scored_loss_layers(model: SeqModel, rec: str) -> list[str]:
    """The loss layers whose loss and error RETURNN's search reports beside the decide layer's: those of
    the network outside the searched loop ``rec`` that do not read it (a ``ctc`` on the encoder), without
    ``loss_only_on_non_search``. The loop's own (its ``output_prob``) RETURNN does not report."""
    reads_search = {rec}
    for name in model.order:  # dependency order: a layer's sources come first
        if reads_search.intersection(model.specs[name].reads):
            reads_search.add(name)
    return [name for name in model.loss_layers
            if model.loss_objects[name] is model.layers.get(name) and name not in reads_search
            and not model.specs[name].opts.get("loss_only_on_non_search")]


def end_label(model: SeqModel, rec: str) -> int | None:
    """The class id that ends a hypothesis: the value the rec unit's ``end`` layer compares the choice
    with (None when it is not such a comparison)."""
    unit = model.specs[rec].opts.get("unit")
    end = unit.get("end") if isinstance(unit, dict) else None
    if not isinstance(end, dict) or end.get("class") != "compare" or end.get("kind", "equal") != "equal":
        return None
    sources = end.get("from", ["data"])
    sources = [sources] if isinstance(sources, str) else list(sources)
    choice = unit.get(sources[0]) if len(sources) == 1 else None
    value = end.get("value")
    if not isinstance(choice, dict) or choice.get("class") != "choice" or not isinstance(value, int):
        return None
    return value
