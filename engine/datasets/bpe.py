"""Byte-pair encoding with a subword-nmt codes file, segmenting text the way RETURNN's ``BytePairEncoding``
vocabulary does (the algorithm of subword-nmt's ``apply_bpe.py``, Sennrich et al. 2016).

A codes file lists merge operations, one pair of symbols a line, best first; an optional first line
``#version: 0.2`` says that the end-of-word marker ``</w>`` is glued to the last character (version 0.1,
the default, gives it a symbol of its own). A word is split into characters and the best-ranked pair
present is merged until no listed pair is left. With a vocabulary, pieces that are not in it are split
again by undoing merges. All pieces but a word's last carry the ``@@`` suffix.

Details kept because they change the labels: the first of duplicate codes counts; a word that is a
single symbol under version 0.2 is returned as it is, without the vocabulary check; RETURNN's category
syntax passes ``$word`` and the ``{ ... }`` after it through unsegmented.
"""
from __future__ import annotations

from typing import Collection, Iterator

from engine.runtime.errors import DataError

MERGE_SUFFIX = "@@"
_END = "</w>"


class BpeCodes:
    """The merges of one codes file and, optionally, the vocabulary that pieces are checked against."""

    def __init__(self, codes_file: str, vocab: Collection[str] | None = None) -> None:
        self.codes_file = codes_file
        try:
            with open(codes_file, "rb") as f:
                lines = f.read().decode("utf8").splitlines()
        except OSError as exc:
            raise DataError(f"BPE codes file '{codes_file}' cannot be read: {exc.strerror}.") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"BPE codes file '{codes_file}' is not UTF-8 text: {exc}.") from None
        self.version = _version(lines[0] if lines else "", codes_file)
        codes = [tuple(line.split()) for line in lines]
        short = next((i for i, code in enumerate(codes) if len(code) < 2), None)
        if short is not None:
            raise DataError(f"BPE codes file '{codes_file}', line {short + 1}: expected a pair of symbols, "
                            f"found {lines[short]!r}.")
        # Built from the last line up, so that the first of duplicate codes keeps its rank; the
        # same order decides which pair a merged symbol is undone into when two pairs make it.
        self.ranks = {code: rank for rank, code in reversed(list(enumerate(codes)))}
        self.origin = {code[0] + code[1]: code for code in self.ranks}
        self.vocab = frozenset(vocab) if vocab else None
        self._cache: dict[str, tuple[str, ...]] = {}

    def segment(self, sentence: str) -> list[str]:
        """Whitespace-separated words -> pieces, ``@@`` on all but each word's last."""
        out: list[str] = []
        in_category = in_braces = False
        for word in sentence.split():
            if word[0] == "$" and len(word) > 1:
                in_category = True
                out.append(word)
            elif in_category and word[0] == "{":
                in_braces = True
                out.append(word)
            elif in_braces and word[0] != "}":
                out.append(word)
            else:
                in_category = in_braces = False
                pieces = self.encode_word(word)
                out.extend(piece + MERGE_SUFFIX for piece in pieces[:-1])
                out.append(pieces[-1])
        return out

    def encode_word(self, word: str) -> tuple[str, ...]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = tuple(word) + (_END,) if self.version == (0, 1) else tuple(word[:-1]) + (word[-1] + _END,)
        if len(symbols) < 2:
            return (word,)
        symbols = self._merge(symbols)
        if symbols[-1] == _END:
            symbols = symbols[:-1]
        elif symbols[-1].endswith(_END):
            symbols = symbols[:-1] + (symbols[-1].replace(_END, ""),)
        if self.vocab is not None:
            symbols = self._in_vocab(symbols)
        self._cache[word] = symbols
        return symbols

    def _merge(self, symbols: tuple[str, ...]) -> tuple[str, ...]:
        never = len(self.ranks) + 1
        while len(symbols) > 1:
            pairs = set(zip(symbols, symbols[1:]))
            best = min(pairs, key=lambda pair: self.ranks.get(pair, never))
            if best not in self.ranks:
                break
            merged: list[str] = []
            i = 0
            while i < len(symbols):
                if symbols[i] == best[0] and i + 1 < len(symbols) and symbols[i + 1] == best[1]:
                    merged.append(best[0] + best[1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = tuple(merged)
        return symbols

    def _in_vocab(self, symbols: tuple[str, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for piece in symbols[:-1]:
            out.extend([piece] if piece + MERGE_SUFFIX in self.vocab else self._split(piece, final=False))
        last = symbols[-1]
        out.extend([last] if last in self.vocab else self._split(last, final=True))
        return tuple(out)

    def _split(self, piece: str, final: bool) -> Iterator[str]:
        """Undo merges until every part is in the vocabulary or cannot be split any more."""
        pair = self.origin.get(piece + _END) if final else self.origin.get(piece)
        if pair is None or len(pair) != 2:
            yield piece
            return
        left, right = pair
        if final:
            right = right[:-len(_END)]
        if left + MERGE_SUFFIX in self.vocab:
            yield left
        else:
            yield from self._split(left, final=False)
        if (right in self.vocab) if final else (right + MERGE_SUFFIX in self.vocab):
            yield right
        else:
            yield from self._split(right, final)


def _version(first_line: str, codes_file: str) -> tuple[int, ...]:
    if not first_line.startswith("#version:"):
        return (0, 1)
    text = first_line.split()[-1]
    parts = text.split(".")
    while len(parts) > 1 and parts[-1].strip("0") == "":  # "0.2.0" is 0.2
        parts.pop()
    try:
        version = tuple(int(p) for p in parts)
    except ValueError:
        version = ()
    if version not in ((0, 1), (0, 2)):
        raise DataError(f"BPE codes file '{codes_file}' has version '{text}'; subword-nmt's versions 0.1 and "
                        "0.2 are read.")
    return version
