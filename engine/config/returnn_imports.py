"""RETURNN's module names that config code imports, resolved inside config code only.

RETURNN's configs import from RETURNN: ``from returnn.tf.compat import v1 as tf`` and ``from TFUtil import
where_bc`` inside SpecAugment functions, ``from Pretrain import WrapEpochValue`` or ``from TFUtil import
DimensionTag`` at the top. A config file here runs with ``__builtins__`` whose ``__import__`` answers
``returnn`` and ``returnn.*``, and RETURNN's old top-level names (``TFUtil``, ``TFCompat``, ``Pretrain``,
``Util``, ...: ``OLD_NAMES``), with this engine's objects (``PROVIDED``); ``tensorflow`` is TensorFlow's
``tf.compat.v1`` for a file whose code calls names only TensorFlow 1 has (``_tensorflow``); every other
import is Python's own.
Nothing is put into ``sys.modules``: a real RETURNN in the same process is never shadowed, and code
outside config files imports as before.

- provided: ``PROVIDED`` (TensorFlow's own ``tf.compat.v1``; small functions of ``returnn_tf_util.py``;
  ``DimensionTag`` of ``dim_tags.py``, a time axis that streams of ``extern_data`` share);
- importable, but an error when used: ``IMPORTABLE_ONLY`` (names configs import at the top and often
  never use, such as ``Data`` and ``Dim``);
- anything else of RETURNN's: a ConfigError naming the module and the name, at the import.

This module does not import TensorFlow; the provided objects load it on first access.
"""
from __future__ import annotations

import ast
import builtins
import functools
import importlib
import os
import types
from typing import Any, Callable

from engine.runtime.errors import ConfigError

# RETURNN's old top-level module names -> the module of the ``returnn`` package they stand for (RETURNN's
# own aliases). ``rnn`` and ``better_exchook`` are left out: this engine has an ``rnn.py`` of its own, and
# better_exchook is a package of its own.
OLD_NAMES = {name: f"returnn.{module}" for name, module in {
    "BundleFile": "datasets.bundle_file", "CachedDataset": "datasets.cached",
    "CachedDataset2": "datasets.cached2", "Config": "config", "Dataset": "datasets.basic",
    "Debug": "util.debug", "DebugHelpers": "util.debug_helpers", "EngineBase": "engine.base",
    "EngineBatch": "engine.batch", "Fsa": "util.fsa", "GeneratingDataset": "datasets.generating",
    "HDFDataset": "datasets.hdf", "HyperParamTuning": "tf.hyper_param_tuning",
    "LearningRateControl": "learning_rate_control", "LmDataset": "datasets.lm", "Log": "log",
    "MetaDataset": "datasets.meta", "NativeOp": "native_op",
    "NormalizationData": "datasets.normalization_data", "NumpyDumpDataset": "datasets.numpy_dump",
    "Pretrain": "pretrain", "RawWavDataset": "datasets.raw_wav", "SprintCache": "sprint.cache",
    "SprintControl": "sprint.control", "SprintDataset": "datasets.sprint",
    "SprintErrorSignals": "sprint.error_signals", "SprintExternInterface": "sprint.extern_interface",
    "SprintInterface": "sprint.interface", "StereoDataset": "datasets.stereo",
    "TaskSystem": "util.task_system", "TFCompat": "tf.compat", "TFDataPipeline": "tf.data_pipeline",
    "TFDistributed": "tf.distributed", "TFEngine": "tf.engine", "TFHorovod": "tf.horovod",
    "TFKenLM": "tf.util.ken_lm", "TFNativeOp": "tf.native_op", "TFNetwork": "tf.network",
    "TFNetworkLayer": "tf.layers.basic", "TFNetworkRecLayer": "tf.layers.rec",
    "TFNetworkSegModLayer": "tf.layers.segmental_model",
    "TFNetworkSigProcLayer": "tf.layers.signal_processing", "TFSprint": "tf.sprint",
    "TFUpdater": "tf.updater", "TFUtil": "tf.util.basic", "Util": "util.basic",
}.items()}

_TF_UTIL = "engine.config.returnn_tf_util"


def _from(module: str, name: str) -> Callable[[], Any]:
    return lambda: getattr(importlib.import_module(module), name)


def _tf_compat(version: str) -> Callable[[], Any]:
    def load() -> Any:
        import tensorflow as tf

        return getattr(tf.compat, version)

    return load


def cleanup_env_var_path(env_var: str, path_prefix: str) -> None:
    """RETURNN's ``Util.cleanup_env_var_path``: drop the entries of the path list ``env_var`` that are
    ``path_prefix`` or lie below it."""
    if env_var not in os.environ:
        return
    kept = [p for p in os.environ[env_var].split(":")
            if not (p == path_prefix or p.startswith(path_prefix.rstrip("/") + "/"))]
    os.environ[env_var] = ":".join(kept)


def cache_file(filename: str) -> str:
    """RETURNN's ``Util.cf``: i6's cache manager, used on i6's cluster only; anywhere else RETURNN returns
    the file's own name, as here."""
    return filename


_DIMENSION_TAG = _from("engine.config.dim_tags", "DimensionTag")
# RETURNN's module -> name -> a function returning this engine's object
PROVIDED: dict[str, dict[str, Callable[[], Any]]] = {
    "returnn.tf.compat": {"v1": _tf_compat("v1"), "v2": _tf_compat("v2")},
    "returnn.tf.util.basic": {**{name: _from(_TF_UTIL, name) for name in ("where_bc", "safe_log", "safe_exp",
                                                                          "get_shape", "dropout")},
                              "DimensionTag": _DIMENSION_TAG},
    "returnn.tf.util.data": {"DimensionTag": _DIMENSION_TAG},
    "returnn.util.basic": {"cleanup_env_var_path": lambda: cleanup_env_var_path, "cf": lambda: cache_file},
    "returnn.pretrain": {"WrapEpochValue": _from("engine.config.epoch_value", "WrapEpochValue")},
}

_DIM_TAGS = ("RETURNN's tensor descriptions and dim tags; this engine's layers carry (time, batch, feature) "
             "tensors and take no dim tags; its DimensionTag is only a time axis that streams of extern_data "
             "share")
# RETURNN's module -> name -> what it is: importable, but a ConfigError once used
IMPORTABLE_ONLY: dict[str, dict[str, str]] = {
    "returnn.tf.util.basic": {"Data": _DIM_TAGS},
    "returnn.tf.util.data": {name: _DIM_TAGS for name in ("Data", "Dim", "FeatureDim", "SpatialDim")},
    # imported at the top of 28 published configs, called in none
    "returnn.datasets.lm": {"Lexicon": "RETURNN's reader of a Bliss lexicon file (its phonemes and "
                                       "lemmas)"},
}

_MODULES = set(PROVIDED) | set(IMPORTABLE_ONLY)
_PACKAGES = {module.rsplit(".", i)[0] for module in _MODULES for i in range(1, module.count(".") + 1)}
_ALIASES = {v: k for k, v in OLD_NAMES.items()}


def provided_text() -> str:
    """What config code can import from RETURNN here, for error messages."""
    parts = []
    for module in sorted(_MODULES):
        alias = f" ({_ALIASES[module]})" if module in _ALIASES else ""
        only = sorted(IMPORTABLE_ONLY.get(module, {}))
        names = sorted(PROVIDED.get(module, {})) + ([f"(import only: {', '.join(only)})"] if only else [])
        parts.append(f"{module}{alias}: {', '.join(names)}")
    return "; ".join(parts)


class Unavailable:
    """A RETURNN name that config code may import but not use (``IMPORTABLE_ONLY``)."""

    def __init__(self, qualified: str, what: str) -> None:
        self._qualified, self._what = qualified, what

    def _refuse(self) -> ConfigError:
        return ConfigError(f"RETURNN's {self._qualified} ({self._what}) is not available in this engine; "
                           "config code may import it, but not use it.")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._refuse()

    def __repr__(self) -> str:
        return f"<RETURNN's {self._qualified}, not available in this engine>"


class ReturnnModule(types.ModuleType):
    """A module of RETURNN as config code sees it: ``module`` is RETURNN's name for it, ``shown`` the name
    the config imported it by (``TFUtil`` or ``returnn.tf.util.basic``)."""

    def __init__(self, module: str, shown: str) -> None:
        super().__init__(shown, f"RETURNN's {module}, as this engine provides it to config code")
        self._module = module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self._module}.{name}"
        if full in _MODULES or full in _PACKAGES:
            value: Any = ReturnnModule(full, f"{self.__name__}.{name}")
        elif self._module == "returnn" and name in OLD_NAMES:  # returnn.TFUtil: RETURNN's aliases too
            value = ReturnnModule(OLD_NAMES[name], f"returnn.{name}")
        elif name in PROVIDED.get(self._module, {}):
            value = PROVIDED[self._module][name]()
        elif name in IMPORTABLE_ONLY.get(self._module, {}):
            value = Unavailable(f"{self.__name__}.{name}", IMPORTABLE_ONLY[self._module][name])
        else:
            raise ConfigError(f"RETURNN's {self.__name__}.{name} is not provided by this engine. Config code "
                              f"can import from RETURNN: {provided_text()}.")
        setattr(self, name, value)
        return value


def _resolve(name: str) -> str:
    """RETURNN's module name for ``name`` (an old alias resolved); ConfigError when this engine has none."""
    first, _, rest = name.partition(".")
    if first in OLD_NAMES:
        module = OLD_NAMES[first] + (f".{rest}" if rest else "")
    elif first == "returnn" and rest.partition(".")[0] in OLD_NAMES:
        alias, _, tail = rest.partition(".")
        module = OLD_NAMES[alias] + (f".{tail}" if tail else "")
    else:
        module = name
    if module != "returnn" and module not in _MODULES and module not in _PACKAGES:
        raise ConfigError(f"RETURNN's module {name!r} is not provided by this engine. Config code can import "
                          f"from RETURNN: {provided_text()}.")
    return module


def tensorflow_attributes(tree: ast.AST) -> frozenset[str]:
    """The names config code reads of TensorFlow: ``tf.x`` wherever ``tensorflow`` is imported as ``tf``."""
    aliases = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names if alias.name == "tensorflow"}
    return frozenset(node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                     and isinstance(node.value, ast.Name) and node.value.id in aliases)


def _tensorflow(name: str, globals: Any, locals: Any, fromlist: Any, level: int, path: str,
                attributes: frozenset[str]) -> Any:
    """``import tensorflow`` in a config file whose code calls names only TensorFlow 1 has (``tf.log``,
    ``tf.random_uniform``: RETURNN's SpecAugment functions of 2019-2020): ``tf.compat.v1``, the API that
    code was written for, names and semantics (``tf.where`` selects rows there). Such code fails on
    TensorFlow 2's ``tf`` (in RETURNN on TensorFlow 2 too), so no config that runs otherwise changes."""
    module = builtins.__import__(name, globals, locals, fromlist, level)
    tf1_only = sorted(a for a in attributes if not hasattr(module, a) and hasattr(module.compat.v1, a))
    if not tf1_only:
        return module
    if path not in _TOLD:
        _TOLD.add(path)
        from engine.runtime import log

        log.info(f"Config file '{path}': its code imports tensorflow and calls TensorFlow 1's names "
                 f"({', '.join('tf.' + a for a in tf1_only[:4])}{', ...' if len(tf1_only) > 4 else ''}): "
                 "it gets tf.compat.v1, the API it was written for.")
    return module.compat.v1


_TOLD: set[str] = set()


def _import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0, *,
            path: str = "", tensorflow_names: frozenset[str] = frozenset()) -> Any:
    first = name.partition(".")[0]
    if name == "tensorflow" and level == 0 and tensorflow_names:
        return _tensorflow(name, globals, locals, fromlist, level, path, tensorflow_names)
    if level != 0 or not (first == "returnn" or first in OLD_NAMES):
        return builtins.__import__(name, globals, locals, fromlist, level)
    module = _resolve(name)
    if fromlist:  # from X.Y import z: the module X.Y itself, which answers getattr(z)
        return ReturnnModule(module, name)
    # import X.Y (as z): the top name X; Python then walks .Y by attribute
    return ReturnnModule(_resolve(first), first)


def config_builtins(path: str = "", tree: ast.AST | None = None) -> dict[str, Any]:
    """``__builtins__`` for a config file's code: Python's, with RETURNN's module names resolved here
    (``tree``: the file's code, for the TensorFlow names it reads)."""
    namespace = dict(vars(builtins))
    names = tensorflow_attributes(tree) if tree is not None else frozenset()
    namespace["__import__"] = functools.partial(_import, path=path, tensorflow_names=names)
    return namespace
