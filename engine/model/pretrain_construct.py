"""RETURNN's four ways to make the networks of pretraining from the config's ``network`` (``pretrain.py``
uses them): each returns the list of networks, the smallest first and the full network last.

- ``from_output``: remove the layers right below the output layers, one level a network, as long as that
  removes something trainable and the output layers do not end up reading an input layer;
- ``from_input``: the layers within 1, 2, ... steps of ``data`` (and the non-trainable ones that hang on
  them), plus the output layers, each layer reading its nearest sources that exist;
- a function ``(idx, net_dict) -> net_dict | None``, called with idx = 0, 1, ... on a copy of the network
  until it returns nothing;
- ``no_network_modifications``: the full network only.

For the first two, a network that only adds non-trainable layers (output layers aside) to the one
before it is dropped (``drop_untrainable_steps``), as RETURNN does. RETURNN reads a layer's ``from`` here
as a list (a string would be taken apart into letters), so a string ``from`` is refused for these two.
Pure Python: no TensorFlow.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from engine.runtime.errors import ConfigError

Net = dict[str, Any]


def _from(net: Net, name: str) -> list:
    value = net[name].get("from", ["data"]) if isinstance(net[name], dict) else None
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"Config key 'pretrain': the construction algorithm reads the 'from' of layer "
                          f"{name!r} as a list (as RETURNN's does; a string would be split into letters), "
                          f"got {value!r}. Write it as a list, e.g. [{value!r}].")
    return list(value)


def is_output(net: Net, name: str, output_layers: Sequence[str]) -> bool:
    """RETURNN's output layers of pretraining: listed in ``output_layers``, a softmax, or with a target."""
    layer = net[name]
    return name in output_layers or layer.get("class") == "softmax" or "target" in layer


def _check_plain(net: Net, algo: str) -> None:
    for name, layer in net.items():
        if not isinstance(layer, dict) or str(name).startswith("#"):
            raise ConfigError(f"Config key 'pretrain': construction_algo {algo!r} treats every entry of the "
                              f"network as a layer, but {name!r} is not one (RETURNN fails on it too). Use a "
                              "construction_algo function to set '#' entries.")
        _from(net, name)


def _readers(original: Net, sources: Sequence[str]) -> list[str]:
    """The layers of ``original`` that read any of ``sources``, by name."""
    found = []
    for name in sorted(original):
        if name not in found and any(src in _from(original, name) for src in sources):
            found.append(name)
    return found


def _smaller_from_output(nets: list[Net], original: Net, outputs: Sequence[str],
                         inputs: Sequence[str]) -> bool:
    """Put a network before ``nets[0]`` with the output layers' sources replaced by theirs; False when
    nothing is left to remove."""
    net = copy.deepcopy(nets[0])
    while True:
        new_sources: set[str] = set()
        removed: set[str] = set()
        for out in outputs:
            if out not in net or "from" not in net[out]:
                raise ConfigError(f"Config key 'pretrain': output layer {out!r} (output_layers) must be a "
                                  "layer of the network with a 'from' list for construction_algo "
                                  "'from_output'.")
            for src in _from(net, out):
                if src in inputs:
                    new_sources.add(src)
                    continue
                if src not in net:
                    raise ConfigError(f"Config key 'pretrain': construction_algo 'from_output' cannot remove "
                                      f"{src!r} below output layer {out!r}: it is no layer of the network "
                                      "(left), e.g. two output layers share it; RETURNN fails here too.")
                new_sources.update(_from(net, src))
                del net[src]
                removed.add(src)
        current = sorted(set(sum((_from(net, out) for out in outputs), [])))
        if sorted(new_sources) == current:
            return False
        for out in outputs:
            net[out]["from"] = sorted(new_sources)
        if new_sources & set(inputs):  # the output layers' input dim would change: remove one more level
            continue
        if all(not original[name].get("trainable", True) for name in removed):
            continue
        nets.insert(0, net)
        return True


def from_output(original: Net, outputs: Sequence[str], inputs: Sequence[str]) -> list[Net]:
    _check_plain(original, "from_output")
    nets = [original]
    while _smaller_from_output(nets, original, outputs, inputs):
        pass
    return nets


def _existing_sources(original: Net, net: Net, name: str, found: list[str], seen: set[str]) -> list[str]:
    """The nearest layers below ``name`` (in ``original``) that ``net`` has, or ``data``."""
    for src in _from(original, name):
        if src in net or src == "data":
            if src not in found:
                found.append(src)
        elif src not in seen:
            seen.add(src)
            _existing_sources(original, net, src, found, seen)
    return found


def _grown_from_input(original: Net, steps: int, outputs: Sequence[str]) -> Net | None:
    """The network of the layers within ``steps`` of ``data``; None once that is the whole network."""
    net: Net = {}
    needed: set[str] = set()

    def add(name: str) -> None:
        needed.discard(name)
        net[name] = copy.deepcopy(original[name])
        needed.update(set(_from(net, name)) - set(net) - {"data"})

    sources = ["data"]
    while True:  # first the non-trainable layers on top of the input (e.g. a window)
        added = False
        for name in _readers(original, sources):
            if name not in net and not original[name].get("trainable", True):
                sources.append(name)
                add(name)
                added = True
        if not added:
            break
    for _ in range(steps):
        sources = [name for name in _readers(original, sources) if name not in net]
        for name in sources:
            add(name)
        if not sources:
            return None
    for name in sorted(original):
        if name not in net and is_output(original, name, outputs):
            add(name)
    if not needed:
        return None
    for name in sorted(net):
        nearest = _existing_sources(original, net, name, [], {name})
        if net[name].get("from", ["data"]) != nearest:  # as given: a tuple differs from any list
            if "data" in nearest:  # RETURNN drops data from a rewired list
                nearest.remove("data")
            net[name]["from"] = nearest
    return net


def from_input(original: Net, outputs: Sequence[str]) -> list[Net]:
    _check_plain(original, "from_input")
    nets = []
    steps = 1
    while (net := _grown_from_input(original, steps, outputs)) is not None:
        nets.append(net)
        steps += 1
    return nets + [original]


def custom(original: Net, func: Callable[..., Any]) -> list[Net]:
    nets = []
    idx = 0
    while True:
        net = func(idx=idx, net_dict=copy.deepcopy(original))
        if not net:
            break
        if not isinstance(net, dict):
            raise ConfigError(f"Config key 'pretrain': construction_algo(idx={idx}, net_dict=...) must "
                              f"return a network dict or None, got {type(net).__name__}.")
        nets.append(net)
        idx += 1
    return nets + [original]


def drop_untrainable_steps(nets: list[Net], outputs: Sequence[str]) -> list[Net]:
    """Without the networks (but the last) that add no trainable layer to the one before, output layers
    aside; the first is compared with an empty network."""
    kept = []
    for i in range(-1, len(nets) - 2):
        before, after = ({}, nets[0]) if i == -1 else (nets[i], nets[i + 1])
        missing = [name for name in before if name not in after]
        if missing:
            raise ConfigError(f"Config key 'pretrain': a pretraining network drops layers {missing} of the "
                              "one before it; RETURNN's construction only grows a network.")
        if any(name not in before and not is_output(after, name, outputs)
               and after[name].get("trainable", True) for name in sorted(after)):
            kept.append(after)
    return kept + [nets[-1]]
