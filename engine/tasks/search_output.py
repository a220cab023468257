"""What ``task = "search"`` writes and how it scores (the task itself: ``search.py``).

Class ids become text as RETURNN's search makes them (``Engine.search`` in RETURNN's ``tf/engine.py``):
through the target's vocabulary: the ``vocab`` of its ``extern_data`` entry, else one made from the search
data's label names of the target. Labels that are single characters (fewer than 1000 of them) are joined
as they are, and 256 of them in byte order are the bytes of UTF-8 text; other labels are joined with one
space, so a BPE hypothesis reads ``hel@@ lo world``. Without labels there is no text, and RETURNN refuses
to write a file.

Output files, one entry per sequence in corpus order (RETURNN's formats): ``txt`` has one entry a line
(``str`` of it: a hypothesis as it is); ``py`` is a Python dict literal, ``{`` on the first line, then
``'<seq tag>': <entry>,`` per sequence, and ``}`` on the last. An entry is a hypothesis, a beam (a list of
(score, hypothesis) pairs, best first) or a dict of several layers' entries; ``py`` writes it as RETURNN's
``better_repr`` does (``returnn_repr``), a score as numpy writes a float32 (its shortest digits). A name
ending in ``.gz`` is written gzip-compressed (with a zero time stamp, so that equal hypotheses give equal
bytes).

Scores: RETURNN's ``decide`` layer with an ``edit_distance`` loss counts the label edit distance of the
hypothesis to the reference sequence as the data holds it, summed over the sequences and divided by the
references' labels summed. The word error rate does the same on words: the text of a word vocabulary with
BPE's ``@@`` joins undone, or the text of a character vocabulary that has a space, split at whitespace;
the label that ends a hypothesis (the rec unit's ``end`` layer compares the choice with it) is no word, so
a reference's last label is dropped when it is that one.
"""
from __future__ import annotations

import gzip
import io
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from engine.datasets.vocabulary import CharacterTargets, Utf8ByteTargets, Vocabulary, create_vocabulary
from engine.runtime.errors import ConfigError, DataError

FORMATS = ("txt", "py")
_BPE_JOIN = re.compile(r"@@(?: |$)")  # a piece's continuation mark, with its space (or at the end)


def edit_distance(hyp: Sequence, ref: Sequence) -> int:
    """Levenshtein distance: substitutions, insertions and deletions cost 1 each."""
    ref_array = np.asarray(list(ref), dtype=object)
    offsets = np.arange(len(ref_array) + 1)
    row = offsets.copy()
    for token in hyp:
        candidate = np.empty_like(row)
        candidate[0] = row[0] + 1
        candidate[1:] = np.minimum(row[1:] + 1, row[:-1] + (ref_array != token))
        # an insertion runs along the row: new[j] = min over k <= j of candidate[k] + (j - k)
        row = np.minimum.accumulate(candidate - offsets) + offsets
    return int(row[-1])


def vocabulary_from_labels(labels: Sequence[str]) -> Vocabulary:
    """RETURNN's rule for a vocabulary known only by its label names (``create_vocab_from_labels``)."""
    if len(labels) < 1000 and all(len(label) == 1 for label in labels):
        if len(labels) == 256 and all(ord(label) == i for i, label in enumerate(labels)):
            return Utf8ByteTargets()
        return CharacterTargets(labels=list(labels), unknown_label=None)
    return Vocabulary(labels=list(labels), unknown_label=None)


class HypothesisText:
    """Class ids -> the text RETURNN writes, and -> words for the word error rate."""

    def __init__(self, vocab: Vocabulary, end_label: int | None) -> None:
        self.vocab = vocab
        self.end_label = end_label
        by_character = isinstance(vocab, (CharacterTargets, Utf8ByteTargets))
        self.has_words = not by_character or " " in vocab.labels  # characters: words need the space
        self._join_pieces = not by_character

    @classmethod
    def of(cls, extern_vocab: dict | None, labels: Sequence[str], target: str,
           end_label: int | None) -> HypothesisText | None:
        """From the ``extern_data`` entry's ``vocab`` options, else the data's label names; None without
        either."""
        if extern_vocab is not None:
            return cls(create_vocabulary(extern_vocab, owner=f"extern_data '{target}' vocab"), end_label)
        return cls(vocabulary_from_labels(labels), end_label) if labels else None

    def text(self, ids: np.ndarray, tag: str) -> str:
        ids = [int(i) for i in ids]
        if ids and not 0 <= min(ids) <= max(ids) < self.vocab.num_labels:
            raise DataError(f"search: the hypothesis of sequence '{tag}' has class ids outside the "
                            f"vocabulary's {self.vocab.num_labels} labels: {ids}.")
        try:
            return self.vocab.get_seq_labels(ids)
        except UnicodeDecodeError as exc:
            raise DataError(f"search: the hypothesis of sequence '{tag}' is not UTF-8 text ({exc.reason}); "
                            "its byte labels cannot be written.") from None

    def words(self, ids: np.ndarray, tag: str) -> list[str]:
        ids = list(ids)
        if ids and self.end_label is not None and ids[-1] == self.end_label:
            ids = ids[:-1]
        text = self.text(np.asarray(ids, np.int64), tag)
        return (_BPE_JOIN.sub("", text) if self._join_pieces else text).split()


class BeamScore(float):
    """A float32 score that prints as numpy prints a float32 (``-0.9266699``), as in RETURNN's files."""

    def __repr__(self) -> str:
        return str(np.float32(self))

    __str__ = __repr__


def returnn_repr(value: Any) -> str:
    """RETURNN's ``better_repr``: a list one item a line (each with a comma), a dict by sorted keys (one
    item a line once its items are 40 characters or longer), a tuple on one line, NaN and Inf as
    ``float('nan')``, anything else as ``repr``."""
    if isinstance(value, list):
        return "[\n" + "".join(f"{returnn_repr(item)},\n" for item in value) + "]"
    if isinstance(value, tuple):
        return f"({value[0]},)" if len(value) == 1 else "(" + ", ".join(map(returnn_repr, value)) + ")"
    if isinstance(value, dict):
        items = [f"{returnn_repr(k)}: {returnn_repr(v)}" for k, v in sorted(value.items())]
        if sum(len(item) for item in items) >= 40:
            return "{\n" + "".join(f"{item},\n" for item in items) + "}"
        return "{" + ", ".join(items) + "}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float('{value!r}')"
    return repr(value)


@dataclass(frozen=True)
class SeqResult:
    """One sequence's entry of the output file and, with a reference, the error counts of its decided
    hypothesis."""

    tag: str
    output: Any  # str (a hypothesis), list (a beam), dict (several layers) or None (no text)
    label_errors: int = 0
    ref_labels: int = 0
    word_errors: int = 0
    ref_words: int = 0


def score_sequence(tag: str, hyp: np.ndarray, ref: np.ndarray | None,
                   text: HypothesisText | None) -> SeqResult:
    hyp_text = None if text is None else text.text(hyp, tag)
    if ref is None:
        return SeqResult(tag, hyp_text)
    label_errors, word_errors, ref_words = edit_distance(hyp.tolist(), ref.tolist()), 0, 0
    if text is not None and text.has_words:
        ref_word_list = text.words(ref, tag)
        word_errors, ref_words = edit_distance(text.words(hyp, tag), ref_word_list), len(ref_word_list)
    return SeqResult(tag, hyp_text, label_errors, len(ref), word_errors, ref_words)


def check_format(output_file: str, output_format: str) -> None:
    if output_format not in FORMATS:
        raise ConfigError(f"search_output_file_format {output_format!r} is not one of {', '.join(FORMATS)} "
                          "(RETURNN's formats).")
    if output_file and os.path.exists(output_file):
        raise ConfigError(f"search_output_file '{output_file}' exists already; the search does not overwrite "
                          "it (as RETURNN). Remove it or choose another name.")


def write_hypotheses(tmp: str, output_file: str, output_format: str, results: Iterable[SeqResult]) -> None:
    """The file's content into ``tmp`` (renamed to ``output_file`` by the caller)."""
    with open(tmp, "wb") as raw:
        if output_file.endswith(".gz"):
            name = os.path.basename(output_file)[:-len(".gz")]
            with gzip.GzipFile(filename=name, mode="wb", fileobj=raw, mtime=0) as packed:
                _write_text(packed, output_format, results)
        else:
            _write_text(raw, output_format, results)


def _write_text(binary, output_format: str, results: Iterable[SeqResult]) -> None:
    out = io.TextIOWrapper(binary, encoding="utf-8", newline="\n")
    if output_format == "txt":
        for result in results:
            out.write(f"{result.output}\n")
    else:
        out.write("{\n")
        for result in results:
            out.write(f"{result.tag!r}: {returnn_repr(result.output)},\n")
        out.write("}\n")
    out.flush()
    out.detach()  # the caller closes the file below it
