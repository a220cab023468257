"""Many short label sequences kept in one flat array of the smallest unsigned type that holds the labels,
so that a corpus of millions of lines costs a few bytes a token, not a Python object a line."""
from __future__ import annotations

import array
from typing import Iterable

import numpy as np


class TokenStore:
    def __init__(self, num_labels: int) -> None:
        self._code = "B" if num_labels <= 1 << 8 else "H" if num_labels <= 1 << 16 else "I"
        self._flat = array.array(self._code)
        self._ends = array.array("q")
        self.tokens: np.ndarray | None = None  # set by finish()
        self.ends: np.ndarray | None = None

    def append(self, ids: Iterable[int]) -> None:
        self._flat.extend(ids)
        self._ends.append(len(self._flat))

    def finish(self) -> TokenStore:
        """No more appends: the arrays become numpy arrays."""
        self.tokens = np.array(self._flat, dtype=np.dtype(self._code)) if len(self._flat) else \
            np.zeros(0, np.dtype(self._code))
        self.ends = np.array(self._ends, dtype=np.int64) if len(self._ends) else np.zeros(0, np.int64)
        self._flat, self._ends = array.array(self._code), array.array("q")
        return self

    def __len__(self) -> int:
        return len(self.ends)

    def get(self, i: int) -> np.ndarray:
        start = int(self.ends[i - 1]) if i else 0
        return self.tokens[start:int(self.ends[i])]

    def lengths(self) -> np.ndarray:
        return np.diff(self.ends, prepend=0)
