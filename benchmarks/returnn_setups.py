"""RETURNN's published experiment setups (a checkout of ``rwth-i6/returnn-experiments``), read as a new user
of this engine would bring them: each config's ``network`` dict, its stream dims and its ``target``.

A config is Python that RETURNN runs with a ``config`` object in its namespace and RETURNN's modules on
the path. Here each top-level statement runs on its own, in the config's namespace, with:

- RETURNN's modules (``Pretrain``, ``TFUtil``, ``returnn.*``, ...) and any other module that does not
  import replaced by stand-ins whose every attribute and call is again a stand-in;
- ``config`` a stand-in whose ``value``/``int``/``bool``/... return the default they are given
  (``has`` says False), as RETURNN's does for a key the config does not set;
- a statement that fails (a corpus file of the authors' cluster that is missing, an ``assert`` on it) is
  skipped, so the ``network`` written further down is still read.

What is left is the dict a user's ``network`` would be; whether this engine accepts it is for the
benchmark to find. The code is the configs' own, so run this only on a checkout you trust (as RETURNN
would run it). The namespace, ``sys.path``, ``sys.modules`` and the working directory are restored after
each config, and its stand-in modules dropped.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

SETUP_YEARS = ("2018", "2019", "2020", "2021", "2022")
STATEMENT_SECONDS = 10


class StandIn:
    """Whatever a RETURNN name is used as: attributes and calls give more stand-ins."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, key: str) -> "StandIn":
        if key.startswith("__"):
            raise AttributeError(key)
        return StandIn(f"{self._name}.{key}")

    def __call__(self, *args: Any, **kwargs: Any) -> "StandIn":
        return StandIn(f"{self._name}()")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __repr__(self) -> str:
        return f"<stand-in for {self._name}>"


class _StandInModule(types.ModuleType):
    def __getattr__(self, key: str) -> StandIn:
        if key.startswith("__"):
            raise AttributeError(key)
        return StandIn(f"{self.__name__}.{key}")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: only modules that nothing else can import become stand-ins."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec:
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _ConfigStandIn:
    """RETURNN's ``config`` object for a config that sets no other keys: every getter gives its default."""

    def value(self, key: str, default: Any = None, *args: Any, **kwargs: Any) -> Any:
        return default

    typed_value = opt_typed_value = int = float = bool = list = value

    def has(self, key: str) -> bool:
        return False

    def is_true(self, key: str, default: bool = False) -> bool:
        return default

    def __getattr__(self, key: str) -> StandIn:
        return StandIn(f"config.{key}")


@dataclass
class Setup:
    path: str  # relative to the checkout
    namespace: dict[str, Any] = field(default_factory=dict)
    problem: str = ""  # why nothing could be read (the file does not parse)
    failed_statements: int = 0

    @property
    def network(self) -> dict | None:
        network = self.namespace.get("network")
        return network if isinstance(network, dict) else None


def setup_paths(root: str, years: tuple[str, ...] = SETUP_YEARS) -> list[str]:
    """The ``*.config`` files under the checkout's folders of those years (``2019-asr-.../...``)."""
    found = []
    for folder in sorted(os.listdir(root)):
        if folder.split("-")[0] in years and os.path.isdir(os.path.join(root, folder)):
            for directory, _, files in os.walk(os.path.join(root, folder)):
                found += [os.path.relpath(os.path.join(directory, f), root)
                          for f in files if f.endswith(".config")]
    return sorted(found)


def read_setup(root: str, path: str) -> Setup:
    setup = Setup(path)
    full = os.path.join(root, path)
    try:
        with open(full, encoding="utf8", errors="replace") as f:
            tree = ast.parse(f.read(), full)
    except (SyntaxError, ValueError) as exc:  # RASR's own .config files are not Python
        setup.problem = f"not Python: {type(exc).__name__}: {exc}"
        return setup
    setup.namespace = {"__file__": full, "__name__": "__returnn_config__", "config": _ConfigStandIn()}
    with _sandbox(os.path.dirname(full)):
        for statement in tree.body:
            try:
                with _time_limit(STATEMENT_SECONDS):
                    exec(compile(ast.Module([statement], []), full, "exec"), setup.namespace)
            except Exception:  # noqa: BLE001 - a statement the authors' cluster needed; see the module doc
                setup.failed_statements += 1
    return setup


@contextlib.contextmanager
def _sandbox(directory: str) -> Iterator[None]:
    saved_path, saved_modules, saved_cwd = list(sys.path), set(sys.modules), os.getcwd()
    finder = _StandInFinder()
    sys.meta_path.append(finder)
    try:
        os.chdir(directory)
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - saved_modules:
            if isinstance(sys.modules[name], _StandInModule):
                del sys.modules[name]
        sys.path[:] = saved_path
        os.chdir(saved_cwd)


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"statement ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
