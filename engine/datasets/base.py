"""The dataset interface: epochs, sequences, data keys.

A dataset is a corpus of sequences; every sequence has one array per data key (``data`` is the input,
``classes`` the default target). ``init_seq_order(epoch)`` fixes which sequences the (sub-)epoch holds
and in which order; from then on ``seq_idx`` counts positions in that order, and
``get_corpus_seq_idx`` maps back to the corpus. Subclasses describe the corpus; the ordering, partition
and seeding logic lives here once (via ``ordering.py``), so every dataset orders the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.datasets import ordering
from engine.datasets.chunking import Chunking, parse_chunking
from engine.runtime.errors import DataError


@dataclass(frozen=True)
class DataKeyInfo:
    """How one data key's per-sequence arrays look: ``(T,)`` class indices or ``(T, *shape)`` features."""

    dim: int
    sparse: bool = False
    dtype: str | None = None  # None: int32 for sparse, float32 for dense
    shape: tuple[int, ...] | None = None  # per-frame feature shape; None: () for sparse, (dim,) for dense

    def __post_init__(self) -> None:
        if self.dtype is None:
            object.__setattr__(self, "dtype", "int32" if self.sparse else "float32")
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        if self.sparse and np.dtype(self.dtype).kind not in "iu":
            raise DataError(f"A sparse data key holds class indices and needs an integer dtype, "
                            f"not {self.dtype}.")
        if self.shape is None:
            object.__setattr__(self, "shape", () if self.sparse else (self.dim,))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def ndim(self) -> int:
        """Dims without batch, RETURNN's convention: sparse ``(T,)`` -> 1, dense ``(T, D)`` -> 2."""
        return 1 + len(self.shape)


class Dataset:
    """Base class. Subclasses set ``self._keys`` (data key -> DataKeyInfo, ``data`` first) and
    ``self.labels``, and implement the ``_corpus_*`` methods."""

    # data keys that share one time axis (extern_data's same_dim_tags_as; set by dataset_from_config):
    # their lengths must be equal in every sequence, which generate_batches checks
    same_length_keys: list[tuple[str, ...]] = []

    def __init__(self, *, seq_ordering: str = "default", partition_epoch: int | None = 1,
                 fixed_random_seed: int | None = None, random_seed_offset: int = 0,
                 chunking: Any = None, min_chunk_size: Any = 0, name: str | None = None) -> None:
        self.name = name or type(self).__name__
        self.seq_ordering = ordering.parse_seq_ordering(seq_ordering, owner=self.name)
        # None: batches hold whole sequences (see chunking.py)
        self.chunking: Chunking | None = parse_chunking(chunking, min_chunk_size, owner=self.name)
        if partition_epoch is None:  # RETURNN's default spelling of "not partitioned"
            partition_epoch = 1
        if not isinstance(partition_epoch, int) or isinstance(partition_epoch, bool) or partition_epoch < 1:
            raise DataError(f"{self.name}: partition_epoch must be an integer >= 1, got {partition_epoch!r}.")
        self.partition_epoch = partition_epoch
        for key, value in (("fixed_random_seed", fixed_random_seed),
                           ("random_seed_offset", random_seed_offset)):
            if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool)):
                raise DataError(f"{self.name}: {key} must be an integer, got {value!r}.")
        self.fixed_random_seed = fixed_random_seed
        self.random_seed_offset = int(random_seed_offset or 0)
        self._keys: dict[str, DataKeyInfo] = {}
        self.labels: dict[str, list[str]] = {}
        self.epoch: int | None = None
        self._order: np.ndarray | None = None

    # ----- what subclasses implement -----
    def _corpus_num_seqs(self) -> int:
        raise NotImplementedError

    def _corpus_lengths(self) -> np.ndarray:
        """``(corpus_num_seqs, len(data_keys))`` int64, columns in ``data_keys`` order."""
        raise NotImplementedError

    def _corpus_tag(self, corpus_idx: int) -> str:
        raise NotImplementedError

    def _corpus_data(self, corpus_idx: int, key: str) -> np.ndarray:
        raise NotImplementedError

    def _read_corpus_into(self, corpus_idx: int, key: str, out: np.ndarray, offset: int = 0) -> None:
        """Write frames ``offset .. offset + len(out)`` of the sequence into ``out`` (maybe another dtype)."""
        out[...] = self._corpus_data(corpus_idx, key)[offset:offset + len(out)]

    def _prepare_full_epoch(self, full_epoch: int) -> None:
        """Hook for datasets whose content depends on the (full) epoch, e.g. generated data."""

    # ----- epochs -----
    def init_seq_order(self, epoch: int) -> None:
        """Fix the sequences of (sub-)epoch ``epoch`` (1-based) and their order."""
        full_epoch = (epoch - 1) // self.partition_epoch + 1
        self._prepare_full_epoch(full_epoch)
        self._order = ordering.epoch_order(
            self.seq_ordering, num_seqs=self._corpus_num_seqs(), epoch=epoch,
            get_lengths=lambda: self._corpus_lengths()[:, 0],
            partition_epoch=self.partition_epoch, fixed_random_seed=self.fixed_random_seed,
            random_seed_offset=self.random_seed_offset)
        self.epoch = epoch

    @property
    def order(self) -> np.ndarray:
        """Corpus indices of the current (sub-)epoch, in order."""
        if self._order is None:
            raise RuntimeError(f"{self.name}: call init_seq_order(epoch) before reading sequences")
        return self._order

    @property
    def num_seqs(self) -> int:
        """Sequences in the current (sub-)epoch."""
        return len(self.order)

    @property
    def corpus_num_seqs(self) -> int:
        return self._corpus_num_seqs()

    # ----- sequences (seq_idx: position in the current epoch order) -----
    def get_corpus_seq_idx(self, seq_idx: int) -> int:
        return int(self.order[seq_idx])

    def get_seq_tag(self, seq_idx: int) -> str:
        return self._corpus_tag(self.get_corpus_seq_idx(seq_idx))

    def get_data(self, seq_idx: int, key: str) -> np.ndarray:
        return self._corpus_data(self.get_corpus_seq_idx(seq_idx), key)

    def read_into(self, seq_idx: int, key: str, out: np.ndarray, offset: int = 0) -> None:
        """Write frames ``offset .. offset + len(out)`` of sequence ``seq_idx`` of ``key`` into ``out``
        (the whole sequence when ``out`` has its length)."""
        self._read_corpus_into(self.get_corpus_seq_idx(seq_idx), key, out, offset)

    def will_read(self, positions: np.ndarray, next_epoch_start: int = 0) -> None:
        """Hint: this process's batches read these positions of the epoch next, in this order, and the
        next epoch's first ``next_epoch_start`` positions are likely read first then (a dataset that
        computes its sequences may start in the background: ``prefetch.py``)."""

    def get_seq_length(self, seq_idx: int) -> dict[str, int]:
        row = self._corpus_lengths()[self.get_corpus_seq_idx(seq_idx)]
        return {key: int(n) for key, n in zip(self._keys, row)}

    def epoch_seq_lengths(self) -> np.ndarray:
        """``(num_seqs, len(data_keys))`` lengths of the current epoch's sequences, in epoch order."""
        return self._corpus_lengths()[self.order]

    # ----- data keys -----
    @property
    def data_keys(self) -> list[str]:
        return list(self._keys)

    def key_info(self, key: str) -> DataKeyInfo:
        try:
            return self._keys[key]
        except KeyError:
            raise DataError(f"{self.name} has no data key '{key}'; its keys are {self.data_keys}.") from None

    def get_data_dim(self, key: str) -> int:
        return self.key_info(key).dim

    def is_sparse(self, key: str) -> bool:
        return self.key_info(key).sparse

    def get_data_dtype(self, key: str) -> str:
        return self.key_info(key).dtype

    def get_data_shape(self, key: str) -> tuple[int, ...]:
        return self.key_info(key).shape

    @property
    def num_outputs(self) -> dict[str, tuple[int, int]]:
        """RETURNN's convention: key -> (dim, ndim without batch)."""
        return {key: (info.dim, info.ndim) for key, info in self._keys.items()}

    def close(self) -> None:
        """Release files; the default has none."""

    def __repr__(self) -> str:
        return f"<{self.name}: {self._corpus_num_seqs()} seqs, keys {self.data_keys}>"
