"""Creating datasets from what users write: a dict, an HDF file list, or ``"Class:kw=v,..."``.

``{"class": "HDFDataset", "files": ["a.hdf"], "seq_ordering": "laplace:.100"}`` -- RETURNN's dict form;
``"a.hdf,b.hdf"`` -- HDF files; ``"Task12AXDataset:num_seqs=1000,seq_ordering=random"`` -- a class
with keyword arguments, each value a Python literal or else taken as a plain string.
"""
from __future__ import annotations

import ast
import inspect
import os
from typing import Any, Collection

import h5py

from engine.config import returnn_names_table as returnn_keys
from engine.config.key_check import IGNORED, NO_EFFECT, Finding, Scope, classify, enforce, ignored_names
from engine.config.loader import Config
from engine.config.no_effect import DATASET_OPTIONS as NO_EFFECT_OPTIONS
from engine.datasets.base import Dataset
from engine.datasets.generated import DummyDataset, LabelFramesDataset, Task12AXDataset
from engine.datasets.hdf_reader import HDFDataset
from engine.datasets.librispeech import LibriSpeechCorpus
from engine.datasets.lm import LmDataset
from engine.datasets.meta import MetaDataset
from engine.datasets.npz import NpzDataset
from engine.datasets.oggzip import OggZipDataset
from engine.datasets.refused import RASR_CLASSES, refusal
from engine.datasets.spec_string import spec_to_kwargs
from engine.datasets.streams import same_length_groups
from engine.datasets.translation import REFUSED_TEXT_CLASSES, TranslationDataset, refused_text_class
from engine.runtime.errors import DataError

DATASET_CLASSES: dict[str, type[Dataset]] = {
    cls.__name__: cls for cls in (HDFDataset, NpzDataset, MetaDataset, OggZipDataset, Task12AXDataset,
                                  DummyDataset, LabelFramesDataset, LibriSpeechCorpus)}
DATASET_CLASSES.update({cls.__name__: cls for cls in (LmDataset, TranslationDataset)})
_ALIASES = {"cache_byte_size": "cache_size", "partitionEpoch": "partition_epoch"}  # RETURNN's old names


def create_dataset(spec: dict | str, *, default_seq_ordering: str | None = None, random_seed_offset: int = 0,
                   cache_size: int | str | None = None, key: str = "", ignored: Collection[str] = (),
                   defaults: dict[str, Any] | None = None) -> Dataset:
    """A dataset from a config value. ``random_seed_offset`` is added to the dict's own (per-rank
    offsets); ``cache_size`` is used by HDF datasets whose dict sets none; ``key`` (``train``, ...) names
    it in messages; ``ignored``: the config's ignore_keys (``"dataset:option"`` entries apply here);
    ``defaults`` (options such as ``chunking``) apply where the dict gives none."""
    cls, kwargs = _class_and_options(spec)
    findings = classify(_scope(cls, key), kwargs, ignored)
    enforce(findings, f"Dataset {key!r}" if key else "The dataset", error=DataError)
    for finding in findings:
        if finding.verdict in (NO_EFFECT, IGNORED):
            del kwargs[finding.name]
    for theirs, ours in _ALIASES.items():
        if theirs in kwargs:
            if ours in kwargs:
                raise DataError(f"{cls.__name__}: give either '{ours}' or its old spelling '{theirs}', "
                                "not both.")
            kwargs[ours] = kwargs.pop(theirs)
    for name, value in (defaults or {}).items():
        if kwargs.get(name) is None and value is not None:
            kwargs[name] = value
    if cls is HDFDataset and "cache_size" not in kwargs and cache_size is not None:
        kwargs["cache_size"] = cache_size
    if default_seq_ordering and "seq_ordering" not in kwargs:
        kwargs["seq_ordering"] = default_seq_ordering
    own_offset = kwargs.get("random_seed_offset") or 0
    if random_seed_offset and isinstance(own_offset, int):  # a non-int is reported by the dataset
        kwargs["random_seed_offset"] = own_offset + random_seed_offset
    _check_required(cls, kwargs)
    if getattr(cls, "nests_datasets", False):  # it creates its sub-datasets here, under the same rules
        kwargs.update(_key=key, _ignored=ignored, _create=create_dataset)
    return cls(**kwargs)


def dataset_findings(spec: dict | str, key: str = "", ignored: Collection[str] = ()) -> list[Finding]:
    """A verdict for every option of a dataset dict, without creating the dataset."""
    cls, kwargs = _class_and_options(spec)
    findings = classify(_scope(cls, key), kwargs, ignored)
    for name, sub_spec in getattr(cls, "sub_dataset_specs", lambda options: {})(kwargs).items():
        findings += dataset_findings(sub_spec, f"{key}/{name}" if key else name, ignored)
    return findings


def _class_and_options(spec: dict | str) -> tuple[type[Dataset], dict[str, Any]]:
    kwargs = spec_to_kwargs(spec)
    class_name = kwargs.pop("class", None)
    if isinstance(class_name, str) and class_name in RASR_CLASSES:
        raise refusal(class_name)
    if isinstance(class_name, str) and class_name in REFUSED_TEXT_CLASSES:
        raise refused_text_class(class_name)
    cls = DATASET_CLASSES.get(class_name) if isinstance(class_name, str) else None
    if cls is None:
        known = "a RETURNN dataset class this engine does not implement" if class_name in \
            returnn_keys.DATASET_OPTIONS else "not a dataset class"
        raise DataError(f"Unknown dataset class {class_name!r} in {_short(spec)} ({known}); this engine "
                        f"implements: {', '.join(DATASET_CLASSES)}.")
    return cls, kwargs


def _scope(cls: type[Dataset], key: str) -> Scope:
    """What a dataset class takes: its constructor's and the common parameters (and RETURNN's spellings)."""
    implemented = set(_ALIASES) | set(_parameters(cls))
    returnn = returnn_keys.DATASET_COMMON_OPTIONS | returnn_keys.DATASET_OPTIONS.get(cls.__name__, set())
    return Scope("dataset", key, cls.__name__, implemented, returnn, NO_EFFECT_OPTIONS, unknown_fatal=True)


def dataset_from_config(config: Config, key: str, *, random_seed_offset: int = 0) -> Dataset | None:
    """The dataset under ``key`` (``train``/``dev``/``eval``), or None when the config has none.

    ``batching`` is the train dataset's default ``seq_ordering``; ``cache_size`` applies to every HDF one.
    ``random_seed`` does not change the data's order, as in RETURNN, whose orders are a function of the
    epoch and ``random_seed_offset`` alone: runs with several seeds see the same data in the same order.
    Streams that ``extern_data`` gives one time axis (``same_dim_tags_as``) become ``same_length_keys``."""
    spec = config.typed(key)
    if not spec:
        return None
    train = key == "train"
    groups = same_length_groups(config)  # a bad same_dim_tags_as is refused before the dataset opens
    dataset = create_dataset(spec, default_seq_ordering=config.str("batching") if train else None,
                             random_seed_offset=random_seed_offset, cache_size=config.value("cache_size"),
                             key=key, ignored=ignored_names(config), defaults=chunking_defaults(config, key))
    dataset.same_length_keys = groups
    return dataset


def chunking_defaults(config: Config, key: str) -> dict[str, Any]:
    """RETURNN's rule: the config's ``chunking`` applies to ``train``; ``dev`` and ``eval`` are not chunked
    unless ``chunk_eval`` is set, or ``chunking`` is 1 (one frame per chunk). A dataset dict's own
    ``chunking`` always wins."""
    chunking = config.typed("chunking")
    if key != "train" and not (config.bool("chunk_eval") or chunking in (1, "1")):
        chunking = 0
    return {"chunking": chunking, "min_chunk_size": config.typed("min_chunk_size")}


def _parameters(cls: type[Dataset]) -> dict[str, inspect.Parameter]:
    params = {}
    for klass in (Dataset, cls):
        params.update((name, p) for name, p in inspect.signature(klass.__init__).parameters.items()
                      if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    return params


def _check_required(cls: type[Dataset], kwargs: dict[str, Any]) -> None:
    missing = sorted(name for name, p in _parameters(cls).items()
                     if p.default is p.empty and name not in kwargs)
    if missing:
        raise DataError(f"{cls.__name__}: required option(s) {', '.join(map(repr, missing))} missing.")


def _short(spec: Any) -> str:
    text = repr(spec)
    return text if len(text) <= 200 else text[:200] + "..."


_CONFIG_SUFFIXES = (".py", ".config")


def is_config_file(path: str) -> bool:
    """Whether the tools may execute ``path`` as a Python config: it says so by its name (``.py``,
    ``.config``) or by a ``#!`` first line. A file that merely is not HDF or ``.npz`` (a typo, a log, a
    corpus in another format) must not be run as code."""
    if path.endswith(_CONFIG_SUFFIXES):
        return True
    with open(path, "rb") as f:
        return f.read(2) == b"#!"


def dataset_from_cli_arg(arg: str, *, which: str = "train") -> Dataset:
    """For the tools: a config file (its ``which`` dataset; see ``is_config_file``), a dict literal, a
    ``.npz`` file, an HDF file list or a ``"Class:kw=v"`` string."""
    if arg.lstrip().startswith("{"):
        try:
            spec = ast.literal_eval(arg)
        except (ValueError, SyntaxError) as exc:
            raise DataError(f"Dataset dict {arg!r} is not a Python literal: {exc}.") from None
        return create_dataset(spec)
    if os.path.isfile(arg) and arg.endswith(".npz"):
        return create_dataset({"class": "NpzDataset", "file": arg})
    looks_like_hdf = arg.lower().endswith((".hdf", ".h5", ".hdf5")) or "," in arg
    if os.path.isfile(arg) and not looks_like_hdf and not h5py.is_hdf5(arg):
        if not is_config_file(arg):
            raise DataError(f"'{arg}' is not an HDF5 file, not a .npz archive and not a config file, so "
                            f"it is not read: a config must end in {' or '.join(_CONFIG_SUFFIXES)} or "
                            "start with a '#!' line (only those are executed as Python).")
        config = Config.from_sources([arg], [])
        if not config.has(which):
            raise DataError(f"Config file '{arg}' defines no '{which}' dataset (its keys: "
                            f"{', '.join(sorted(config.keys()))}).")
        return create_dataset(config.typed(which), cache_size=config.value("cache_size"),
                              default_seq_ordering=config.value("batching") if which == "train" else None)
    return create_dataset(arg)
