"""Streams the network computes itself: RETURNN's ``register_as_extern_data``.

2022-swb-factored-hybrid derives its targets from the alignment in the network: an ``eval`` of class ids
(``tf.floordiv(source(0), 3)`` of ``data:classes``, ``out_type`` sparse) with ``"register_as_extern_data":
"centerState"``; a loss then names ``centerState`` as its ``target``, and a layer reads
``data:centerState`` as input; 2022-swb-conformer-hybrid-sat registers a ``squeeze`` of its one-frame speaker
stream, a label per sequence. Here such a layer's output stands in for the stream of that name: a
``data:<stream>`` source becomes that layer (so it is built first and its lengths travel with it), a loss
or a rec unit with that ``target`` reads it, and the batch does not load a stream of that name (RETURNN
too replaces an ``extern_data`` entry of the same name). No TensorFlow here: ``rnn.py --check`` parses the
same way.
"""
from __future__ import annotations

from typing import Any

from engine.runtime.errors import ConfigError

REGISTER = "register_as_extern_data"

# specs are spec.LayerSpec (cls, sources, opts, after); spec.py imports this module


def registered_streams(specs: dict[str, Any]) -> dict[str, str]:
    """Stream name -> the layer that registers it. RETURNN reads a ``None`` as no registration (configs
    write ``"bpe0" if task == "train" else None``)."""
    found: dict[str, str] = {}
    for name, spec in specs.items():
        stream = spec.opts.get(REGISTER)
        if stream is None:
            continue
        where = f"Network layer '{name}': {REGISTER}"
        if not isinstance(stream, str) or not stream or stream == "data" or ":" in stream or "/" in stream:
            raise ConfigError(f"{where} must be a stream name (not 'data'), got {stream!r}.")
        if stream in found:
            raise ConfigError(f"{where} {stream!r}: layer '{found[stream]}' registers that stream already.")
        if not (is_ids_eval(spec) or (spec.cls == "squeeze" and spec.sources[0].startswith("data:"))):
            raise ConfigError(f"{where} {stream!r}: registering is implemented for eval layers whose "
                              "out_type is sparse (class ids per frame: {'dim': D, 'sparse': True}) and for "
                              "a squeeze of a data stream's time axis (a label per sequence), which losses "
                              f"read as targets; a {spec.cls} layer's output is no such stream here.")
        found[stream] = name
    return found


def is_ids_eval(spec: Any) -> bool:
    """An ``eval`` whose ``out_type`` says its output is class ids (``layers/eval.py`` checks the rest)."""
    out_type = spec.opts.get("out_type")
    return spec.cls == "eval" and isinstance(out_type, dict) and out_type.get("sparse") is True


def registered_dims(specs: dict[str, Any], stream_dims: dict[str, int]) -> dict[str, int]:
    """Stream -> its number of classes: the registering eval's ``out_type`` ``dim``, a squeeze's stream's
    (``stream_dims``: the data's sparse streams)."""
    dims = {}
    for stream, name in registered_streams(specs).items():
        if specs[name].cls == "squeeze":
            source = specs[name].sources[0][len("data:"):]
            if source not in stream_dims:
                raise ConfigError(f"Network layer '{name}' reads '{specs[name].sources[0]}', which is no "
                                  "stream of class ids of the data (those: "
                                  f"{', '.join(sorted(stream_dims))}).")
            dims[stream] = stream_dims[source]
            continue
        dim = specs[name].opts["out_type"].get("dim")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"Network layer '{name}': a sparse out_type needs its number of classes as "
                              f"'dim' (a positive int), got {dim!r}.")
        dims[stream] = dim
    return dims


def with_registered_streams(specs: dict[str, Any]) -> dict[str, Any]:
    """The specs with each ``data:<registered stream>`` source replaced by its layer, and each layer whose
    target (or whose unit's) is a registered stream built after the layer that computes it."""
    registered = registered_streams(specs)
    if not registered:
        return specs

    def layer_of(source: str) -> str:
        return registered.get(source[len("data:"):], source) if source.startswith("data:") else source

    result = {}
    for name, spec in specs.items():
        computed = sorted({registered[t] for t in _targets(spec) if t in registered} - {name})
        result[name] = spec._replace(sources=tuple(layer_of(s) for s in spec.sources),
                                     after=tuple(computed))
    return result


def _targets(spec: Any) -> set[str]:
    targets = {spec.opts.get("target")}
    if isinstance(spec.opts.get("unit"), dict):
        targets |= {layer.get("target") for layer in spec.opts["unit"].values() if isinstance(layer, dict)}
    return {t for t in targets if isinstance(t, str)}
