"""Text -> symbols -> indices the way RETURNN's ``LmDataset`` does it with a symbol list
(``orth_symbols_file`` / ``orth_symbols_map_file``), i.e. RETURNN's ``parse_orthography`` and the
replacement loop of ``LmDataset._collect_single_seq``.

A line becomes symbols: characters (or whitespace-separated words with ``word_based``), a ``[...]`` span
being one symbol (upper-cased unless ``upper_case_special`` is False); ``remove_chars`` ("(){}") are
dropped first, whitespace runs collapsed, the ends stripped, and ``prefix`` / ``postfix`` added. Then
``orth_replace_map_file`` (JSON with ``//`` and ``/* */`` comments; each value parsed into symbols) maps
symbols to lists of symbols; runs of the space symbol (``word_end_symbol`` in character mode with one)
collapse to one. With ``auto_replace_unknown_symbol`` a symbol missing from the vocabulary is added to
the replacement map as ``unknown_symbol`` and the whole sequence is replaced again (the map applied a
second time, as in RETURNN); otherwise the sequence is invalid.
"""
from __future__ import annotations

import ast
import json
import pickle
import re
from typing import Any, Callable

from engine.runtime import log
from engine.runtime.errors import DataError

PARSE_OPTIONS = ("prefix", "postfix", "remove_chars", "collapse_spaces", "final_strip", "word_based",
                 "upper_case_special", "square_brackets_for_specials")
_WHITESPACE = re.compile(r"\s")  # for str patterns: the characters of str.isspace()
_DICT_START = re.compile("^{[\"'].+[\"']:[0-9]+,")  # RETURNN's test: a dict literal, not "symbol index" lines


def split_symbols(text: str, *, word_based: bool = False, upper_case_special: bool = True,
                  square_brackets_for_specials: bool = True) -> list[str]:
    """Characters or words; ``[...]`` one symbol. No stripping: spaces are kept as symbols (characters) or
    separate words (an empty word between two spaces)."""
    if not (square_brackets_for_specials and "[" in text):  # the same as the loop below, much faster
        if not word_based:
            return list(text)
        words = _WHITESPACE.split(text) if text else []
        return words[1:] if text[:1].isspace() else words  # leading whitespace opens no empty word
    out: list[str] = []
    depth = 0  # nesting inside [...]
    for c in text:
        if depth:
            depth += (c == "[") - (c == "]")
            out[-1] += c.upper() if upper_case_special else c
        elif square_brackets_for_specials and c == "[":
            depth = 1
            if out and not out[-1]:
                out[-1] = c
            else:
                out.append(c)
        elif not word_based:
            out.append(c)
        elif c.isspace():
            out.append("")
        else:
            if not out:
                out.append("")
            out[-1] += c
    return out


def parse_orthography(text: str, *, prefix: Any = (), postfix: Any = ("[END]",), remove_chars: str = "(){}",
                      collapse_spaces: bool = True, final_strip: bool = True, **split_opts: Any) -> list[str]:
    for c in remove_chars:
        text = text.replace(c, "")
    if collapse_spaces:
        text = " ".join(text.split())
    if final_strip:
        text = text.strip()
    return list(prefix) + split_symbols(text, **split_opts) + list(postfix)


def read_symbols_file(path: str, owner: str) -> tuple[list[str], dict[str, int]]:
    """``orth_symbols_file``: one symbol a line, the line number its index (of repeats the last counts)."""
    lines = _read_text(path, owner, "orth_symbols_file").splitlines()
    return lines, {sym: i for i, sym in enumerate(lines)}


def read_symbols_map_file(path: str, owner: str) -> tuple[list[str], dict[str, int]]:
    """``orth_symbols_map_file``: a pickled dict (``.pkl``), a dict literal, or lines ``symbol index``."""
    where = f"{owner}: orth_symbols_map_file '{path}'"
    if path.endswith(".pkl"):
        try:
            with open(path, "rb") as f:
                index = pickle.load(f)
        except OSError as exc:
            raise DataError(f"{where} cannot be read: {exc.strerror or exc}.") from None
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise DataError(f"{where} is not a pickle: {exc}.") from None
        if not isinstance(index, dict):
            raise DataError(f"{where}: expected a pickled dict symbol -> index, got {type(index).__name__}.")
        pairs = [(i, sym) for sym, i in index.items()]
    else:
        content = _read_text(path, owner, "orth_symbols_map_file")
        if _DICT_START.search(content[:1024].replace(" ", "").replace("\n", "")):
            try:
                index = ast.literal_eval(content)
            except (ValueError, SyntaxError) as exc:
                raise DataError(f"{where} looks like a dict literal but is not one: {exc}.") from None
            pairs = [(i, sym) for sym, i in index.items()]
        else:
            pairs = []
            for n, line in enumerate(content.splitlines(), 1):
                fields = line.split(None, 1)
                if len(fields) != 2 or not fields[1].strip().lstrip("-").isdigit():
                    raise DataError(f"{where}, line {n}: expected 'symbol index', found {line!r}.")
                pairs.append((fields[1], fields[0]))
    try:
        pairs = sorted((int(i), str(sym)) for i, sym in pairs)
    except (TypeError, ValueError):
        raise DataError(f"{where}: every index must be an integer.") from None
    by_index = dict(pairs)  # of symbols sharing an index, the last in sorted order names it (as in RETURNN)
    if not pairs or pairs[0][0] != 0 or list(by_index) != list(range(len(by_index))):
        raise DataError(f"{where}: the indices must be 0..N-1 without gaps; found {len(by_index)} distinct "
                        f"indices from {pairs[0][0] if pairs else None} to "
                        f"{pairs[-1][0] if pairs else None}.")
    return list(by_index.values()), {sym: i for i, sym in pairs}


def read_replace_map(path: str, word_based: bool, owner: str) -> dict[str, list[str]]:
    """``orth_replace_map_file``: a JSON object symbol -> text, comments allowed."""
    where = f"{owner}: orth_replace_map_file '{path}'"
    try:
        content = json.loads(_without_json_comments(_read_text(path, owner, "orth_replace_map_file")))
    except ValueError as exc:
        raise DataError(f"{where} is not JSON (comments allowed): {exc}.") from None
    if not isinstance(content, dict) or not all(isinstance(v, str) for v in content.values()):
        raise DataError(f"{where}: expected a JSON object of symbol -> replacement text.")
    return {key: split_symbols(value, word_based=word_based) for key, value in content.items()}


def _without_json_comments(text: str) -> str:
    """Drop ``//`` (to the line's end) and ``/* */`` comments outside JSON strings."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            ends = [p for p in (text.find("\n", i), text.find("\r", i)) if p >= 0]
            i = min(ends) if ends else n
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = end + 2 if end >= 0 else n
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _read_text(path: str, owner: str, option: str) -> str:
    try:
        with open(path, encoding="utf8") as f:
            return f.read()
    except OSError as exc:
        raise DataError(f"{owner}: {option} '{path}' cannot be read: {exc.strerror or exc}.") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{owner}: {option} '{path}' is not UTF-8 text: {exc}.") from None


class LogBudget:
    """RETURNN's ``log_*`` options: True logs always, False never, N the first N times."""

    def __init__(self, value: Any, option: str, owner: str, level: int = log.INFO) -> None:
        if not isinstance(value, (bool, int)) or value < 0:
            raise DataError(f"{owner}: {option} must be a bool or a count >= 0, got {value!r}.")
        self.value, self.option, self.level = value, option, level

    def __call__(self, message: str, stop_note: str) -> None:
        if not self.value:
            return
        log.write(self.level, message)
        if not isinstance(self.value, bool):
            self.value -= 1
            if not self.value:
                log.write(self.level, f"{stop_note} ({self.option} reached)")


class InvalidSequence(Exception):
    """A symbol that is not in the vocabulary (and no automatic replacement)."""


class SymbolTokenizer:
    """Lines -> indices with a symbol vocabulary (see the module's text). Stateful as RETURNN's: automatic
    replacements are remembered for later sequences."""

    def __init__(self, index: dict[str, int], *, word_based: bool, word_end_symbol: str | None,
                 seq_end_symbol: str | None, unknown_symbol: str | None, parse_orth_opts: dict | None,
                 replace_map: dict[str, list[str]], auto_replace_unknown_symbol: bool,
                 log_auto_replace: LogBudget, owner: str) -> None:
        self.index, self.word_based, self.unknown_symbol = index, word_based, unknown_symbol
        opts = dict(parse_orth_opts or {})
        unknown = sorted(set(opts) - set(PARSE_OPTIONS))
        if unknown:
            raise DataError(f"{owner}: parse_orth_opts {unknown} are not options of RETURNN's "
                            f"parse_orthography ({', '.join(PARSE_OPTIONS)}).")
        opts.setdefault("word_based", word_based)
        char_word_end = bool(word_end_symbol) and not word_based
        ends = [word_end_symbol] if char_word_end else []
        opts.setdefault("postfix", ends + ([seq_end_symbol] if seq_end_symbol is not None else []))
        self.parse_opts = opts
        self.replace_map = dict(replace_map)
        if char_word_end:
            self.replace_map[" "] = [word_end_symbol]
        self.space = word_end_symbol if char_word_end else " "
        self.auto_replace = bool(auto_replace_unknown_symbol)
        if self.auto_replace and unknown_symbol is not None and unknown_symbol not in index:
            # RETURNN would replace the unknown symbol by itself for ever
            raise DataError(f"{owner}: auto_replace_unknown_symbol needs unknown_symbol "
                            f"{unknown_symbol!r} in the vocabulary (or unknown_symbol None, which drops "
                            "unknown symbols).")
        self.log_auto_replace = log_auto_replace

    def symbols(self, text: str) -> list[str]:
        syms = parse_orthography(text, **self.parse_opts)
        while True:
            # the set tests skip the Python loops for the many lines they would not change
            if not self.replace_map.keys().isdisjoint(syms):
                syms = [r for s in syms for r in self.replace_map.get(s, (s,))]
            if self.space in syms:
                collapsed: list[str] = []
                for s in syms:
                    if not (s == self.space and collapsed and collapsed[-1] == self.space):
                        collapsed.append(s)
                syms = collapsed
            if not self.auto_replace or self.index.keys() >= set(syms):
                return syms
            missing = next(s for s in syms if s not in self.index)
            self.log_auto_replace(f"LmDataset: unknown orth symbol {missing!r}, now replaced by "
                                  f"{self.unknown_symbol!r}", "LmDataset: no more notes on unknown symbols")
            self.replace_map[missing] = [self.unknown_symbol] if self.unknown_symbol is not None else []

    def ids(self, text: str) -> list[int]:
        syms = self.symbols(text)
        try:
            return list(map(self.index.__getitem__, syms))
        except KeyError as exc:
            shown = repr(syms) if self.word_based else repr("".join(syms))
            raise InvalidSequence(f"symbol {exc.args[0]!r} of {shown} is not in the vocabulary") from None


def text_post_processor(value: Any, owner: str,
                        option: str = "targets_post_process") -> Callable[[str], str] | None:
    """``targets_post_process`` (or ``option``, e.g. ``orth_post_process``): a function str -> str or a list
    of them (applied in turn); RETURNN's named text cleaners are refused."""
    if not value:
        return None
    functions = list(value) if isinstance(value, (list, tuple)) else [value]
    for f in functions:
        if isinstance(f, str):
            raise DataError(f"{owner}: {option} {f!r} names one of RETURNN's text cleaners in "
                            "returnn/datasets/lm.py (some need the 'inflect' or 'unidecode' packages), which "
                            "are not implemented here; give a function "
                            "str -> str instead.")
        if not callable(f) or not isinstance(f("test"), str):
            raise DataError(f"{owner}: {option} must be a function str -> str (or a list of "
                            f"them), got {f!r}.")

    def chained(text: str) -> str:
        for f in functions:
            text = f(text)
        return text
    return chained
