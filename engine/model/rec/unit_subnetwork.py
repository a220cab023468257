"""A ``subnetwork`` layer inside a rec unit (RETURNN's ``SubnetworkLayer`` there: the LM of shallow fusion).

Its layers join the unit under ``<subnetwork>/<layer>``, and the subnetwork layer itself becomes a copy of
its ``output``, so that each of them runs, is planned and keeps its state per step as any unit layer does.
Inside the subnetwork a reference means what RETURNN makes it mean: ``data`` (and a layer without
``from``) the subnetwork's input, its ``from``; ``x`` and ``prev:x`` the subnetwork's own layers;
``base:x`` a layer of the unit around it. The parameters keep RETURNN's names:
``<rec>/rec/<subnetwork>/<layer>/...``.

``load_on_init``: a checkpoint whose variables, named as inside the subnetwork (``lstm0/rec/...``), give
the subnetwork's initial parameters (RETURNN's ``CustomCheckpointLoader`` with ``params_prefix``); the
training's ``initial_params`` applies it. No TensorFlow here: ``rnn.py --check`` flattens as the build.
"""
from __future__ import annotations

from typing import Any

from engine.runtime.errors import ConfigError

OPTIONS = {"class", "from", "subnetwork", "load_on_init", "n_out", "trainable", "concat_sources", "dropout",
           "is_output_layer", "initial_output"}
# classes whose parameters RETURNN names by the layer's name itself, not by its scope
REFUSED_INSIDE = {"variable": "its parameter is named by the layer's own name",
                  "subnetwork": "a subnetwork within a subnetwork is not implemented"}


def has_subnetworks(unit: dict) -> bool:
    return any(isinstance(opts, dict) and opts.get("class") == "subnetwork" for opts in unit.values())


def flatten_subnetworks(rec_name: str, unit: dict) -> dict:
    """The unit with each ``subnetwork`` layer's layers as its own (see the module docstring)."""
    if not has_subnetworks(unit):
        return unit
    flat: dict = {}
    for name, opts in unit.items():
        if isinstance(opts, dict) and opts.get("class") == "subnetwork":
            flat.update(_expand(rec_name, name, opts))
        else:
            flat[name] = opts
    return flat


def subnetwork_loads(unit: dict) -> dict[str, str]:
    """Subnetwork layer name -> its ``load_on_init`` checkpoint path (checked by ``flatten_subnetworks``)."""
    return {name: opts["load_on_init"] for name, opts in unit.items()
            if isinstance(opts, dict) and opts.get("class") == "subnetwork" and opts.get("load_on_init")}


def _expand(rec_name: str, name: str, opts: dict) -> dict:
    where = f"Network layer '{rec_name}', unit layer '{name}' (a subnetwork)"
    unknown = sorted(set(opts) - OPTIONS)
    if unknown:
        raise ConfigError(f"{where}: option(s) {unknown} are not implemented for a subnetwork inside a rec "
                          f"unit here (it takes {', '.join(sorted(OPTIONS - {'class'}))}).")
    inner = opts.get("subnetwork")
    if not isinstance(inner, dict) or not isinstance(inner.get("output"), dict):
        raise ConfigError(f"{where}: 'subnetwork' must be a dict of layers with an 'output' layer, got "
                          f"{inner!r}.")
    if opts.get("concat_sources", True) is not True:
        raise ConfigError(f"{where}: concat_sources {opts['concat_sources']!r} is not implemented (True: its "
                          "sources concatenated are its 'data').")
    if opts.get("dropout", 0):
        raise ConfigError(f"{where}: 'dropout' on the subnetwork's input is not implemented; set it on the "
                          "layers inside.")
    load = opts.get("load_on_init")
    if load is not None and (not isinstance(load, str) or not load):
        raise ConfigError(f"{where}: load_on_init must be a checkpoint path (a string), got {load!r}; "
                          "RETURNN's dict and callable forms are not implemented.")
    trainable = opts.get("trainable", True)
    if not isinstance(trainable, bool):
        raise ConfigError(f"{where}: 'trainable' must be True or False, got {trainable!r}.")
    sources = opts.get("from", "data:source")
    sources = [sources] if isinstance(sources, str) else list(sources)
    flat = {}
    for inner_name, inner_opts in inner.items():
        inner_where = f"{where}, its layer '{inner_name}'"
        if not isinstance(inner_name, str) or ":" in inner_name or "/" in inner_name:
            raise ConfigError(f"{where}: the layer name {inner_name!r} is not allowed inside it.")
        if not isinstance(inner_opts, dict):
            raise ConfigError(f"{inner_where} must be a dict like {{'class': 'linear', ...}}, got "
                              f"{inner_opts!r}.")
        if inner_opts.get("class") in REFUSED_INSIDE:
            raise ConfigError(f"{inner_where}: class {inner_opts['class']!r} is not implemented inside a "
                              f"subnetwork of a rec unit ({REFUSED_INSIDE[inner_opts['class']]}).")
        new = dict(inner_opts)
        new["from"] = _renamed_sources(inner_where, name, inner_opts.get("from", "data"), inner, sources)
        if not trainable:  # RETURNN keeps every parameter of a subnetwork that is not trainable as it is
            new["trainable"] = False
        flat[f"{name}/{inner_name}"] = new
    out_dim = inner["output"].get("n_out")
    if opts.get("n_out") is not None and out_dim is not None and opts["n_out"] != out_dim:
        raise ConfigError(f"{where}: n_out {opts['n_out']!r} differs from its 'output' layer's n_out "
                          f"{out_dim!r}.")
    flat[name] = {"class": "copy", "from": f"{name}/output",
                  **{key: opts[key] for key in ("is_output_layer", "initial_output") if key in opts}}
    return flat


def _renamed_sources(where: str, name: str, refs: Any, inner: dict, sources: list[str]) -> list[str]:
    refs = [refs] if isinstance(refs, str) else refs
    if not isinstance(refs, (list, tuple)) or not all(isinstance(r, str) for r in refs):
        raise ConfigError(f"{where}: 'from' must be a layer name or a list of names, got {refs!r}.")
    renamed = []
    for ref in refs:
        if ref in ("data", "data:data"):
            renamed += sources
        elif ref.startswith("base:"):
            renamed.append(ref[len("base:"):])  # the unit around the subnetwork
        elif ref.startswith("prev:") and ref[len("prev:"):] in inner:
            renamed.append(f"prev:{name}/{ref[len('prev:'):]}")
        elif ref in inner:
            renamed.append(f"{name}/{ref}")
        else:
            raise ConfigError(f"{where} reads {ref!r}, which is not a layer of the subnetwork (its layers: "
                              f"{', '.join(inner)}; 'data' is its input, 'base:x' a layer of the unit).")
    return renamed
