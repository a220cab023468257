"""A dataset as users write it, as options: RETURNN's dict, ``"Class:kw=v,..."`` (each value a Python
literal, or else a plain string), ``"a.hdf,b.hdf"`` (HDF files), or RETURNN's ``"sprint:..."``."""
from __future__ import annotations

import ast
import re
from typing import Any

from engine.runtime.errors import DataError


def spec_to_kwargs(spec: dict | str) -> dict[str, Any]:
    """The options of a dataset as written: a dict (copied), ``"Class:kw=v,..."`` or an HDF file list."""
    if isinstance(spec, dict):
        return dict(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise DataError(f"A dataset must be a dict, a comma-separated HDF file list or 'Class:kw=v,...', "
                        f"got {spec!r}.")
    head, sep, rest = spec.partition(":")
    if sep and head.strip() == "sprint":  # RETURNN's "sprint:<RASR options>" is an ExternSprintDataset
        return {"class": "ExternSprintDataset", "sprintConfigStr": rest}
    if sep and re.fullmatch(r"[A-Za-z_]\w*", head.strip()) and not head.strip().lower().endswith("hdf"):
        kwargs = {"class": head.strip()}
        for item in _split_top_level(rest):
            name, eq, text = item.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name.strip()):
                raise DataError(f"Dataset string {spec!r}: expected 'name=value' items, got {item!r}.")
            kwargs[name.strip()] = _literal_or_str(text.strip())
        return kwargs
    files = [f.strip() for f in spec.split(",") if f.strip()]
    return {"class": "HDFDataset", "files": files}


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets and quotes: ``files=['a','b'],n=3`` -> two items."""
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item.strip()]


def _literal_or_str(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
