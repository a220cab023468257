"""All ranks must run the same config: compared once at start, by value, before any training step.

Values are compared through a fingerprint that is equal on two ranks exactly when the values are:
functions by their code, objects by their type and attributes, never by a per-process address
(``_fingerprint`` has the rules).
"""
from __future__ import annotations

import functools
import hashlib
import re
import types
from typing import Any

import numpy as np

from engine.distributed.backend import Communicator
from engine.runtime.errors import ConfigError


def check_config_consistency(comm: Communicator, config_items: dict[str, Any]) -> None:
    """Raise ConfigError on every rank when the ranks' configs differ, listing the differing keys."""
    mine = {key: _fingerprint(value) for key, value in config_items.items()}
    digests = {key: hashlib.sha1(fp.encode()).hexdigest()[:16] for key, fp in mine.items()}
    with comm.stall_guard("config consistency check"):
        everyone = comm.allgather_object({key: (digests[key], _preview(fp)) for key, fp in mine.items()})
    all_keys = sorted(set().union(*everyone))
    differing = [k for k in all_keys if len({ranks.get(k, (None,))[0] for ranks in everyone}) > 1]
    if not differing:
        return
    lines = []
    for key in differing[:20]:
        by_value: dict[str, list[int]] = {}
        for rank, ranks in enumerate(everyone):
            by_value.setdefault(ranks[key][1] if key in ranks else "(not set)", []).append(rank)
        lines.append(f"'{key}': " + "; ".join(f"{_ranks(r)}: {v}" for v, r in by_value.items()))
    more = f" (and {len(differing) - 20} more)" if len(differing) > 20 else ""
    error = ConfigError(f"The ranks of this MPI job run different configs; differing keys{more}: "
                        + ", ".join(lines) + ". Every rank must load the same config files with the same "
                        "++ overrides.")
    error.agreed = True  # every rank found the same difference: no abort needed
    error.quiet = comm.rank != 0  # and rank 0 alone says so
    raise error


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _fingerprint(value: Any, path: frozenset[int] = frozenset()) -> str:
    """A text that is equal on two ranks exactly when the config values are equal; never an address.

    Plain values by ``repr``; containers by their items (dicts and sets sorted); numpy arrays by dtype,
    shape and a hash of the bytes; functions by their code, names, constants, defaults and closure
    values; ``functools.partial`` by function and arguments; modules and library classes by name; a
    class defined in the config by its name and attributes; any other object by its type and its
    attributes (``__dict__`` or ``__slots__``), or, having none, by its ``repr`` with addresses removed.
    ``path`` holds the objects being fingerprinted around this one, so a cycle ends as ``<cycle>``."""
    if isinstance(value, (str, bytes, bool, int, float, complex, type(None))):
        return repr(value)
    if id(value) in path:
        return "<cycle>"
    path = path | {id(value)}

    def fp(inner: Any) -> str:
        return _fingerprint(inner, path)

    if isinstance(value, (list, tuple)):
        inner = ", ".join(fp(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{fp(k)}: {fp(v)}" for k, v in value.items())) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(fp(v) for v in value)) + "}"
    if isinstance(value, np.ndarray):
        return f"array({value.dtype}, {value.shape}, {hashlib.sha1(value.tobytes()).hexdigest()[:16]})"
    if isinstance(value, functools.partial):
        return f"partial({fp(value.func)}, {fp(value.args)}, {fp(value.keywords)})"
    if isinstance(value, types.MethodType):
        return f"<method {fp(value.__func__)} of {fp(value.__self__)}>"
    code = getattr(value, "__code__", None)
    if isinstance(code, types.CodeType):  # a function defined in the config
        cells = [_cell_value(c) for c in value.__closure__ or ()]
        parts = (_code_digest(code), fp(value.__defaults__), fp(value.__kwdefaults__), fp(cells))
        return f"<function {value.__qualname__} {' '.join(parts)}>"
    if isinstance(value, types.ModuleType):
        return f"<module {value.__name__}>"
    if isinstance(value, type):
        if value.__module__ != "__config__":
            return f"<class {value.__module__}.{value.__qualname__}>"
        attributes = {k: v for k, v in vars(value).items() if not k.startswith("__")}
        return f"<class {value.__qualname__} {fp(attributes)}>"
    state = _attributes(value)
    if state is not None:
        return f"<{type(value).__module__}.{type(value).__qualname__} {fp(state)}>"
    return _ADDRESS.sub("", repr(value))


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return "<empty cell>"


def _attributes(value: Any) -> dict | None:
    """An object's own state: its ``__dict__`` and its ``__slots__`` values; None if it has neither."""
    state = dict(vars(value)) if hasattr(value, "__dict__") else None
    slots = [name for klass in type(value).__mro__ for name in getattr(klass, "__slots__", ())]
    if slots:
        state = state or {}
        state.update((name, getattr(value, name)) for name in slots if hasattr(value, name))
    return state


def _code_digest(code: types.CodeType) -> str:
    return hashlib.sha1(_code_bytes(code)).hexdigest()[:16]


def _code_bytes(code: types.CodeType) -> bytes:
    """The byte code with the names it uses and its constants (nested functions recursively); no line
    numbers or file names, which do not change what the function does."""
    parts = [code.co_code, " ".join(code.co_names).encode()]
    for const in code.co_consts:
        parts.append(_code_bytes(const) if isinstance(const, types.CodeType) else repr(const).encode())
    return b"\0".join(parts)


def _preview(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))
