"""The streams a model is built for: ``extern_data``, else RETURNN's legacy ``num_inputs``/``num_outputs``,
else the train dataset's own keys; declared dims are checked against the dataset.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.datasets.base import Dataset
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
        outputs = config.typed("num_outputs")
        outputs = outputs if isinstance(outputs, dict) else {"classes": outputs}
        streams = {k: _stream(k, v, default_sparse=True) for k, v in outputs.items()}
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
    """The declared dims must be the data's, or the first step fails deep inside TensorFlow."""
    for key, (dim, sparse) in streams.items():
        if key not in dataset.data_keys:
            raise ConfigError(f"'extern_data'/'num_outputs' declares stream '{key}', but dataset {dataset!r} "
                              f"has only {', '.join(dataset.data_keys)}.")
        actual = (dataset.get_data_dim(key), dataset.is_sparse(key))
        if actual != (dim, sparse):
            raise ConfigError(f"'extern_data'/'num_outputs' declares stream '{key}' with dim {dim} "
                              f"({'sparse' if sparse else 'dense'}), but dataset {dataset!r} has dim "
                              f"{actual[0]} ({'sparse' if actual[1] else 'dense'}).")


def _stream(key: str, value, default_sparse: bool = False) -> tuple[int, bool]:
    """``{"dim": 50, "sparse": True}``, ``(dim, ndim)`` (ndim 1 = sparse) or a plain dim."""
    if isinstance(value, dict) and "dim" in value:
        return int(value["dim"]), bool(value.get("sparse", False))
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1]) == 1
    if isinstance(value, int) and not isinstance(value, bool):
        return value, default_sparse
    raise ConfigError(f"Config 'extern_data'/'num_outputs' entry '{key}' = {value!r} is not understood; "
                      "write {'dim': D, 'sparse': True/False} or (dim, ndim).")
