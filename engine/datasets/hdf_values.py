"""Open-time checks of the values in an HDF corpus stream, read block by block (bounded memory).

A class id outside ``[0, dim)`` would otherwise open fine and end the first training step with a
TensorFlow traceback (or, on GPU, silently index garbage); a NaN in the features would turn the loss
into NaN hours later. Both are found here, at start-up, with the file, object, sequence and value named.
"""
from __future__ import annotations

from typing import Callable

import h5py
import numpy as np

from engine.runtime.errors import DataError

_BLOCK_BYTES = 16 << 20


def _blocks(ds: h5py.Dataset):
    """``(first_row, array)`` for consecutive row blocks of about ``_BLOCK_BYTES``, whole chunks each."""
    row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
    rows = max(1, _BLOCK_BYTES // row_bytes)
    if ds.chunks is not None and rows > ds.chunks[0]:
        rows -= rows % ds.chunks[0]  # whole chunks: HDF5 decodes each chunk once
    for start in range(0, ds.shape[0], rows):
        yield start, ds[start:start + rows]


class StreamValues:
    """The value checks of one stream: ``where`` names file and object in errors; ``lengths`` are the
    stream's per-sequence lengths (its ``seqLengths`` column), ``tags`` the sequence tags."""

    def __init__(self, where: str, ds: h5py.Dataset, lengths: np.ndarray, tag: Callable[[int], str]) -> None:
        self.where, self.ds, self.tag = where, ds, tag
        self.seq_ends = np.cumsum(lengths)

    def _locate(self, row: int) -> str:
        seq = int(np.searchsorted(self.seq_ends, row, side="right"))
        frame = row - (int(self.seq_ends[seq - 1]) if seq else 0)
        return f"sequence '{self.tag(seq)}' (number {seq}, frame {frame})"

    def check_class_ids(self, dim: int, dim_source: str) -> None:
        """Every value in ``[0, dim)``."""
        for start, block in _blocks(self.ds):
            if block.size and (block.min() < 0 or block.max() >= dim):
                row = start + int(np.flatnonzero((block < 0) | (block >= dim))[0])
                raise DataError(
                    f"{self.where}: class id {self.ds[row]} in {self._locate(row)} is outside [0, {dim}) "
                    f"(dim {dim} from {dim_source}). The corpus and its dim disagree: fix the file, or "
                    f"the dim if the file is right.")

    def check_finite(self) -> None:
        """No NaN or +-Inf (float streams only)."""
        if self.ds.dtype.kind != "f":
            return
        for start, block in _blocks(self.ds):
            rows = block.reshape(len(block), -1)
            bad = ~np.isfinite(rows)
            if bad.any():
                first = int(np.flatnonzero(bad.any(axis=1))[0])
                row, value = start + first, rows[first][bad[first]][0]
                raise DataError(f"{self.where}: value {value} in {self._locate(row)} is not finite "
                                f"(check_finite is on). Fix or drop that sequence.")
