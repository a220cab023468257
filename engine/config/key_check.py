"""Every name a config uses gets a verdict before anything runs, so nothing is ignored in silence.

The names are the top-level config keys, the options of each layer of ``network`` and the options of
each dataset dict. Verdicts:

- implemented: honoured as RETURNN defines it;
- no effect: a name RETURNN defines that changes nothing here by design (``no_effect.py`` says why);
  one info line;
- ignored: a RETURNN name this engine does not implement that the user listed in ``ignore_keys``
  (``"chunking"`` for a config key, ``"layer:L2"`` for a layer option, ``"dataset:partitionEpoch"`` for a
  dataset option); one warning naming them;
- not implemented: any other RETURNN name the engine lacks; an error listing all of them at once;
- unknown: neither RETURNN's nor ours; for a config key a warning with a "did you mean" (RETURNN itself
  accepts any key), for a layer or dataset option an error (RETURNN refuses those too);
- exempt: config code's own names: ``_private``, functions, classes and modules (unless the name is a
  key: a function called ``get_network`` is the key).

RETURNN's names come from ``returnn_names_table.py``, generated from its source. Usage::

    findings = config_findings(config)         # plus spec.layer_findings, factory.dataset_findings
    enforce(findings)                          # logs each note once; one ConfigError for the errors
"""
from __future__ import annotations

import difflib
import types
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Collection

from engine.config import keys, returnn_names_table
from engine.config.dim_tags import DimensionTag
from engine.config.loader import Config
from engine.config.no_effect import CONFIG_KEYS as NO_EFFECT_KEYS, NoEffect
from engine.runtime import log
from engine.runtime.errors import ConfigError, EngineError

IMPLEMENTED, NO_EFFECT, IGNORED = "implemented", "no effect", "ignored"
NOT_IMPLEMENTED, UNKNOWN, EXEMPT = "not implemented", "unknown", "exempt"
UNKNOWN_KEY_NOTE = "not a key of this engine nor of RETURNN, so nothing reads it (config code's own names " \
                   "can start with '_')"
_ERROR_WORDS = {NOT_IMPLEMENTED: "names RETURNN defines that this engine does not implement",
                UNKNOWN: "names RETURNN does not know either (typos?)"}


@dataclass(frozen=True)
class Finding:
    kind: str  # "config", "layer" or "dataset"
    owners: tuple[str, ...]  # the layers or datasets (by their key) it was found in; () for the config
    cls: str  # their class; "" for the config
    name: str
    verdict: str
    note: str = ""
    fatal: bool = False
    ignore_entry: str = ""  # what ignore_keys would need to list to run without this name

    @property
    def owners_text(self) -> str:
        """``layer 'fw0'``, ``layers 'fw0', 'bw0'``, ``dataset`` (one created outside a config key)."""
        plural = "s" if len(self.owners) > 1 else ""
        return f"{self.kind}{plural}" + "".join(f" {owner!r}," for owner in self.owners).rstrip(",")

    @property
    def where(self) -> str:
        return "config key" if self.kind == "config" else f"{self.owners_text} ({self.cls})"

    def describe(self) -> str:
        sep = " " if self.kind == "config" else " option "
        return f"{self.where}{sep}{self.name!r}" + (f" {self.note}" if self.note else "")


def merged(findings: list[Finding]) -> list[Finding]:
    """One finding per (kind, class, name, verdict, note): the same option in twelve layers is one line."""
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.kind, f.cls, f.name, f.verdict, f.note, f.fatal, f.ignore_entry), []).append(f)
    return [replace(group[0], owners=tuple(o for f in group for o in f.owners)) for group in groups.values()]


@dataclass(frozen=True)
class Scope:
    """Where names are classified and what is known there."""
    kind: str
    owner: str
    cls: str
    implemented: Collection[str]
    returnn: Collection[str]
    no_effect: dict[str, NoEffect]
    unknown_fatal: bool

    @property
    def ignore_prefix(self) -> str:
        return "" if self.kind == "config" else f"{self.kind}:"


def classify(scope: Scope, values: dict[str, Any], ignored: Collection[str]) -> list[Finding]:
    """A verdict for each name in ``values`` (a config, a layer dict, a dataset dict)."""
    return [_classify(scope, name, value, values, ignored) for name, value in values.items()]


def _classify(scope: Scope, name: str, value: Any, context: dict, ignored: Collection[str]) -> Finding:
    found = partial(Finding, scope.kind, (scope.owner,) if scope.owner else (), scope.cls, name)
    if name in scope.implemented:
        return found(IMPLEMENTED)
    rule = scope.no_effect.get(name)
    if rule is not None and rule.when(value, context):
        shown = f"= {value!r} " if rule.only else ""
        return found(NO_EFFECT, f"{shown}has no effect here: {rule.why}")
    entry = scope.ignore_prefix + name
    if name in scope.returnn or rule is not None:
        only = f"(no effect here only {rule.only}; it is {value!r})" if rule is not None else ""
        if entry in ignored:
            return found(IGNORED, only, ignore_entry=entry)
        return found(NOT_IMPLEMENTED, only, fatal=True, ignore_entry=entry)
    return found(UNKNOWN, _did_you_mean(name, scope), fatal=scope.unknown_fatal)


def _did_you_mean(name: str, scope: Scope) -> str:
    ours = sorted(scope.implemented)
    for candidates in (ours, sorted(set(scope.returnn) - set(ours))):
        same_but_case = [c for c in candidates if c.lower() == name.lower()]
        close = same_but_case or difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
        if close:
            return f"(did you mean {close[0]!r}?)"
    return ""


CONFIG_SCOPE = Scope("config", "", "", keys.KEYS, returnn_names_table.CONFIG_KEYS, NO_EFFECT_KEYS,
                     unknown_fatal=False)


def ignored_names(config: Config) -> frozenset[str]:
    """The entries of ``ignore_keys``: ``"key"``, ``"layer:option"`` or ``"dataset:option"``."""
    entries = config.list("ignore_keys")
    if not all(isinstance(entry, str) for entry in entries):
        raise ConfigError(f"Config key 'ignore_keys' must list names such as ['chunking', 'layer:L2', "
                          f"'dataset:partitionEpoch'], got {entries!r}.")
    for entry in entries:
        if entry in keys.KEYS:
            raise ConfigError(f"Config key 'ignore_keys' lists {entry!r}, which this engine implements: it "
                              "is honoured and cannot be ignored. Remove it from ignore_keys.")
    return frozenset(entries)


def config_findings(config: Config) -> list[Finding]:
    """Verdicts for the config's top-level keys."""
    ignored = ignored_names(config)
    findings = []
    for name in config.keys():
        exemption = _exemption(name, config.value(name))
        findings.append(Finding("config", (), "", name, EXEMPT, exemption) if exemption else
                        _classify(CONFIG_SCOPE, name, config.value(name), config.as_dict(), ignored))
    return findings


def _exemption(name: str, value: Any) -> str:
    if name.startswith("_"):
        return "(config code's own: starts with '_')"
    if isinstance(value, types.ModuleType):
        return "(a module imported by config code)"
    if name in keys.KEYS or name in returnn_names_table.CONFIG_KEYS:
        return ""
    if isinstance(value, type):
        return "(a class defined by config code)"
    if callable(value):
        return "(a function defined by config code)"
    if isinstance(value, DimensionTag):
        return "(a dim tag that extern_data's same_dim_tags_as names)"
    return ""


class _Logged:
    messages: set[str] = set()


def enforce(findings: list[Finding], what: str = "The config",
            error: type[EngineError] = ConfigError) -> None:
    """Log the notes and raise one ``error`` naming every fatal finding, with the ignore_keys entries that
    would run without them."""
    log_notes(findings)
    fatal = [f for f in merged(findings) if f.fatal]
    if fatal:
        raise error(error_text(fatal, what))


def log_notes(findings: list[Finding]) -> None:
    """One info line per name without effect, one warning per unknown config key, one warning for the
    ignored names; each message once per process (networks and datasets are checked again when built)."""
    findings = merged(findings)
    ignored = [f.describe() for f in findings if f.verdict == IGNORED]
    if ignored:
        _log_once(log.WARNING, "Ignored as ignore_keys asks (RETURNN would use them, so this run differs "
                               f"from RETURNN's): {'; '.join(ignored)}.")
    for finding in findings:
        if finding.verdict == NO_EFFECT:
            _log_once(log.INFO, f"{finding.describe()}.")
        elif finding.verdict == UNKNOWN and not finding.fatal:
            _log_once(log.WARNING, f"{finding.describe()}: {UNKNOWN_KEY_NOTE}.")


def error_text(fatal: list[Finding], what: str = "The config") -> str:
    parts = []
    for verdict, words in _ERROR_WORDS.items():  # the fatal verdicts
        group = [f.describe() for f in fatal if f.verdict == verdict]
        if group:
            parts.append(f"{words}: {'; '.join(group)}")
    text = f"{what} cannot run as written. " + ". ".join(p[0].upper() + p[1:] for p in parts) + "."
    entries = sorted({f.ignore_entry for f in fatal if f.verdict == NOT_IMPLEMENTED})
    if entries:
        text += (" RETURNN would use these, so training here would differ from RETURNN's: remove them, or "
                 f"add ignore_keys = {entries!r} to train without them.")
    return text


def _log_once(level: int, message: str) -> None:
    if message not in _Logged.messages:
        _Logged.messages.add(message)
        log.write(level, message, same_on_all_ranks=True)
