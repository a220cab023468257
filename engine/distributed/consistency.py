"""All ranks must run the same config: compared once at start, by value, before any training step.

Values are compared through a fingerprint that is equal on two ranks exactly when the values are:
functions by their code, never by a per-process address.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from engine.distributed.backend import Communicator
from engine.errors import ConfigError


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


def _fingerprint(value: Any) -> str:
    """A text that is equal on two ranks exactly when the config values are equal (no memory addresses)."""
    if isinstance(value, (str, bytes, bool, int, float, complex, type(None))):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_fingerprint(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        items = sorted((_fingerprint(k), _fingerprint(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_fingerprint(v) for v in value)) + "}"
    if isinstance(value, np.ndarray):
        return f"array({value.dtype}, {value.shape}, {hashlib.sha1(value.tobytes()).hexdigest()[:16]})"
    code = getattr(value, "__code__", None)
    if code is not None:  # a function defined in the config: compare its code, not its address
        return f"<function {value.__qualname__} {hashlib.sha1(_code_bytes(code)).hexdigest()[:16]}>"
    if isinstance(value, type) or type(value).__name__ == "module":
        return f"<{type(value).__name__} {getattr(value, '__qualname__', getattr(value, '__name__', '?'))}>"
    return _ADDRESS.sub("", repr(value))


def _code_bytes(code: Any) -> bytes:
    parts = [code.co_code]
    for const in code.co_consts:
        parts.append(_code_bytes(const) if hasattr(const, "co_code") else repr(const).encode())
    return b"\0".join(parts)


def _preview(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))
