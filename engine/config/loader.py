"""The config: RETURNN-style Python or JSON files plus ``++key value`` overrides, with typed getters.

Rules (``docs/config-and-cli.md``): files load in order; overrides are applied before the files
(so config code can read e.g. ``task``) and again after (so they win). An override of a key that holds a
non-str value is parsed as a literal of that type; otherwise it stays a string and the typed getter
converts it when the key is read.
"""
from __future__ import annotations

import ast
import builtins
import json
import os
import re
import traceback
from typing import Any, Iterable

from engine.config import keys
from engine.config.returnn_imports import config_builtins
from engine.runtime.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_MISSING = object()
# a getter's default when the caller gives none: the key's default in engine/config/keys.py
_LISTED = object()


def parse_bool(text: str) -> bool | None:
    """``1/0/true/false/yes/no/on/off`` (any case) to a bool; None when it is none of them."""
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    return None


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _MISSING


def _convert(key: str, text: str, expected: type) -> Any:
    """Convert an override/str value to ``expected``, or raise a ConfigError naming key, value and type."""
    if expected is bool:
        value = parse_bool(text)
        if value is None:
            lit = _literal(text)
            value = bool(lit) if isinstance(lit, (int, float)) and not isinstance(lit, bool) else None
    elif expected is int:
        lit = _literal(text)
        ok = isinstance(lit, int) and not isinstance(lit, bool)
        value = lit if ok else (int(lit) if isinstance(lit, float) and lit.is_integer() else None)
    elif expected is float:
        lit = _literal(text)
        value = float(lit) if isinstance(lit, (int, float)) and not isinstance(lit, bool) else None
    else:
        lit = _literal(text)
        value = lit if isinstance(lit, expected) else None
        if value is None and expected is tuple and isinstance(lit, list):
            value = tuple(lit)
    if value is None:
        raise ConfigError(
            f"Config key '{key}': the value {text!r} does not parse as {expected.__name__}. "
            f"Give a {expected.__name__} literal (for bool: 1/0/true/false/yes/no/on/off)."
        )
    return value


_JSON_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/', re.S)


def _blank_json_comments(text: str) -> str:
    """``//`` and ``/* */`` comments (outside strings) as spaces, as RETURNN's JSON configs have them;
    newlines stay, so a parse error still names the right line and column."""
    def blank(match: re.Match) -> str:
        token = match.group(0)
        return token if token.startswith('"') else re.sub(r"[^\n]", " ", token)

    return _JSON_TOKEN.sub(blank, text)


def _listed(key: str, default: Any) -> Any:
    return keys.default(key) if default is _LISTED else default


class Config:
    """Config keys and values. Values from Python configs keep their Python types."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})
        self.files: list[str] = []

    # ----- building -----
    @classmethod
    def from_sources(cls, files: Iterable[str], overrides: list[tuple[str, str]]) -> "Config":
        config = cls()
        config.apply_overrides(overrides)
        for path in files:
            config.load_file(path)
        config.apply_overrides(overrides)
        return config

    def apply_overrides(self, overrides: list[tuple[str, str]]) -> None:
        for key, text in overrides:
            if text.startswith("+-"):
                text = text[1:]
            current = self._values.get(key)
            if current is None or isinstance(current, str):
                self._values[key] = text
            else:
                self._values[key] = _convert(key, text, type(current))

    def load_file(self, path: str) -> None:
        if not os.path.isfile(path):
            raise ConfigError(f"Config file '{path}' does not exist (working directory: {os.getcwd()}).")
        try:
            with open(path, encoding="utf-8") as f:
                content = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Config file '{path}' cannot be read: {exc}.") from None
        if content.lstrip().startswith("{"):
            self._load_json(path, content)
        else:
            self._load_python(path, content)
        self.files.append(path)

    def _load_json(self, path: str, content: str) -> None:
        try:
            values = json.loads(_blank_json_comments(content))
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"Config file '{path}' is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}."
            ) from None
        if not isinstance(values, dict):
            raise ConfigError(f"Config file '{path}': a JSON config must be an object of keys and values.")
        self._values.update(values)

    def _load_python(self, path: str, content: str) -> None:
        try:
            tree = ast.parse(content, path)
            code = compile(tree, path, "exec")
        except SyntaxError as exc:
            raise ConfigError(
                f"Config file '{path}' has a syntax error at line {exc.lineno}: {exc.msg}."
                + (f" The line reads: {exc.text.strip()!r}." if exc.text else "")
            ) from None
        namespace: dict[str, Any] = dict(self._values)
        # config code imports RETURNN's module names (TFUtil, returnn.tf.compat, ...): returnn_imports.py
        namespace.update(config=self, __file__=os.path.abspath(path), __name__="__config__",
                         __builtins__=config_builtins(path, tree))
        try:
            exec(code, namespace)
        except Exception as exc:  # config code is user code: report file and line, not our stack
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
            where = f" at line {frames[-1].lineno}" if frames else ""
            raise ConfigError(
                f"Config file '{path}' failed while executing{where}: {type(exc).__name__}: {exc}."
            ) from None
        for key, value in namespace.items():
            if key.startswith("__") or key == "config":
                continue
            self._values[key] = value

    # ----- access -----
    def has(self, key: str) -> bool:
        return key in self._values

    __contains__ = has

    def keys(self) -> list[str]:
        return list(self._values)

    def set(self, key: str, value: Any) -> None:
        self._values[key] = value

    def value(self, key: str, default: Any = None) -> Any:
        """The raw value as stored (a str for overrides of unknown keys), no listed default."""
        return self._values.get(key, default)

    def typed(self, key: str, default: Any = _LISTED) -> Any:
        """The value with Python type; a str override that is a Python literal is evaluated."""
        value = self._values.get(key, _listed(key, default))
        if isinstance(value, str):
            lit = _literal(value)
            return value if lit is _MISSING else lit
        return value

    def _get(self, key: str, default: Any, expected: type) -> Any:
        value = self._values.get(key, _MISSING)
        if value is _MISSING or value is None:
            return _listed(key, default)
        if isinstance(value, str) and expected is not str:
            return _convert(key, value, expected)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if expected is bool and isinstance(value, int):
            return bool(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(
                f"Config key '{key}' must be {expected.__name__}, but it is {type(value).__name__} {value!r}."
            )
        return value

    def int(self, key: str, default: Any = _LISTED) -> int | None:
        return self._get(key, default, int)

    def float(self, key: str, default: Any = _LISTED) -> float | None:
        return self._get(key, default, float)

    def bool(self, key: str, default: Any = _LISTED) -> bool | None:
        return self._get(key, False if default is _LISTED and key not in keys.KEYS else default, bool)

    def str(self, key: str, default: Any = _LISTED) -> str | None:
        value = self._values.get(key)
        if value is None:
            return _listed(key, default)
        return value if isinstance(value, str) else builtins.str(value)

    def list(self, key: str, default: Any = _LISTED) -> list | None:
        value = self._values.get(key)
        if value is None:
            return _listed(key, default)
        if isinstance(value, str):
            lit = _literal(value) if value.strip().startswith(("[", "(")) else _MISSING
            if lit is _MISSING:
                return [part.strip() for part in value.split(",") if part.strip()]
            value = lit
        if isinstance(value, (list, tuple)):
            return builtins.list(value)
        raise ConfigError(f"Config key '{key}' must be a list, but it is {type(value).__name__} {value!r}.")

    def dict(self, key: str, default: Any = _LISTED) -> dict | None:
        return self._get(key, default, dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)
