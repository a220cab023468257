"""RETURNN's ``DimensionTag`` (``from TFUtil import DimensionTag`` in config code), as far as this engine
has a meaning for it: one dynamic time axis that streams of ``extern_data`` share
(``"same_dim_tags_as": {"t": time_tag}``), which says that they have the same number of frames in every
sequence. ``engine/datasets/streams.py`` reads the tags; batching checks the lengths.
"""
from __future__ import annotations

from typing import Any

from engine.runtime.errors import ConfigError


class _Types:
    """RETURNN's ``DimensionTag.Types`` (``Dim.Types``): the kind of an axis."""

    Batch = "batch"
    Spatial = "spatial"
    Time = "time"
    Feature = "feature"


_TIME_KINDS = (None, _Types.Spatial, _Types.Time)  # None: RETURNN's Unspecified, a config that gives none


class DimensionTag:
    """A dynamic time axis shared by streams: streams whose ``same_dim_tags_as`` name the same tag object
    have the same length in every sequence. RETURNN's other uses of a dim tag (a static ``dimension``,
    feature or batch axes, the tag's methods) have no meaning here and are refused."""

    Types = _Types

    def __init__(self, kind: Any = None, description: str | None = None, dimension: Any = None,
                 **other: Any) -> None:
        what = f"DimensionTag(kind={kind!r}, description={description!r})"
        if other:
            raise ConfigError(f"{what}: this engine's DimensionTag takes kind, description and dimension "
                              f"only, not {', '.join(sorted(other))}: it stands for one dynamic time axis "
                              "that streams of extern_data share (same_dim_tags_as), which needs nothing "
                              "more.")
        if dimension is not None or kind not in _TIME_KINDS:
            refused = f"dimension={dimension!r}" if dimension is not None else f"kind={kind!r}"
            raise ConfigError(f"{what}: {refused} is not supported. This engine's DimensionTag stands for "
                              "one dynamic time axis that streams of extern_data share (same_dim_tags_as "
                              "{'t': tag}: the same number of frames in every sequence); its streams are "
                              "(time, feature) with their feature dim in 'dim', so a static dimension, a "
                              "feature or a batch axis has no tag here. Give kind=DimensionTag.Types.Spatial "
                              "(or Time) and no dimension.")
        if description is not None and not isinstance(description, str):
            raise ConfigError(f"{what}: description must be a str, got {type(description).__name__}.")
        self.kind = kind
        self.description = description
        self.dimension = None

    def __repr__(self) -> str:
        return f"DimensionTag(kind={self.kind!r}, description={self.description!r})"
