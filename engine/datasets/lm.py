"""``LmDataset``: RETURNN's language-model corpus, text lines turned into label sequences.

    train = {"class": "LmDataset", "corpus_file": ["part1.txt.gz", "part2.txt"],
             "orth_symbols_map_file": "vocab.txt", "word_based": True, "seq_end_symbol": "<sb>",
             "unknown_symbol": "<unk>", "auto_replace_unknown_symbol": True,
             "add_delayed_seq_data": True, "delayed_seq_data_start_symbol": "<sb>",
             "partition_epoch": 4, "seq_ordering": "random"}

Key ``data`` holds the line's labels (the LM's target) and, with ``add_delayed_seq_data``, ``delayed``
the same shifted right by ``delayed_seq_data_start_symbol`` (its input); both sparse with all labels as
dim, in RETURNN's dtype (``int8`` up to 128 labels, ``uint8`` up to 256, else ``int32``; or ``dtype``).
Tags are ``line-N`` (``tag_prefix``), N counting the corpus' lines across its files (``seq_list_file``
gives others). The files: ``text_lines.py``; the labels: a vocabulary dict ``orth_vocab``
(``vocabulary.py``) or a symbol list with RETURNN's orthography rules (``orthography.py``).

The order of an epoch is RETURNN's, ``sorted`` and ``laplace`` by the line's byte length. The lines of a
(sub-)epoch are turned into labels in that order when it starts and kept until the next epoch (a few
bytes a label): batches are planned on their lengths, a line that cannot be labelled is skipped
(``error_on_invalid_seq=False``) or an error before training starts, and stateful labelling
(``auto_replace_unknown_symbol``, sampling vocabularies) sees the lines in RETURNN's order.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from engine.datasets import ordering
from engine.datasets.base import DataKeyInfo, Dataset
from engine.datasets.orthography import (InvalidSequence, LogBudget, SymbolTokenizer, read_replace_map,
                                         read_symbols_file, read_symbols_map_file)
from engine.datasets.orthography import text_post_processor
from engine.datasets.seq_list import load_seq_list
from engine.datasets.text_lines import TextLines
from engine.datasets.token_store import TokenStore
from engine.datasets.vocabulary import Vocabulary, create_vocabulary
from engine.runtime import log
from engine.runtime.errors import DataError

_PHONES = ("it turns words into allophone-state sequences with a Bliss lexicon, random silence and "
           "context (RETURNN's PhoneSeqGenerator), which this engine does not implement; convert the corpus "
           "once with RETURNN's tools/hdf_dump.py and read the HDF file, or label it with "
           "orth_symbols_map_file / orth_vocab")


class LmDataset(Dataset):
    def __init__(self, corpus_file: Any, *, skip_empty_lines: bool = True, seq_list_file: Any = None,
                 orth_vocab: dict | Vocabulary | None = None, orth_symbols_file: Any = None,
                 orth_symbols_map_file: Any = None, orth_replace_map_file: Any = None,
                 orth_post_process: Any = None, word_based: bool = False, word_end_symbol: str | None = None,
                 seq_end_symbol: str | None = "[END]", unknown_symbol: str | None = "[UNKNOWN]",
                 parse_orth_opts: dict | None = None, phone_info: dict | None = None,
                 add_random_phone_seqs: int = 0, auto_replace_unknown_symbol: bool = False,
                 log_auto_replace_unknown_symbols: bool | int = 10, log_skipped_seqs: bool | int = 10,
                 error_on_invalid_seq: bool = True, add_delayed_seq_data: bool = False,
                 delayed_seq_data_start_symbol: str = "[START]", dtype: str | None = None,
                 tag_prefix: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if phone_info is not None:
            raise DataError(f"{self.name}: phone_info is not implemented: {_PHONES}.")
        if add_random_phone_seqs:
            raise DataError(f"{self.name}: add_random_phone_seqs needs phone_info (RETURNN asserts that "
                            f"too), which is not implemented: {_PHONES}.")
        self._corpus_spec = corpus_file
        self.skip_empty_lines = bool(skip_empty_lines)
        self._seq_list_spec = seq_list_file
        self.tag_prefix = tag_prefix or "line-"
        self.error_on_invalid_seq = bool(error_on_invalid_seq)
        self._log_skipped = LogBudget(log_skipped_seqs, "log_skipped_seqs", self.name, level=log.DEBUG)
        self.post_process = text_post_processor(orth_post_process, self.name, "orth_post_process")
        self.vocab: Vocabulary | None = None
        self.tokenizer: SymbolTokenizer | None = None
        symbols_file, map_file, replace_file = (f() if callable(f) else f for f in (
            orth_symbols_file, orth_symbols_map_file, orth_replace_map_file))
        if orth_vocab:
            given = [name for name, value in (("orth_symbols_file", symbols_file),
                                              ("orth_symbols_map_file", map_file),
                                              ("orth_replace_map_file", replace_file),
                                              ("parse_orth_opts", parse_orth_opts),
                                              ("auto_replace_unknown_symbol", auto_replace_unknown_symbol))
                     if value]
            if given:
                raise DataError(f"{self.name}: orth_vocab labels the text by itself; {', '.join(given)} "
                                "cannot be given with it (RETURNN asserts the same). Its unknown words are "
                                "handled by the vocabulary's unknown_label.")
            if add_delayed_seq_data:
                raise DataError(f"{self.name}: add_delayed_seq_data with orth_vocab fails in RETURNN (it "
                                "looks the start symbol up in the symbol map, which orth_vocab leaves "
                                "empty), so it is refused here too; give the vocabulary as "
                                "orth_symbols_file or orth_symbols_map_file to get 'delayed'.")
            unused = [name for name, value, default in (
                ("word_based", word_based, False), ("word_end_symbol", word_end_symbol, None),
                ("seq_end_symbol", seq_end_symbol, "[END]"), ("unknown_symbol", unknown_symbol, "[UNKNOWN]"),
                ("error_on_invalid_seq", error_on_invalid_seq, True)) if value != default]
            if unused:  # RETURNN accepts and ignores them
                log.warning(f"{self.name}: {', '.join(unused)} have no effect with orth_vocab (as in "
                            "RETURNN): the vocabulary splits the text, appends its seq_postfix and maps "
                            "unknown words to its unknown_label (or fails without one).")
            self.vocab = create_vocabulary(orth_vocab, owner=f"{self.name} orth_vocab")
            labels = list(self.vocab.labels)
        else:
            if symbols_file and map_file:
                raise DataError(f"{self.name}: give either orth_symbols_file or orth_symbols_map_file, not "
                                "both.")
            if symbols_file:
                labels, index = read_symbols_file(_path(symbols_file, "orth_symbols_file", self.name),
                                                  self.name)
            elif map_file:
                labels, index = read_symbols_map_file(
                    _path(map_file, "orth_symbols_map_file", self.name), self.name)
            else:
                raise DataError(f"{self.name}: needs its labels: orth_vocab (a vocabulary dict), "
                                "orth_symbols_file or orth_symbols_map_file.")
            replace = read_replace_map(_path(replace_file, "orth_replace_map_file", self.name),
                                       bool(word_based), self.name) if replace_file else {}
            self.tokenizer = SymbolTokenizer(
                index, word_based=bool(word_based), word_end_symbol=word_end_symbol,
                seq_end_symbol=seq_end_symbol, unknown_symbol=unknown_symbol, parse_orth_opts=parse_orth_opts,
                replace_map=replace, auto_replace_unknown_symbol=auto_replace_unknown_symbol,
                log_auto_replace=LogBudget(log_auto_replace_unknown_symbols,
                                           "log_auto_replace_unknown_symbols", self.name),
                owner=self.name)
        self.delayed_start: int | None = None
        if add_delayed_seq_data:
            if delayed_seq_data_start_symbol not in self.tokenizer.index:
                raise DataError(f"{self.name}: delayed_seq_data_start_symbol "
                                f"{delayed_seq_data_start_symbol!r} is not in the vocabulary.")
            self.delayed_start = self.tokenizer.index[delayed_seq_data_start_symbol]
        self.dtype = _dtype(dtype, len(labels), self.name)
        self._keys["data"] = DataKeyInfo(dim=len(labels), sparse=True, dtype=self.dtype)
        self.labels["data"] = labels
        if self.delayed_start is not None:
            self._keys["delayed"] = DataKeyInfo(dim=len(labels), sparse=True, dtype=self.dtype)
            self.labels["delayed"] = labels
        self._lines: TextLines | None = None
        self._tags: list[str] | None = None
        self._epoch_tokens: TokenStore | None = None
        self._corpus_tokens: TokenStore | None = None

    # ----- the corpus, read when first needed (as RETURNN does) -----
    @property
    def lines(self) -> TextLines:
        if self._lines is None:
            lines = TextLines(self._corpus_files(), skip_empty_lines=self.skip_empty_lines, owner=self.name)
            try:
                self._tags = self._seq_list(lines)
            except DataError:
                lines.close()
                raise
            self._lines = lines
        return self._lines

    def _corpus_files(self) -> list[str]:
        spec = self._corpus_spec() if callable(self._corpus_spec) else self._corpus_spec
        files = [spec] if isinstance(spec, (str, os.PathLike)) else spec
        if not isinstance(files, (list, tuple)) or not files or \
                not all(isinstance(f, (str, os.PathLike)) for f in files):
            raise DataError(f"{self.name}: corpus_file must be a file name, a list of them, or a function "
                            f"returning one of those; got {spec!r}.")
        return [os.fspath(f) for f in files]

    def _seq_list(self, lines: TextLines) -> list[str] | None:
        spec = self._seq_list_spec
        if not spec:
            return None
        owner = f"{self.name}: seq_list_file"
        if isinstance(spec, (list, tuple)):
            if len(spec) != len(lines.files):
                raise DataError(f"{owner}: {len(spec)} lists given for {len(lines.files)} corpus files; give "
                                "one per corpus file (or a single one for all).")
            parts = [load_seq_list(path, owner=owner) for path in spec]
            for path, tags, count, corpus in zip(spec, parts, lines.counts, lines.files):
                if len(tags) != count:
                    raise DataError(f"{owner} '{path}' lists {len(tags)} tags, but '{corpus}' has {count} "
                                    "sequences.")
            return [tag for tags in parts for tag in tags]
        tags = load_seq_list(spec, owner=owner)
        if len(tags) != len(lines):
            raise DataError(f"{owner} '{spec}' lists {len(tags)} tags, but the corpus has {len(lines)} "
                            "sequences.")
        return tags

    def _corpus_num_seqs(self) -> int:
        return len(self.lines)

    def _corpus_tag(self, corpus_idx: int) -> str:
        if self.lines is not None and self._tags is not None:  # reading the lines reads the seq list
            return self._tags[corpus_idx]
        return f"{self.tag_prefix}{corpus_idx}"

    def _labelled(self, idx: int, *, may_skip: bool) -> list[int] | None:
        """The labels of corpus line ``idx``; None if it is invalid and may be skipped."""
        text = self.lines.text(idx)
        if self.post_process is not None:
            text = self.post_process(text)
        if self.vocab is not None:
            try:
                ids = self.vocab.get_seq(text)
            except DataError as exc:
                raise DataError(f"{self._where(idx)}: {exc}") from None
        else:
            try:
                ids = self.tokenizer.ids(text)
            except InvalidSequence as exc:
                if may_skip:
                    self._log_skipped(f"LmDataset: skipping sequence '{self._corpus_tag(idx)}': {exc}",
                                      "LmDataset: no more notes on skipped sequences")
                    return None
                raise DataError(f"{self._where(idx)}: {exc}. Set auto_replace_unknown_symbol=True to map "
                                "unknown symbols to unknown_symbol, or error_on_invalid_seq=False to skip "
                                "such lines.") from None
        if self.delayed_start is not None and not ids:
            raise DataError(f"{self._where(idx)}: the line gives no labels, so 'delayed' (the start symbol "
                            "and all labels but the last) would be longer than 'data'; RETURNN fails on it "
                            "too.")
        return ids

    def _where(self, idx: int) -> str:
        return f"{self.name}: sequence '{self._corpus_tag(idx)}' of '{self.lines.file(idx)}'"

    # ----- epochs -----
    def init_seq_order(self, epoch: int) -> None:
        order = ordering.epoch_order(
            self.seq_ordering, num_seqs=len(self.lines), epoch=epoch,
            get_lengths=lambda: self.lines.lengths, partition_epoch=self.partition_epoch,
            fixed_random_seed=self.fixed_random_seed, random_seed_offset=self.random_seed_offset)
        store, kept = TokenStore(len(self.labels["data"])), []
        for idx in order.tolist():
            ids = self._labelled(idx, may_skip=not self.error_on_invalid_seq)
            if ids is not None:
                store.append(ids)
                kept.append(idx)
        if len(kept) < len(order):
            log.warning(f"{self.name}, epoch {epoch}: skipped {len(order) - len(kept)} of {len(order)} "
                        "sequences with symbols not in the vocabulary (error_on_invalid_seq=False).")
        self._epoch_tokens = store.finish()
        self._order, self.epoch = np.asarray(kept, np.int64), epoch

    def _epoch_store(self) -> TokenStore:
        if self._epoch_tokens is None:
            raise RuntimeError(f"{self.name}: call init_seq_order(epoch) before reading sequences")
        return self._epoch_tokens

    def epoch_seq_lengths(self) -> np.ndarray:
        return np.repeat(self._epoch_store().lengths()[:, None], len(self._keys), axis=1)

    def get_seq_length(self, seq_idx: int) -> dict[str, int]:
        n = len(self._epoch_store().get(seq_idx))
        return {key: n for key in self._keys}

    def get_data(self, seq_idx: int, key: str) -> np.ndarray:
        return self._as_key(self._epoch_store().get(seq_idx), key)

    def read_into(self, seq_idx: int, key: str, out: np.ndarray, offset: int = 0) -> None:
        out[...] = self.get_data(seq_idx, key)[offset:offset + len(out)]

    def _as_key(self, ids: np.ndarray, key: str) -> np.ndarray:
        if key == "data":
            return ids.astype(self.dtype)
        if key == "delayed" and self.delayed_start is not None:
            return np.concatenate([[self.delayed_start], ids[:-1]]).astype(self.dtype)
        self.key_info(key)  # raises the DataError naming the keys
        raise AssertionError(key)

    # ----- by corpus index, for a MetaDataset joining by tag: the whole corpus is labelled once -----
    def _corpus_store(self) -> TokenStore:
        if self._corpus_tokens is None:
            # RETURNN labels sequences asked for by tag with error_on_invalid_seq switched on; these labels
            # are the engine's own (a MetaDataset's lengths), so the unknown words they meet stay out of the
            # replace map the epochs' labels grow, as in RETURNN
            store = TokenStore(len(self.labels["data"]))
            live = self.tokenizer.replace_map if self.tokenizer is not None else None
            if live is not None:
                self.tokenizer.replace_map = dict(live)
            try:
                for idx in range(len(self.lines)):
                    store.append(self._labelled(idx, may_skip=False))
            finally:
                if live is not None:
                    self.tokenizer.replace_map = live
            self._corpus_tokens = store.finish()
        return self._corpus_tokens

    def _corpus_lengths(self) -> np.ndarray:
        return np.repeat(self._corpus_store().lengths()[:, None], len(self._keys), axis=1)

    def _corpus_data(self, corpus_idx: int, key: str) -> np.ndarray:
        return self._as_key(self._corpus_store().get(corpus_idx), key)

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
            self._lines = None

    def __repr__(self) -> str:
        return f"<LmDataset {self._corpus_spec!r}: keys {self.data_keys}, {len(self.labels['data'])} labels>"


def _path(value: Any, option: str, owner: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise DataError(f"{owner}: {option} must be a file name (or a function returning one), got "
                        f"{value!r}.")
    return os.fspath(value)


def _dtype(dtype: str | None, num_labels: int, owner: str) -> str:
    """RETURNN's: the given one, else the smallest of int8 / uint8 / int32 / uint32 / int64 that fits."""
    if dtype is None:
        for name, limit in (("int8", 2**7), ("uint8", 2**8), ("int32", 2**31), ("uint32", 2**32)):
            if num_labels <= limit:
                return name
        return "int64"
    try:
        kind = np.dtype(dtype)
    except TypeError:
        raise DataError(f"{owner}: dtype {dtype!r} is not a numpy dtype name.") from None
    if kind.kind not in "iu" or num_labels - 1 > np.iinfo(kind).max:
        raise DataError(f"{owner}: dtype {dtype!r} cannot hold the label indices 0..{num_labels - 1}.")
    return kind.name
