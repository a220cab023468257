"""The axes of a layer's output, and RETURNN's axis strings resolved on them.

Every layer output here is time-major: (T, B, *spatial, F), where T has per-sequence lengths and the
spatial axes (made by ``split_dims``, 2-D ``conv`` and ``pool``) and the feature axis F have static sizes.
``Layout`` describes the part after (T, B). RETURNN names axes by strings (``"T"``, ``"F"``, ``"static"``,
``"s:1"``, ...; ``Data.get_axes_from_description``); ``resolve_axes`` gives the axes such a string names
in the engine's tensor, counted as RETURNN counts them in its batch-major view (B, T, *spatial, F): the
spatial axes are T and the static spatial axes, in that order, and the static axes are the static
spatial axes and F.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple

from engine.runtime.errors import ConfigError

TIME, BATCH = 0, 1  # the engine's tensor axes


class Layout(NamedTuple):
    """The static axes of a (T, B, *spatial, F) output: the spatial sizes and the feature dim."""

    spatial: tuple[int, ...]
    feature: int

    @property
    def ndim(self) -> int:
        return 3 + len(self.spatial)

    @property
    def feature_axis(self) -> int:
        return self.ndim - 1

    def static_axes(self) -> list[int]:
        return list(range(2, self.ndim))

    def size(self, axis: int) -> int:
        """The static size of ``axis`` (not T or B)."""
        return (*self.spatial, self.feature)[axis - 2]

    def describe(self) -> str:
        return "(" + ", ".join(["T", "B", *map(str, self.spatial), f"F={self.feature}"]) + ")"


def _indexed(axes: list[int], text: str, layer: str, option: str, layout: Layout) -> list[int]:
    index = int(text.split(":")[1])
    if not -len(axes) <= index < len(axes):
        raise ConfigError(f"Network layer '{layer}': {option} {text!r} names no axis of its input "
                          f"{layout.describe()}.")
    return [axes[index]]


def _resolve_one(layout: Layout, given: str, layer: str, option: str) -> list[int]:
    text = given.lower()  # RETURNN compares them case-insensitively
    spatial = [TIME] + list(range(2, layout.feature_axis))  # RETURNN's spatial axes: all but B and F
    named = {"b": [BATCH], "batch": [BATCH], "t": [TIME], "time": [TIME], "t?": [TIME],
             "f": [layout.feature_axis], "feature": [layout.feature_axis],
             "non_spatial": [layout.feature_axis], "spatial": spatial, "spatial_except_time": spatial[1:],
             "dyn": [TIME], "dynamic": [TIME], "static": layout.static_axes(),
             "except_time": layout.static_axes(), "except_batch": [TIME] + layout.static_axes(),
             "*": [TIME, BATCH] + layout.static_axes()}
    if text in named:
        return named[text]
    if re.fullmatch(r"(s|spatial):-?\d+", text):
        return _indexed(spatial, given, layer, option, layout)
    if re.fullmatch(r"static:-?\d+", text):
        return _indexed(layout.static_axes(), given, layer, option, layout)
    if re.fullmatch(r"(d|dyn|dynamic):-?\d+", text):
        return _indexed([TIME], given, layer, option, layout)
    if re.fullmatch(r"except_batch:-?\d+", text):
        return _indexed([TIME] + layout.static_axes(), given, layer, option, layout)
    if re.fullmatch(r"dim:\d+", text):
        size = int(text.split(":")[1])
        found = [a for a in layout.static_axes() if layout.size(a) == size]
        if len(found) != 1:
            raise ConfigError(f"Network layer '{layer}': {option} {given!r} must name exactly one axis of "
                              f"its input {layout.describe()}, found {len(found)}.")
        return found
    if set(text) <= set("btf"):
        return [axis for letter in text for axis in _resolve_one(layout, letter, layer, option)]
    if text.startswith(("stag:", "stag-single:", "tag:")):
        raise ConfigError(f"Network layer '{layer}': {option} {given!r} names a dim tag; this engine's axes "
                          "carry no tag names yet: name the axis by position ('s:1', 'static:0', 'F', ...).")
    raise ConfigError(f"Network layer '{layer}': {option} {given!r} is not one of RETURNN's axis strings "
                      "('T', 'B', 'F', 'spatial', 's:<i>', 'static', 'static:<i>', 'except_time', "
                      "'except_batch', 'dim:<n>', ...).")


def resolve_axes(layout: Layout, description: Any, *, layer: str, option: str) -> list[int]:
    """The engine's axes (0 = T, 1 = B, then the static ones) that ``description`` names, without repeats.
    Integers are refused: RETURNN counts them in whatever order its tensor has, which is not this one."""
    items = [description] if isinstance(description, str) else description
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
        raise ConfigError(f"Network layer '{layer}': {option} must be an axis string like 'F' or 'static', "
                          f"or a list of them, got {description!r} (axes by number are not taken: name "
                          "them).")
    axes: list[int] = []
    for item in items:
        axes += [axis for axis in _resolve_one(layout, item, layer, option) if axis not in axes]
    return axes


def _time_names(description: Any) -> list[bool]:
    items = description if isinstance(description, (list, tuple)) else [description]
    return [isinstance(item, str) and item.lower() in ("t", "time") for item in items]


def reduces_time(opts: dict) -> bool:
    """A reduce's options name the time axis alone, with keep_dims (one frame is left)."""
    named = _time_names(opts.get("axes", opts.get("axis")))
    return named == [True] and opts.get("keep_dims") is True


def reduces_time_to_vector(opts: dict) -> bool:
    """A reduce's options name the time axis alone, without keep_dims: one vector per sequence, which
    only a rec unit reads here (as ``base:``)."""
    named = _time_names(opts.get("axes", opts.get("axis")))
    return named == [True] and opts.get("keep_dims", False) is False


def reduces_time_away(opts: dict) -> bool:
    """A reduce's options name the time axis ("T") among others: its output would have no time axis and
    other axes reduced, which no layer here gives (``rnn.py --check`` refuses it without TensorFlow)."""
    return (any(_time_names(opts.get("axes", opts.get("axis")))) and not reduces_time(opts)
            and not reduces_time_to_vector(opts))
