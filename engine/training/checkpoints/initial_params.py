"""Parameters from other checkpoints, with RETURNN's semantics: ``load``, ``import_model_train_epoch1`` and
``preload_from_files``, each from this engine's checkpoint or from RETURNN's TensorFlow one
(``returnn_files.py`` tells them apart, ``returnn_format.py`` maps RETURNN's names and layouts).

When each applies (RETURNN's ``EngineBase.get_epoch_model`` and ``Engine.init_network_from_config``):

- training that starts at epoch 1 (no checkpoint of the ``model`` prefix to continue): first the
  ``load_on_init`` of subnetworks in rec units (RETURNN's initial values of their variables); then the
  ``preload_from_files`` entries with ``init_for_train``, in the sorted order of their names; then
  ``import_model_train_epoch1``, else ``load`` (with an explicit ``start_epoch = 1``: ``load``, else
  ``import_model_train_epoch1``);
- eval, forward and search: first ``load_on_init``, then the entries without ``init_for_train``, then the
  model (``load``, ``load_epoch`` or the newest checkpoint).
- A training that continues from its own checkpoint takes everything from it (RETURNN would take a
  ``load_on_init`` subnetwork's variables from that file again: the same values where the subnetwork is
  not trainable, as in RETURNN's published setups).

A parameter that one of these loaded is not loaded again by a later one: the first entry wins, and the
model does not overwrite what an entry gave (RETURNN marks such variables and skips them).

Names are those of the file's format: RETURNN's (``lstm/rec/W_re``) for RETURNN's files, this engine's
(``lstm/W``) for its own. The options of an entry:

- ``prefix`` P: only the parameters whose name contains P are loaded, each from the file's variable named
  without it (RETURNN's ``load_if_prefix``: ``lm_output/W`` from ``output/W`` with P = ``lm_``);
- ``ignore_params``, ``ignore_params_prefixes``: parameters with these names (after the prefix is
  removed) are not loaded, and a variable of the file with such a name is not an unused one;
- ``var_name_mapping`` {name: name in the file}: where a parameter's own name is not in the file;
- ``ignore_missing``: a parameter that is not in the file keeps its value (at least one must be loaded).

Anything else that does not fit is a ConfigError naming the file and the parameters: a parameter missing
in the file, a variable of the file that no parameter reads (unused), another shape. ``load`` and
``import_model_train_epoch1`` take the whole network. Not parameters, so never unused: variables
without a layer (``global_step``, an optimizer's ``beta1_power``) and optimizer slots (``output/W/Adam``,
under another variable of the file). A ``load`` of this engine's own file with nothing preloaded is
``file_format.load_checkpoint``, unchanged.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from engine.config.loader import Config
from engine.runtime import log
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.file_format import load_checkpoint
from engine.training.checkpoints.preload_options import PreloadEntry, preload_entries
from engine.training.checkpoints.reading import read_checkpoint
from engine.training.checkpoints.returnn_files import FORMAT as RETURNN_FORMAT
from engine.training.checkpoints.returnn_files import open_checkpoint, returnn_prefix
from engine.training.checkpoints.returnn_format import ReturnnView

ENGINE_FORMAT = "this engine's format"
SHOWN = 10  # names listed per kind of mismatch


class View(Protocol):
    """A model's parameters under the names of one checkpoint format."""

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def assign(self, values: dict[str, np.ndarray]) -> None: ...

    def describe(self, name: str) -> str: ...

    def hint(self, missing: list[str], unused: list[str]) -> str: ...


class EngineView:
    """This engine's names (``NetworkModel.named_variables``: ``<layer>/<param>``)."""

    def __init__(self, model) -> None:
        self.variables = model.named_variables()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(var.shape) for name, var in self.variables.items()}

    def assign(self, values: dict[str, np.ndarray]) -> None:
        for name, value in values.items():
            var = self.variables[name]
            var.assign(np.asarray(value, var.dtype.as_numpy_dtype))

    def describe(self, name: str) -> str:
        return name

    def hint(self, missing: list[str], unused: list[str]) -> str:
        return ""


@dataclass
class Stored:
    """A checkpoint's variables, either format."""

    path: str
    format: str
    shapes: dict[str, tuple[int, ...]]
    read: Callable[[str], np.ndarray]


@dataclass(frozen=True)
class Options:
    """What one load takes from its file (see the module's docstring)."""

    what: str  # the config key, for messages: "load", "preload_from_files['lm']"
    prefix: str = ""
    ignore_missing: bool = False
    ignore_params: tuple[str, ...] = ()
    ignore_params_prefixes: tuple[str, ...] = ()
    var_name_mapping: dict[str, str] = field(default_factory=dict)
    # load_on_init: the file's format -> the prefix every selected parameter has, removed for its name in
    # the file (RETURNN's params_prefix); variables of the file no parameter reads are then no error
    within: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, entry: PreloadEntry) -> "Options":
        return cls(entry.where, entry.prefix, entry.ignore_missing, entry.ignore_params,
                   entry.ignore_params_prefixes, entry.var_name_mapping)

    def ignores(self, name: str) -> bool:
        return name in self.ignore_params or name.startswith(tuple(self.ignore_params_prefixes))


class Loaded:
    """The parameters loaded so far, in both namings (one load may use RETURNN's, the next this engine's).
    A RETURNN name counts as loaded when it was loaded itself or every engine parameter it feeds was; an
    engine parameter when it was loaded itself or all the RETURNN variables it is made of were."""

    def __init__(self, model) -> None:
        self.engine: set[str] = set()
        self.returnn: set[str] = set()
        self.sources: dict[str, tuple[str, ...]] = {}  # engine parameter -> RETURNN names
        try:
            self.sources = {f"{m.layer}/{key}": names for m in ReturnnView(model).mappings
                            for key, names in m.sources().items()}
        except ConfigError:  # no RETURNN names (get_model): only this engine's files load, by its names
            pass

    def has(self, name: str, returnn: bool) -> bool:
        if returnn:
            fed = [param for param, names in self.sources.items() if name in names]
            return name in self.returnn or bool(fed) and all(param in self.engine for param in fed)
        names = self.sources.get(name, ())
        return name in self.engine or bool(names) and all(n in self.returnn for n in names)

    def add(self, names: set[str], returnn: bool) -> None:
        if returnn:
            self.returnn |= names
            self.engine |= {param for param, sources in self.sources.items() if set(sources) <= self.returnn}
        else:
            self.engine |= names
            self.returnn |= {n for param in names for n in self.sources.get(param, ())}

    @property
    def empty(self) -> bool:
        return not self.engine and not self.returnn


def open_params(path: str, model, what: str) -> tuple[Stored, View]:
    """The checkpoint at ``path`` (RETURNN's or this engine's; ``what``: the key that names it) and the
    model's view in its naming."""
    prefix = returnn_prefix(path)
    if prefix is not None:
        try:
            checkpoint = open_checkpoint(prefix)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
        return Stored(prefix, RETURNN_FORMAT, checkpoint.shapes, checkpoint.read), ReturnnView(model)
    if not os.path.isfile(path):
        raise ConfigError(f"{what}: checkpoint '{path}' does not exist (neither this engine's checkpoint "
                          f"file nor RETURNN's '{path}.index').")
    params = read_checkpoint(path).groups.get("params", {})
    return (Stored(path, ENGINE_FORMAT, {n: tuple(v.shape) for n, v in params.items()}, params.__getitem__),
            EngineView(model))


def load_params(path: str, model, options: Options, loaded: Loaded) -> set[str]:
    """Load what ``options`` select from ``path`` into ``model``, except what ``loaded`` has; returns the
    names (of the file's format) loaded, and adds them to ``loaded``."""
    stored, view = open_params(path, model, options.what)
    returnn = stored.format == RETURNN_FORMAT
    model_shapes = view.shapes()
    wanted: dict[str, str] = {}  # parameter -> its name in the file (before var_name_mapping)
    within = options.within.get(stored.format)
    for name in model_shapes:
        source = name
        if within is not None:
            if not name.startswith(within):
                continue
            source = name[len(within):]
        if options.prefix:
            if options.prefix not in name:
                continue
            source = name.replace(options.prefix, "")
        if not options.ignores(source):
            wanted[name] = source
    if not wanted:
        raise ConfigError(f"{options.what}: no parameter of the network is selected for loading from "
                          f"'{stored.path}' (prefix {options.prefix!r}, ignore_params, "
                          f"ignore_params_prefixes); parameters: {', '.join(list(model_shapes)[:SHOWN])}.")
    found: dict[str, str] = {}  # parameter -> the file's variable it is read from
    missing: list[str] = []
    for name, source in wanted.items():
        mapped = options.var_name_mapping.get(source)
        if source in stored.shapes:
            found[name] = source
        elif mapped is not None and mapped in stored.shapes:
            found[name] = mapped
        else:
            missing.append(name if mapped is None else f"{name} (var_name_mapping: {mapped!r})")
    unused = [name for name in stored.shapes if name not in found.values() and not options.ignores(name)
              and not _bookkeeping(name, stored.shapes)]
    wrong = [f"{name}: checkpoint {stored.shapes[source]}, network {model_shapes[name]}"
             for name, source in found.items() if stored.shapes[source] != model_shapes[name]]
    if missing and options.ignore_missing:
        log.warning(f"{options.what}: {len(missing)} parameter(s) not in '{stored.path}' keep their values "
                    f"(ignore_missing): {', '.join(missing[:SHOWN])}.")
        missing = []
    if unused and options.within:
        log.info(f"{options.what}: {len(unused)} variable(s) of '{stored.path}' are read by no parameter of "
                 f"it (as RETURNN, not an error): {', '.join(unused[:SHOWN])}.")
        unused = []
    if missing or unused or wrong:
        raise ConfigError(_mismatch(stored, view, options, missing, unused, wrong))
    if not found:
        raise ConfigError(f"{options.what}: none of the {len(wanted)} selected parameters is in "
                          f"'{stored.path}' ({stored.format}).")
    todo = {name: source for name, source in found.items() if not loaded.has(name, returnn)}
    view.assign({name: stored.read(source) for name, source in todo.items()})
    loaded.add(set(todo), returnn)
    skipped = len(found) - len(todo)
    log.info(f"{options.what}: loaded {len(todo)} parameter(s) from '{stored.path}' ({stored.format})"
             + (f"; {skipped} came from an earlier preload_from_files entry already" if skipped else ""))
    return set(todo)


def _bookkeeping(name: str, names: dict) -> bool:
    """Not a layer's parameter: no layer in its name, or an optimizer slot under another variable."""
    if "/" not in name:
        return True
    parts = name.split("/")
    return any("/".join(parts[:i]) in names for i in range(1, len(parts)))


def _mismatch(stored: Stored, view: View, options: Options, missing: list[str], unused: list[str],
              wrong: list[str]) -> str:
    parts = []
    for label, names in (("missing in the checkpoint", [view.describe(n) for n in missing]),
                         ("in the checkpoint but read by no parameter", unused),
                         ("different shapes", wrong)):
        if names:
            more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            parts.append(f"{label}: {'; '.join(names[:SHOWN])}{more}")
    hint = view.hint(missing, unused)
    if options.what.startswith("preload_from_files"):
        advice = (f"The options of {options.what} choose what is loaded: prefix, ignore_missing, "
                  "ignore_params, ignore_params_prefixes, var_name_mapping.")
    else:
        advice = ("Was it saved with another network config? A partial load is preload_from_files (with "
                  "ignore_missing, ignore_params, ...).")
    return (f"Checkpoint '{stored.path}' ({stored.format}) does not fit the network ({options.what}): "
            + "; ".join(parts) + ". " + (hint + " " if hint else "") + advice)


def _preload(config: Config, model, loaded: Loaded, for_training: bool) -> None:
    for entry in preload_entries(config):
        if entry.init_for_train == for_training:
            load_params(entry.filename, model, Options.of(entry), loaded)


def _load_model(path: str, what: str, model, loaded: Loaded) -> None:
    """The whole network from ``path``, after the preloads."""
    if loaded.empty and os.path.isfile(path) and returnn_prefix(path) is None:
        load_checkpoint(path, model.named_variables())  # this engine's file, as it always was
        return
    load_params(path, model, Options(what), loaded)


def _load_on_init(model, loaded: Loaded) -> None:
    """The parameters of the subnetworks of rec units with ``load_on_init``
    (``engine/model/rec/unit_subnetwork.py``), first: RETURNN makes them the variables' initial values,
    which its later loads (preload_from_files, load, the model's checkpoint) then skip."""
    for rec_name, subnetwork, path in getattr(model, "load_on_init", lambda: [])():
        within = {RETURNN_FORMAT: f"{rec_name}/rec/{subnetwork}/", ENGINE_FORMAT: f"{rec_name}/{subnetwork}/"}
        what = f"Network layer '{rec_name}', unit layer '{subnetwork}': load_on_init"
        load_params(path, model, Options(what, within=within), loaded)


def init_for_training(config: Config, model) -> str | None:
    """Rank 0, training that starts at epoch 1: the subnetworks' ``load_on_init``, the preloads with
    ``init_for_train``, then ``import_model_train_epoch1`` or ``load``. Returns the file the whole network
    came from, if any."""
    loaded = Loaded(model)
    _load_on_init(model, loaded)
    _preload(config, model, loaded, for_training=True)
    explicit_start = config.typed("start_epoch") not in ("auto", None)
    keys = ("load", "import_model_train_epoch1") if explicit_start else ("import_model_train_epoch1", "load")
    for key in keys:
        if config.str(key):
            _load_model(config.str(key), key, model, loaded)
            return config.str(key)
    return None


def load_for_inference(config: Config, model, path: str, what: str = "load") -> None:
    """Rank 0, eval and forward: the subnetworks' ``load_on_init``, the preloads without
    ``init_for_train``, then the model from ``path``
    (``what``: the key that named it, for messages)."""
    loaded = Loaded(model)
    _load_on_init(model, loaded)
    _preload(config, model, loaded, for_training=False)
    _load_model(path, what, model, loaded)
