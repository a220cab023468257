"""How RETURNN carries parameters into the next network of pretraining, on values by RETURNN's names.

RETURNN (``TFEngine.init_new_network``, ``LayerBase.set_param_values_by_dict``) keeps the new network's
fresh initial values and overwrites them, layer by layer, with the old network's values where a layer of
the same name exists (layers that no longer exist are skipped):

- a parameter of the same shape takes the old value;
- a parameter whose shape changed keeps its new value, except with copy_param_mode ``subset``: then the
  old value goes into the leading part of the new one, block by block where RETURNN knows that a parameter
  is made of blocks (an LSTM's four gates, the rows of several concatenated sources; its "axes split
  info"): each block's overlap is copied, the rest keeps the new initial values;
- copy_param_mode ``reset``: nothing is carried; with ``copy_output_layer`` False the output layers'
  parameters are not carried.

The split of the OLD value is not known there: RETURNN guesses it from the new one's split and the old
shape (``split_for_shape``, its heuristic). Pure numpy.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Mapping, Sequence

import numpy as np

from engine.runtime.errors import ConfigError

Split = Sequence[Sequence[int]]


def split_for_shape(split: Split, shape: Sequence[int], name: str = "") -> list[list[int]]:
    """The blocks of an array of ``shape`` that correspond to ``split``'s (per axis, block sizes), by
    RETURNN's guess: a single block takes the whole axis; a block size seen alone on some axis, or as one
    of n equal blocks of an axis, scales as it does there; what is still unknown takes the rest."""
    if len(split) != len(shape):
        raise ConfigError(f"Parameter {name}: its blocks {split} do not match the shape {tuple(shape)}.")
    size_of: dict[int, int] = {}
    for dim, parts in zip(shape, split):
        if len(parts) == 1:
            size_of[parts[0]] = dim
        elif len(set(parts)) == 1 and dim % len(parts) == 0:
            size_of[parts[0]] = dim // len(parts)
    result = []
    for dim, parts in zip(shape, split):
        if len(parts) == 1:
            result.append([dim])
            continue
        guess = [size_of.get(p) for p in parts]
        if None in guess:
            while guess.count(None) > 1:  # assume the first unknown block kept its size (if it fits)
                j = guess.index(None)
                guess[j] = min(parts[j], dim - sum(g for g in guess if g is not None))
            j = guess.index(None)
            guess[j] = dim - sum(g for g in guess if g is not None)
        elif sum(guess) != dim:  # assume the first block is the one that differs
            guess[0] = dim - sum(guess[1:])
        if min(guess) < 0:
            raise ConfigError(f"Parameter {name}: blocks {split} cannot be found in the shape "
                              f"{tuple(shape)}.")
        result.append(guess)
    return result


def copy_blocks(old_split: Split, new_split: Split, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``new`` with, for each block, the leading overlap of the old block copied in."""
    out = np.array(new, copy=True)
    for index in itertools.product(*(range(len(parts)) for parts in old_split)):
        old_slices, new_slices = [], []
        for i, old_parts, new_parts in zip(index, old_split, new_split):
            size = min(old_parts[i], new_parts[i])
            old_start, new_start = sum(old_parts[:i]), sum(new_parts[:i])
            old_slices.append(slice(old_start, old_start + size))
            new_slices.append(slice(new_start, new_start + size))
        out[tuple(new_slices)] = old[tuple(old_slices)]
    return out


def carried_value(name: str, old: np.ndarray, new: np.ndarray, split: Split | None,
                  mode: str | None) -> np.ndarray | None:
    """The value the new network's parameter ``name`` gets (None: its own initial value)."""
    if old.shape == new.shape:
        return old
    if mode != "subset":
        return None
    if old.ndim != new.ndim:
        raise ConfigError(f"copy_param_mode 'subset': parameter {name} changes rank from {old.shape} to "
                          f"{new.shape}; RETURNN copies only between equal ranks.")
    if split is None:
        return copy_blocks([[d] for d in old.shape], [[d] for d in new.shape], old, new)
    return copy_blocks(split_for_shape(split, old.shape, name), split, old, new)


def carry(old: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray], splits: Mapping[str, Split | None],
          layer_of: Mapping[str, str], new_layers: Iterable[str], mode: str | None,
          skip_layers: Iterable[str] = ()) -> tuple[dict[str, np.ndarray], list[str]]:
    """The new values to assign (by RETURNN's names) and notes for the log. ``old``/``new``: the values
    of both networks; ``layer_of``: each name (of both) -> its layer; ``new_layers``: every layer of the
    new network, with or without parameters; ``skip_layers``: layers whose values are not carried."""
    if mode == "reset":
        return {}, ["copy_param_mode 'reset': no parameter is carried, the new network starts afresh"]
    new_layers, skip_layers = set(new_layers), set(skip_layers)
    assigned: dict[str, np.ndarray] = {}
    notes = []
    for name, value in old.items():
        layer = layer_of[name]
        if layer in skip_layers or layer not in new_layers:
            why = "an output layer" if layer in skip_layers else "its layer is gone"
            notes.append(f"{name}: not carried ({why})")
            continue
        if name not in new:
            raise ConfigError(f"Pretraining: layer {layer!r} of the new network has no parameter {name} to "
                              "take the old value; RETURNN stops here too (change the layer's name when its "
                              "parameters change).")
        carried = carried_value(name, np.asarray(value), np.asarray(new[name]), splits.get(name), mode)
        if carried is None:
            notes.append(f"{name}: not carried (shape {np.shape(value)} -> {np.shape(new[name])})")
        else:
            assigned[name] = carried
            if np.shape(value) != np.shape(new[name]):
                notes.append(f"{name}: subset {np.shape(value)} -> {np.shape(new[name])}")
    return assigned, notes
