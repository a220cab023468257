"""``InMemoryDataset``: a corpus held in RAM as flat streams, the same layout as an HDF file.

Each key's sequences are concatenated along time in one array; per-sequence lengths give the offsets.
The NumPy-file dataset and the generated 12AX task build on it.
"""
from __future__ import annotations

import numpy as np

from engine.datasets.base import DataKeyInfo, Dataset


class InMemoryDataset(Dataset):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._streams: dict[str, np.ndarray] = {}
        self._lengths = np.zeros((0, 0), np.int64)
        self._starts = np.zeros((0, 0), np.int64)
        self._tags: list[str] = []

    def _set_corpus(self, keys: dict[str, DataKeyInfo], streams: dict[str, np.ndarray], lengths: np.ndarray,
                    tags: list[str]) -> None:
        """``streams[key]`` flat ``(total_frames, *shape)``; ``lengths`` ``(num_seqs, len(keys))``."""
        self._keys = dict(keys)
        self._streams = {key: streams[key] for key in keys}
        self._lengths = np.asarray(lengths, dtype=np.int64).reshape(len(tags), len(keys))
        self._starts = np.cumsum(self._lengths, axis=0) - self._lengths
        self._col = {key: i for i, key in enumerate(keys)}
        self._tags = list(tags)

    def _corpus_num_seqs(self) -> int:
        return len(self._tags)

    def _corpus_lengths(self) -> np.ndarray:
        return self._lengths

    def _corpus_tag(self, corpus_idx: int) -> str:
        return self._tags[corpus_idx]

    def _rows(self, corpus_idx: int, key: str) -> np.ndarray:
        col = self._col.get(key)
        if col is None:
            self.key_info(key)  # raises the DataError naming the keys
        start = int(self._starts[corpus_idx, col])
        return self._streams[key][start:start + int(self._lengths[corpus_idx, col])]

    def _corpus_data(self, corpus_idx: int, key: str) -> np.ndarray:
        return self._rows(corpus_idx, key).copy()

    def _read_corpus_into(self, corpus_idx: int, key: str, out: np.ndarray, offset: int = 0) -> None:
        out[...] = self._rows(corpus_idx, key)[offset:offset + len(out)]
