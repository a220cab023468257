"""``TranslationDataset``: RETURNN's parallel text corpus, a directory of line-aligned files.

    train = {"class": "TranslationDataset", "path": "data", "file_postfix": "train",
             "source_postfix": " </S>", "target_postfix": " </S>", "unknown_label": "<UNK>",
             "partition_epoch": 10, "seq_ordering": "laplace:1000"}

reads ``data/source.train`` and ``data/target.train`` (or the same names with ``.gz``; the plain file
wins), line i of one being the translation of line i of the other, and the vocabularies
``data/source.vocab.pkl`` and ``data/target.vocab.pkl``: pickled dicts word -> index (several words
may share an index; the label name of an index is the last of its words in sorted order, as in
RETURNN). A line is decoded as UTF-8, stripped, the postfix appended (``" </S>"`` adds a word,
``"</S>"`` glues it to the last one, as in RETURNN), split at whitespace and looked up. A word missing
from the vocabulary is ``unknown_label`` (a label, or a dict ``{"data": ..., "classes": ...}``), or an
error naming file and line without one.

Keys: ``data`` (source) and ``classes`` (target), sparse int32, each with its own vocabulary's size
(``max index + 1``) as dim; RETURNN's ``get_data_dim`` reports the source's size for both, which
``extern_data`` / ``num_outputs`` of its configs override. ``source_only``: no target at all;
``search_without_reference``: the target file is not read and ``classes`` is not a key (its labels are
kept for decoding). Tags are ``line-N``; ``sorted`` / ``laplace`` order by the source's word count.

All lines are read and looked up once, when the corpus is first needed (RETURNN does it in a thread
started with the dataset), and kept as a few bytes a word.
"""
from __future__ import annotations

import gzip
import os
import pickle
from typing import Any

import numpy as np

from engine.datasets.base import DataKeyInfo, Dataset
from engine.datasets.token_store import TokenStore
from engine.runtime.errors import DataError

_PREFIX = {"data": "source", "classes": "target"}


class TranslationDataset(Dataset):
    def __init__(self, path: str, file_postfix: str, *, source_postfix: str = "", target_postfix: str = "",
                 source_only: bool = False, search_without_reference: bool = False,
                 unknown_label: str | dict[str, str | None] | None = None, seq_list_file: Any = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if seq_list_file is not None:
            raise DataError(f"{self.name}: seq_list_file is refused: RETURNN's TranslationDataset reads it "
                            "as line numbers and then fails on them (TypeError when an epoch starts), so it "
                            "has no working meaning to follow. To pick or repeat lines, put the dataset "
                            "into a MetaDataset whose seq_list_file lists the tags 'line-N'.")
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise DataError(f"{self.name}: path '{self.path}' is not a directory (it must hold source."
                            f"{file_postfix}, target.{file_postfix} and the *.vocab.pkl files).")
        self.file_postfix = file_postfix
        self.postfix = {"data": source_postfix or "", "classes": target_postfix or ""}
        for key, value in self.postfix.items():
            if not isinstance(value, str):
                raise DataError(f"{self.name}: {_PREFIX[key]}_postfix must be a string, got {value!r}.")
        vocab_keys = ["data"] if source_only else ["data", "classes"]
        self.read_keys = ["data"] if source_only or search_without_reference else ["data", "classes"]
        self.files = {key: self._data_file(key) for key in self.read_keys}
        self.vocabs = {key: self._vocab(key) for key in vocab_keys}
        self.unknown_ids = self._unknown_ids(unknown_label, vocab_keys)
        for key, vocab in self.vocabs.items():
            dim = max(vocab.values()) + 1
            if dim > 2**31:
                raise DataError(f"{self.name}: {self._vocab_file(key)} has indices up to {dim - 1}; int32 "
                                "labels hold at most 2**31.")
            names = {i: word for word, i in sorted(vocab.items())}
            missing = [i for i in range(dim) if i not in names]
            if missing:
                raise DataError(f"{self.name}: {self._vocab_file(key)} uses indices up to {dim - 1} but "
                                f"none of its words has index {missing[0]} (RETURNN fails building its label "
                                "list too).")
            self.labels[key] = [names[i] for i in range(dim)]
            if key in self.read_keys:
                self._keys[key] = DataKeyInfo(dim=dim, sparse=True, dtype="int32")
        self._tokens: dict[str, TokenStore] | None = None
        self._lengths: np.ndarray | None = None

    # ----- files -----
    def _data_file(self, key: str) -> str:
        name = os.path.join(self.path, f"{_PREFIX[key]}.{self.file_postfix}")
        for candidate in (name, name + ".gz"):
            if os.path.exists(candidate):
                return candidate
        raise DataError(f"{self.name}: data file '{name}' (or '{name}.gz') not found.")

    def _vocab_file(self, key: str) -> str:
        return os.path.join(self.path, f"{_PREFIX[key]}.vocab.pkl")

    def _vocab(self, key: str) -> dict[str, int]:
        name = self._vocab_file(key)
        try:
            with open(name, "rb") as f:
                vocab = pickle.load(f)
        except FileNotFoundError:
            raise DataError(f"{self.name}: vocabulary file '{name}' not found.") from None
        except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
            raise DataError(f"{self.name}: vocabulary file '{name}' is not a pickle: {exc}.") from None
        if not isinstance(vocab, dict) or not vocab or not all(
                isinstance(w, str) and isinstance(i, int) and i >= 0 for w, i in vocab.items()):
            raise DataError(f"{self.name}: vocabulary file '{name}' must hold a non-empty dict word (str) -> "
                            "index (int >= 0).")
        return vocab

    def _unknown_ids(self, unknown_label: Any, keys: list[str]) -> dict[str, int | None]:
        per_key = unknown_label if isinstance(unknown_label, dict) else {key: unknown_label for key in keys}
        wrong = sorted(set(per_key) - set(_PREFIX))
        if wrong:
            raise DataError(f"{self.name}: unknown_label's keys must be among 'data', 'classes'; got "
                            f"{wrong}.")
        ids = {}
        for key in keys:
            label = per_key.get(key)
            if label is not None and not isinstance(label, str):
                raise DataError(f"{self.name}: unknown_label for '{key}' must be a word or None, got "
                                f"{label!r}.")
            if label is not None and label not in self.vocabs[key]:
                raise DataError(f"{self.name}: unknown_label {label!r} is not in {self._vocab_file(key)}.")
            ids[key] = None if label is None else self.vocabs[key][label]
        return ids

    # ----- reading -----
    def _read(self) -> dict[str, TokenStore]:
        if self._tokens is None:
            tokens = {key: self._read_file(key) for key in self.read_keys}
            counts = {self.files[key]: len(store) for key, store in tokens.items()}
            if len(set(counts.values())) > 1:
                raise DataError(f"{self.name}: the files must have the same number of lines, line i of one "
                                f"translating line i of the other; found {counts}.")
            self._lengths = np.stack([tokens[key].lengths() for key in self.read_keys], axis=1)
            self._tokens = tokens
        return self._tokens

    def _read_file(self, key: str) -> TokenStore:
        name, vocab, unknown = self.files[key], self.vocabs[key], self.unknown_ids[key]
        store = TokenStore(max(vocab.values()) + 1)
        try:
            with (gzip.open(name, "rb") if name.endswith(".gz") else open(name, "rb")) as f:
                for line_nr, raw in enumerate(f):
                    try:
                        words = (raw.decode("utf8").strip() + self.postfix[key]).split()
                    except UnicodeDecodeError as exc:
                        raise DataError(f"{self.name}: '{name}', line {line_nr + 1}: not UTF-8 ({exc.reason} "
                                        f"at byte {exc.start}).") from None
                    if unknown is not None:
                        store.append([vocab.get(w, unknown) for w in words])
                        continue
                    try:
                        store.append([vocab[w] for w in words])
                    except KeyError as exc:
                        raise DataError(f"{self.name}: '{name}', line {line_nr + 1}: word {exc.args[0]!r} is "
                                        f"not in {self._vocab_file(key)}, and no unknown_label is given for "
                                        f"'{key}'.") from None
        except (OSError, EOFError) as exc:
            raise DataError(f"{self.name}: '{name}' cannot be read: {exc}.") from None
        return store.finish()

    # ----- Dataset implementation -----
    def _corpus_num_seqs(self) -> int:
        return len(self._read()["data"])

    def _corpus_lengths(self) -> np.ndarray:
        self._read()
        return self._lengths

    def _corpus_tag(self, corpus_idx: int) -> str:
        return f"line-{corpus_idx}"

    def _corpus_data(self, corpus_idx: int, key: str) -> np.ndarray:
        if key not in self._keys:
            self.key_info(key)  # raises the DataError naming the keys
        return self._read()[key].get(corpus_idx).astype(np.int32)

    def __repr__(self) -> str:
        return f"<TranslationDataset '{self.path}' {self.file_postfix!r}: keys {self.data_keys}>"


# RETURNN's other classes of returnn/datasets/lm.py, refused by name (no published setup uses them)
REFUSED_TEXT_CLASSES = {
    "TranslationFactorsDataset": "it splits every word into factors ('word|case') with a vocabulary and a "
                                 "data key per factor, which this engine does not implement; write each "
                                 "factor's corpus as its own TranslationDataset directory and join them by "
                                 "tag ('line-N') with a MetaDataset",
    "ConfusionNetworkDataset": "its source is a confusion network (alternative words with scores per "
                               "position, dense inputs), which this engine does not implement; convert it "
                               "with RETURNN's tools/hdf_dump.py and read the HDF file",
}


def refused_text_class(class_name: str) -> DataError:
    return DataError(f"Dataset class {class_name!r} is not implemented: {REFUSED_TEXT_CLASSES[class_name]}.")
