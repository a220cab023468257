"""Target vocabularies: text -> label indices, as RETURNN's ``Vocabulary.create_vocab`` makes them from a
dataset's ``targets`` dict (``returnn/datasets/util/vocabulary.py``).

    vocab = create_vocabulary({"bpe_file": "bpe.codes", "vocab_file": "bpe.vocab", "unknown_label": "<unk>"})
    vocab.get_seq("hello world")  # -> [12, 7, 30]; vocab.labels, vocab.num_labels

``"class"`` picks the kind (``Vocabulary``, ``BytePairEncoding``, ``CharacterTargets``,
``Utf8ByteTargets``, ``SentencePieces``); without it a dict with ``bpe_file`` is BPE, any other a word
vocabulary. A vocabulary file is one label a line (the line number is the index; of repeated lines the
last index is looked up), or a Python dict literal label -> index (indices 0..N-1), ``.gz`` compressed or
a ``.pkl`` pickle of that dict. ``unknown_label`` (default ``"UNK"``, ``"@"`` for characters) must be in
the vocabulary: words that are not are mapped to it; ``None`` makes an unknown word an error.
"""
from __future__ import annotations

import ast
import gzip
import pickle
import re
from typing import Any, Callable

from engine.datasets.bpe import BpeCodes
from engine.runtime.errors import DataError

_NOT_GIVEN = object()
_SPECIAL_FILE_KEYS = ("unknown_label", "bos_label", "eos_label", "pad_label", "control_symbols",
                      "user_defined_symbols")


class Vocabulary:
    """Words separated by whitespace, each looked up in the label list."""

    def __init__(self, vocab_file: str | None = None, *, special_symbols_via_file: str | None = None,
                 unknown_label: str | int | None = _NOT_GIVEN, bos_label: str | int | None = None,
                 eos_label: str | int | None = None, pad_label: str | int | None = None,
                 control_symbols: dict | None = None, user_defined_symbols: dict | None = None,
                 num_labels: int | None = None, seq_postfix: list[int] | None = None,
                 labels: list[str] | Callable[[], list[str]] | None = None,
                 single_whitespace_split: bool = False) -> None:
        self.vocab_file = None if vocab_file is None else str(vocab_file)
        if special_symbols_via_file:
            special = _special_symbols(str(special_symbols_via_file))
            # options given directly win over the file's
            unknown_label = special.get("unknown_label", _NOT_GIVEN) if unknown_label is _NOT_GIVEN \
                else unknown_label
            bos_label = special.get("bos_label") if bos_label is None else bos_label
            eos_label = special.get("eos_label") if eos_label is None else eos_label
            pad_label = special.get("pad_label") if pad_label is None else pad_label
            if "control_symbols" in special:
                control_symbols = {**special["control_symbols"], **(control_symbols or {})}
            if "user_defined_symbols" in special:
                user_defined_symbols = {**special["user_defined_symbols"], **(user_defined_symbols or {})}
        self.unknown_label = "UNK" if unknown_label is _NOT_GIVEN else unknown_label
        if callable(labels):
            labels = labels()
        self._labels, self._index = self._load_labels(labels)
        if num_labels is not None and num_labels != self.num_labels:
            raise DataError(f"{self}: num_labels is {num_labels}, but the vocabulary has {self.num_labels} "
                            "labels.")
        self.unknown_label_id = self.to_id(self.unknown_label, what="unknown_label")
        if self.unknown_label_id is not None:
            self.unknown_label = self.labels[self.unknown_label_id]
        self.bos_label_id = self.to_id(bos_label, what="bos_label")
        self.eos_label_id = self.to_id(eos_label, what="eos_label")
        self.pad_label_id = self.to_id(pad_label, what="pad_label")
        self.control_symbol_ids = {k: self.to_id(v, what="control_symbols", allow_none=False)
                                   for k, v in (control_symbols or {}).items()}
        self.user_defined_symbol_ids = {k: self.to_id(v, what="user_defined_symbols", allow_none=False)
                                        for k, v in (user_defined_symbols or {}).items()}
        self.seq_postfix = _postfix(seq_postfix, self)
        self.single_whitespace_split = bool(single_whitespace_split)
        self._token_re = None
        if single_whitespace_split:
            # Longest alternatives are not preferred: as in RETURNN the labels are tried in vocabulary order.
            self._token_re = re.compile("(%s|\\S+)(?: |$)" % "|".join(re.escape(v) for v in self.labels))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.vocab_file!r})"

    # ----- the public interface -----
    @property
    def labels(self) -> list[str]:
        return self._labels

    @property
    def num_labels(self) -> int:
        return len(self._labels)

    def set_random_seed(self, seed: int) -> None:
        """A new epoch's seed; only sampling vocabularies draw from it."""

    def get_seq(self, text: str) -> list[int]:
        tokens = self._token_re.findall(text) if self._token_re is not None else text.split()
        return self.indices(tokens) + self.seq_postfix

    def indices(self, tokens: list[str]) -> list[int]:
        """Labels -> indices, unknown ones -> ``unknown_label``'s (an error without one)."""
        out = []
        for token in tokens:
            idx = self._index.get(token, self.unknown_label_id)
            if idx is None:
                raise DataError(self._unknown_message(token))
            out.append(idx)
        return out

    def get_seq_labels(self, seq: list[int]) -> str:
        return " ".join(self._labels[i] for i in seq)

    def label_to_id(self, label: str) -> int | None:
        return self._index.get(label)

    def to_id(self, label: str | int | None, *, what: str = "label", allow_none: bool = True) -> int | None:
        """A label or an index -> its index; None (and -1) stay None where that is allowed."""
        if label is None or (label == -1 and not isinstance(label, bool)):
            if allow_none:
                return None
        elif isinstance(label, str):
            if label in self._index:
                return self._index[label]
            raise DataError(f"{self}: {what} {label!r} is not in the vocabulary ({self.num_labels} labels; "
                            f"first ones: {self._labels[:5]}). Give a label of the vocabulary, or None.")
        elif isinstance(label, int) and not isinstance(label, bool) and 0 <= label < self.num_labels:
            return label
        raise DataError(f"{self}: {what} {label!r} is neither a label nor an index in "
                        f"0..{self.num_labels - 1}.")

    # ----- loading -----
    def _unknown_message(self, token: str) -> str:
        if self.unknown_label is None:
            why = "and unknown_label is None"
        else:
            why = f"and unknown_label {self.unknown_label!r} is not a label of it"
        return f"{self}: {token!r} is not in the vocabulary, {why}."

    def _load_labels(self, labels: list[str] | None) -> tuple[list[str], dict[str, int]]:
        if labels is not None:
            if not isinstance(labels, (list, tuple)):
                raise DataError(f"{self}: labels must be a list of strings, got {type(labels).__name__}.")
            return list(labels), {label: i for i, label in enumerate(labels)}
        if self.vocab_file is None:
            raise DataError(f"{type(self).__name__}: needs a vocab_file (or labels).")
        return read_vocab_file(self.vocab_file)


def read_vocab_file(path: str) -> tuple[list[str], dict[str, int]]:
    """``(labels, label -> index)`` of a vocabulary file (see the module's text)."""
    try:
        if path.endswith(".pkl"):
            with open(path, "rb") as f:
                index = pickle.load(f)
        else:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt", encoding="utf8") as f:
                content = f.read()
            if not content.startswith("{"):
                lines = content.splitlines()
                return lines, {line: i for i, line in enumerate(lines)}
            index = ast.literal_eval(content)
    except OSError as exc:
        raise DataError(f"Vocabulary file '{path}' cannot be read: {exc.strerror or exc}.") from None
    except (ValueError, SyntaxError, UnicodeDecodeError, pickle.UnpicklingError) as exc:
        raise DataError(f"Vocabulary file '{path}' is not a label list or a dict literal: {exc}.") from None
    if not isinstance(index, dict) or not index:
        raise DataError(f"Vocabulary file '{path}': expected a dict label -> index, got "
                        f"{type(index).__name__}.")
    by_index = {idx: label for label, idx in sorted(index.items())}
    if min(by_index) != 0 or max(by_index) != len(by_index) - 1:
        missing = [i for i in range(max(by_index) + 1) if i not in by_index][:10]
        raise DataError(f"Vocabulary file '{path}': the indices must be 0..{len(by_index) - 1} without gaps "
                        f"or duplicates; found min {min(by_index)}, max {max(by_index)}, unused {missing}.")
    return [by_index[i] for i in range(len(by_index))], dict(index)


def _special_symbols(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf8") as f:
            special = ast.literal_eval(f.read())
    except (OSError, ValueError, SyntaxError) as exc:
        raise DataError(f"special_symbols_via_file '{path}' cannot be read as a dict literal: "
                        f"{exc}.") from None
    if not isinstance(special, dict) or not set(special) <= set(_SPECIAL_FILE_KEYS):
        raise DataError(f"special_symbols_via_file '{path}': expected a dict with keys among "
                        f"{', '.join(_SPECIAL_FILE_KEYS)}, got {special!r}.")
    return special


def _postfix(seq_postfix: Any, owner: Any) -> list[int]:
    if not seq_postfix:
        return []
    if not isinstance(seq_postfix, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in seq_postfix):
        raise DataError(f"{owner}: seq_postfix must be a list of label indices, got {seq_postfix!r}.")
    return list(seq_postfix)


class BytePairEncoding(Vocabulary):
    """Subword units: each word is segmented with the BPE codes of ``bpe_file`` (see ``bpe.py``), then looked
    up in the vocabulary."""

    def __init__(self, vocab_file: str, bpe_file: str, seq_postfix: list[int] | None = None,
                 **kwargs) -> None:
        super().__init__(vocab_file=vocab_file, seq_postfix=seq_postfix, **kwargs)
        self.bpe = BpeCodes(str(bpe_file), vocab=self.labels)

    def get_seq(self, text: str) -> list[int]:
        return self.indices(self.bpe.segment(text)) + self.seq_postfix


class CharacterTargets(Vocabulary):
    """Every character (spaces too) is a label."""

    def __init__(self, vocab_file: str | None = None, seq_postfix: list[int] | None = None,
                 unknown_label: str | int | None = "@", labels: list[str] | None = None, **kwargs) -> None:
        super().__init__(vocab_file=vocab_file, seq_postfix=seq_postfix, unknown_label=unknown_label,
                         labels=labels, **kwargs)

    def get_seq(self, text: str) -> list[int]:
        return self.indices(list(text)) + self.seq_postfix

    def get_seq_labels(self, seq: list[int]) -> str:
        return "".join(self._labels[i] for i in seq)


class Utf8ByteTargets(Vocabulary):
    """The UTF-8 bytes of the text, 256 labels."""

    def __init__(self, seq_postfix: list[int] | None = None, **kwargs) -> None:
        super().__init__(labels=[chr(i) for i in range(256)], seq_postfix=seq_postfix, unknown_label=None,
                         **kwargs)

    def get_seq(self, text: str) -> list[int]:
        return list(text.encode("utf8")) + self.seq_postfix

    def get_seq_labels(self, seq: list[int]) -> str:
        return bytes(seq).decode("utf8")


class SentencePieces(Vocabulary):
    """Targets segmented by a SentencePiece model (the ``sentencepiece`` package), as RETURNN's vocabulary
    of that name does it.

    The options are those of ``sentencepiece.SentencePieceProcessor`` (``model_file`` or ``model_proto``,
    ``add_bos``, ``add_eos``, ``reverse``, ``enable_sampling``, ``nbest_size``, ``alpha``, ...), plus
    ``control_symbols`` and ``user_defined_symbols`` (name -> piece or index). The model's unknown, BOS,
    EOS and padding pieces become the vocabulary's. With ``enable_sampling`` every epoch seeds SentencePiece's
    generator with the epoch's seed, as RETURNN does; SentencePiece keeps one generator per thread, so the
    samples repeat only where the same thread encodes the same texts in the same order.
    """

    def __init__(self, **opts: Any) -> None:
        try:
            import sentencepiece
        except ImportError:
            raise DataError("SentencePieces targets need the 'sentencepiece' package (pip install "
                            "sentencepiece).") from None
        self._spm = sentencepiece
        opts = {k: str(v) if k in ("model_file", "model_proto") and not isinstance(v, bytes) else v
                for k, v in opts.items()}
        self._opts = dict(opts)
        control_symbols = opts.pop("control_symbols", None)
        user_defined_symbols = opts.pop("user_defined_symbols", None)
        try:
            self.sp = sentencepiece.SentencePieceProcessor(**opts)
        except (TypeError, OSError, RuntimeError) as exc:
            raise DataError(f"SentencePieces {self._opts}: the model cannot be loaded: {exc}.") from None
        pieces = [self.sp.id_to_piece(i) for i in range(self.sp.vocab_size())]
        super().__init__(vocab_file=None, labels=pieces, unknown_label=self.sp.unk_id(),
                         bos_label=self.sp.bos_id(), eos_label=self.sp.eos_id(), pad_label=self.sp.pad_id(),
                         control_symbols=control_symbols, user_defined_symbols=user_defined_symbols)

    def __repr__(self) -> str:
        return f"SentencePieces({self._opts!r})"

    def set_random_seed(self, seed: int) -> None:
        self._spm.set_random_generator_seed(seed)

    def get_seq(self, text: str) -> list[int]:
        return list(self.sp.encode(text, out_type=int))


def create_vocabulary(opts: dict[str, Any] | Vocabulary, *, owner: str = "targets") -> Vocabulary:
    """A vocabulary from RETURNN's dict (see the module's text); a made one is returned as it is. ``owner``
    names where the dict came from in messages."""
    if isinstance(opts, Vocabulary):
        return opts
    if not isinstance(opts, dict):
        raise DataError(f"{owner} must be a vocabulary dict such as {{'vocab_file': ..., 'bpe_file': ...}}, "
                        f"got {opts!r}.")
    opts = dict(opts)
    classes: dict[str, type[Vocabulary]] = {cls.__name__: cls for cls in (
        Vocabulary, BytePairEncoding, CharacterTargets, Utf8ByteTargets, SentencePieces)}
    name = opts.pop("class", "BytePairEncoding" if "bpe_file" in opts else "Vocabulary")
    refused = REFUSED_VOCABULARIES.get(name)
    if refused:
        raise DataError(f"{owner}: vocabulary class {name!r} is not implemented in this engine: {refused}")
    cls = classes.get(name)
    if cls is None:
        raise DataError(f"{owner}: unknown vocabulary class {name!r}; known: {', '.join(classes)}.")
    try:
        return cls(**opts)
    except TypeError as exc:  # an option the class does not take, or a required one missing
        raise DataError(f"{owner}: {name} {exc}.".replace("__init__() ", "")) from None


REFUSED_VOCABULARIES = {
    "SamplingBytePairEncoding": "it samples among all BPE splits of a word with its own search over a prefix "
                                "tree of the vocabulary, which is not implemented here; use BytePairEncoding "
                                "(the deterministic split) or SentencePieces with enable_sampling.",
    "HuggingFaceTokenizer": "it needs the 'transformers' package and a tokenizer directory, which this "
                            "engine does not depend on.",
}
