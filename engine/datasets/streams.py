"""The streams a model is built for: ``extern_data``, else RETURNN's legacy ``num_inputs``/``num_outputs``,
else the train dataset's own keys; declared dims are checked against the dataset. Streams of ``extern_data``
whose ``same_dim_tags_as`` name one ``DimensionTag`` share their time axis (``same_length_groups``): their
lengths must be equal in every sequence, which batching checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config.dim_tags import DimensionTag
from engine.datasets.base import Dataset
from engine.runtime import log
from engine.runtime.errors import ConfigError


@dataclass
class DataDims:
    input_dim: int
    input_sparse: bool
    target_dims: dict[str, int]


def data_dims(config: Any, dataset: Dataset | None) -> DataDims:
    """From ``extern_data``, else ``num_inputs``/``num_outputs``, else the dataset."""
    if config.has("extern_data"):
        streams = {k: _stream(k, v) for k, v in config.dict("extern_data").items()}
    elif config.has("num_inputs") or config.has("num_outputs"):
        # as RETURNN reads them: a plain num_outputs is the config's target's; num_outputs' own "data"
        # entry comes before num_inputs
        outputs = config.typed("num_outputs")
        target = config.value("target") if isinstance(config.value("target"), str) else "classes"
        outputs = outputs if isinstance(outputs, dict) else {target: outputs}
        streams = {k: _stream(k, v, default_sparse=True) for k, v in outputs.items()}
        if "data" not in streams:
            streams["data"] = _stream("data", config.typed("num_inputs"))
    elif dataset is not None:
        streams = {k: (dataset.get_data_dim(k), dataset.is_sparse(k)) for k in dataset.data_keys}
    else:
        raise ConfigError("Cannot tell the input and output dims: set 'extern_data' (or 'num_inputs' and "
                          "'num_outputs'), or give a 'train' dataset.")
    if dataset is not None:
        _check_against_dataset(streams, dataset)
    if "data" not in streams:
        raise ConfigError(f"The input stream 'data' is missing (streams: {', '.join(sorted(streams))}).")
    dim, sparse = streams.pop("data")
    return DataDims(dim, sparse, {k: d for k, (d, s) in streams.items() if s})


def _check_against_dataset(streams: dict[str, tuple[int, bool]], dataset: Dataset) -> None:
    """The declared dims must be the data's, or the first step fails deep inside TensorFlow. A declared
    stream the dataset lacks is read by no step, as in RETURNN (2022-swb-factored-hybrid declares streams
    its network computes); one that a loss or layer reads is named when the batches are planned."""
    for key, (dim, sparse) in streams.items():
        if key not in dataset.data_keys and key != "data":
            log.info(f"'extern_data'/'num_outputs' declares stream '{key}', which dataset {dataset!r} does "
                     "not have: nothing may read it (a network computes it, or no layer uses it).")
            continue
        if key not in dataset.data_keys:
            raise ConfigError(f"'extern_data'/'num_outputs' declares stream '{key}', but dataset {dataset!r} "
                              f"has only {', '.join(dataset.data_keys)}.")
        actual = (dataset.get_data_dim(key), dataset.is_sparse(key))
        if actual != (dim, sparse):
            raise ConfigError(f"'extern_data'/'num_outputs' declares stream '{key}' with dim {dim} "
                              f"({'sparse' if sparse else 'dense'}), but dataset {dataset!r} has dim "
                              f"{actual[0]} ({'sparse' if actual[1] else 'dense'}).")


# RETURNN's keys of an extern_data entry that this engine takes (what each means: _described_stream)
_ENTRY_KEYS = ("dim", "sparse", "dtype", "shape", "available_for_inference", "same_dim_tags_as")
_TIME_AXES = ("t", "T")  # RETURNN's names of the time axis, the one axis same_dim_tags_as may tag here


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _described_stream(key: str, entry: dict) -> tuple[int, bool]:
    """RETURNN's ``{"dim": D, "sparse": ...}`` of one stream with a time axis: ``shape`` and ``dtype`` only as
    RETURNN's defaults for it, ``available_for_inference`` (which streams forward and search read is this
    engine's rule: the input only), ``same_dim_tags_as`` for the time axis (``_time_tag``). Other dim tags,
    streams without a time axis or with more axes are refused."""
    where = f"Config 'extern_data' entry '{key}'"
    unknown = sorted(set(entry) - set(_ENTRY_KEYS))
    if unknown:
        raise ConfigError(f"{where} has {unknown}, which this engine does not take: its streams are (time, "
                          "feature) per sequence with their own lengths (or one time axis that streams "
                          "share by same_dim_tags_as), without RETURNN's dim tags of other axes (dim_tags); "
                          f"it takes {', '.join(_ENTRY_KEYS)}.")
    _time_tag(where, entry)
    sparse = entry.get("sparse", False)
    if not isinstance(sparse, bool) or not _positive(entry.get("dim")):
        raise ConfigError(f"{where}: 'dim' must be a positive int and 'sparse' True or False, got dim "
                          f"{entry.get('dim')!r}, sparse {sparse!r} (a stream of class ids needs its number "
                          "of classes here).")
    dim = entry["dim"]
    shape = entry.get("shape")
    if shape is not None and tuple(shape) != ((None,) if sparse else (None, dim)):
        raise ConfigError(f"{where}: shape {tuple(shape)!r} is not supported: a stream here is "
                          f"{'(None,)' if sparse else f'(None, {dim})'} (a time axis, and the features), "
                          "not one without a time axis or with more axes.")
    dtype = entry.get("dtype")
    if dtype is not None and dtype not in (("int32", "int64") if sparse else ("float32",)):
        kind = "sparse" if sparse else "dense"
        raise ConfigError(f"{where}: dtype {dtype!r} is not supported for a {kind} "
                          f"stream (it takes {'int32 or int64' if sparse else 'float32'}).")
    if not isinstance(entry.get("available_for_inference", True), bool):
        raise ConfigError(f"{where}: available_for_inference must be True or False.")
    return dim, sparse


def _time_tag(where: str, entry: dict) -> DimensionTag | None:
    """The tag of the entry's ``same_dim_tags_as`` ``{"t": tag}`` (None without one): a DimensionTag that
    config code made, which streams share as one time axis."""
    tags = entry.get("same_dim_tags_as")
    if tags is None:
        return None
    if not isinstance(tags, dict):
        raise ConfigError(f"{where}: same_dim_tags_as must be a dict {{'t': tag}}, got {tags!r}.")
    axes = [axis for axis in tags if axis not in _TIME_AXES]
    if axes:
        raise ConfigError(f"{where}: same_dim_tags_as names axis {axes[0]!r}, which is not supported: only "
                          "the time axis ('t' or 'T') may have a tag here, as streams are (time, feature) "
                          "with the feature dim in 'dim'.")
    for value in tags.values():
        if not isinstance(value, DimensionTag):
            raise ConfigError(f"{where}: same_dim_tags_as gives the time axis {value!r}, which is not a "
                              "DimensionTag: make one in the config (from TFUtil import DimensionTag; "
                              "time_tag = DimensionTag(kind=DimensionTag.Types.Spatial, description='time')) "
                              "and give the same object to every stream of that time axis.")
    if len({id(value) for value in tags.values()}) > 1:
        raise ConfigError(f"{where}: same_dim_tags_as gives 't' and 'T' different tags, but both name the "
                          "one time axis.")
    return next(iter(tags.values()), None)


def same_length_groups(config: Any) -> list[tuple[str, ...]]:
    """The streams of ``extern_data`` that share a time axis (``same_dim_tags_as`` with the same
    DimensionTag object), in extern_data's order; only groups of two or more. Such streams have the same
    number of frames in every sequence (``generate_batches`` checks it)."""
    extern = config.typed("extern_data")
    if not isinstance(extern, dict):
        return []  # absent, or refused where the streams are read (data_dims)
    groups: dict[int, list[str]] = {}
    for key, entry in extern.items():
        tag = _time_tag(f"Config 'extern_data' entry '{key}'", entry) if isinstance(entry, dict) else None
        if tag is not None:
            groups.setdefault(id(tag), []).append(key)
    return [tuple(keys) for keys in groups.values() if len(keys) >= 2]


def _stream(key: str, value, default_sparse: bool = False) -> tuple[int, bool]:
    """``{"dim": 50, "sparse": True}``, ``(dim, ndim)`` (ndim 1 = sparse) or a plain dim."""
    if isinstance(value, dict):
        return _described_stream(key, value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and _positive(value[0]) and value[1] in (1, 2):
        return value[0], value[1] == 1
    if _positive(value):
        return value, default_sparse
    raise ConfigError(f"Config 'extern_data'/'num_outputs' entry '{key}' = {value!r} is not understood; "
                      "write {'dim': D, 'sparse': True/False} or (dim, ndim).")
