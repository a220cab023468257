"""``preload_from_files``: its entries and their options, checked without TensorFlow (``rnn.py --check``
reports a bad entry too). What the options do: ``initial_params.py``.

``preload_from_files = {name: {"filename": ..., ...}, ...}``, as in RETURNN's TensorFlow engine: the
entries apply in the sorted order of their names, and an option RETURNN does not know is an error here
(RETURNN ignores it, so a typo such as ``ignore_mising`` would silently load everything).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.runtime.errors import ConfigError

KEY = "preload_from_files"
OPTIONS = ("filename", "prefix", "init_for_train", "ignore_missing", "ignore_params",
           "ignore_params_prefixes", "var_name_mapping")
# RETURNN's options that are not implemented, and why
REFUSED = {"custom_missing_load_func": "a config function that makes values for missing parameters; not "
                                       "implemented here (use ignore_missing, or var_name_mapping)"}


@dataclass(frozen=True)
class PreloadEntry:
    name: str  # the entry's key in preload_from_files
    filename: str
    prefix: str = ""  # load only the parameters whose name contains it, from the name without it
    init_for_train: bool = False  # True: when training starts at epoch 1; False: for eval and forward
    ignore_missing: bool = False
    ignore_params: tuple[str, ...] = ()
    ignore_params_prefixes: tuple[str, ...] = ()
    var_name_mapping: dict[str, str] = field(default_factory=dict)  # parameter name -> name in the file

    @property
    def where(self) -> str:
        return f"{KEY}[{self.name!r}]"


def preload_entries(config: Any) -> list[PreloadEntry]:
    """The entries of ``preload_from_files`` in RETURNN's order (sorted by name); [] when unset."""
    value = config.typed(KEY)
    if not value:
        return []
    if not isinstance(value, dict):
        raise ConfigError(f"Config key '{KEY}' must be a dict of entries {{name: {{'filename': ..., ...}}}}, "
                          f"got {type(value).__name__}.")
    return [_entry(str(name), opts) for name, opts in sorted(value.items(), key=lambda item: str(item[0]))]


def _entry(name: str, opts: Any) -> PreloadEntry:
    where = f"{KEY}[{name!r}]"
    if not isinstance(opts, dict):
        raise ConfigError(f"Config key {where} must be a dict with 'filename' and options "
                          f"({', '.join(OPTIONS[1:])}), got {opts!r}.")
    refused = [f"{key!r} ({REFUSED[key]})" for key in opts if key in REFUSED]
    unknown = sorted(str(key) for key in opts if key not in OPTIONS and key not in REFUSED)
    if refused or unknown:
        parts = ([f"not implemented: {'; '.join(refused)}"] if refused else []) + \
            ([f"unknown option(s) {unknown}"] if unknown else [])
        raise ConfigError(f"Config key {where}: {'; '.join(parts)}. Its options: {', '.join(OPTIONS)}.")
    filename = opts.get("filename")
    if not isinstance(filename, str) or not filename:
        raise ConfigError(f"Config key {where}: 'filename' must name a checkpoint, got {filename!r}.")
    prefix = opts.get("prefix", "") or ""
    if not isinstance(prefix, str):
        raise ConfigError(f"Config key {where}: 'prefix' must be a string, got {prefix!r}.")
    flags = {}
    for key in ("init_for_train", "ignore_missing"):
        flags[key] = opts.get(key, False)
        if not isinstance(flags[key], bool):
            extra = (" (RETURNN's PyTorch engine also takes 'always', which its TensorFlow engine treats as "
                     "True)") if key == "init_for_train" else ""
            raise ConfigError(f"Config key {where}: {key!r} must be True or False, got "
                              f"{flags[key]!r}{extra}.")
    names = {key: _names(where, key, opts.get(key, ()))
             for key in ("ignore_params", "ignore_params_prefixes")}
    mapping = opts.get("var_name_mapping") or {}
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in mapping.items()):
        raise ConfigError(f"Config key {where}: 'var_name_mapping' must map parameter names to names in the "
                          f"checkpoint (str -> str), got {mapping!r}.")
    return PreloadEntry(name, filename, prefix, var_name_mapping=dict(mapping), **flags, **names)


def _names(where: str, key: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple, set, frozenset)) or not all(isinstance(v, str) for v in items):
        raise ConfigError(f"Config key {where}: {key!r} must be a list of parameter names, got {value!r}.")
    return tuple(items)
