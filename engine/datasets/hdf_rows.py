"""An HDF file whose sequences and lengths are known before its data: laid out once, then filled by any
number of processes at the same time (the ``forward`` task's output, every rank writing its own rows).

``create_rows_file`` writes the layout of ``HDFWriter``'s file with only ``data`` (``docs/hdf-format.md``:
``seqTags``, ``seqLengths`` with the dummy second column, ``labels``, the root attributes), with
``inputs`` as one allocated, contiguous block of little-endian float32 rows, and returns where that
block starts in the file. ``RowWriter`` then writes rows straight into the block (``pwrite``): no HDF5
call, so processes that write disjoint rows never touch HDF5's metadata, and nothing is copied or merged
afterwards. The result is a plain HDF5 file; h5py and RETURNN read it like any other.
"""
from __future__ import annotations

import os
from typing import Sequence

import h5py
import numpy as np

from engine.runtime.errors import DataError

_STR = h5py.string_dtype("utf-8")
ROW_DTYPE = np.dtype("<f4")


def create_rows_file(path: str, tags: Sequence[str], lengths: np.ndarray, dim: int) -> int | None:
    """Lay out ``path`` for sequences ``tags`` of ``lengths`` frames of ``dim`` floats; returns the byte
    offset of the ``inputs`` block (None when it holds no frames)."""
    lengths = np.asarray(lengths, np.int32).reshape(-1)
    frames = int(lengths.sum())
    with h5py.File(path, "w") as f:
        f.create_dataset("seqTags", data=np.array(list(tags), dtype=object), dtype=_STR)
        f.create_dataset("seqLengths", data=np.stack([lengths, lengths], axis=1))  # + RETURNN's dummy column
        f.create_dataset("labels", data=np.array([], dtype=object), dtype=_STR)
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # the block exists, at a fixed offset, from now
        plist.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # every row is written by a RowWriter
        space = h5py.h5s.create_simple((frames, dim))
        inputs = h5py.h5d.create(f.id, b"inputs", h5py.h5t.IEEE_F32LE, space, dcpl=plist)
        offset = inputs.get_offset() if frames and dim else None
        f.attrs["inputPattSize"] = dim
        f.attrs["numSeqs"] = np.int64(len(lengths))
        f.attrs["numTimesteps"] = np.int64(frames)
        f.attrs["numLabels"] = np.int64(dim)
        f.attrs["numDims"] = np.int64(1)
    return offset


def add_target(path: str, key: str, sequences: Sequence[np.ndarray], dim: int, labels: Sequence[str]) -> None:
    """Add the sparse target ``key`` (one int32 array per sequence, in file order) to a file
    ``create_rows_file`` laid out: its lengths become ``seqLengths``' second column (the dummy one)."""
    with h5py.File(path, "r+") as f:
        lengths = f["seqLengths"][:]
        if len(sequences) != len(lengths) or lengths.shape[1] != 2:
            raise DataError(f"'{path}': {len(sequences)} sequences of target {key!r} for a file of "
                            f"{len(lengths)} sequences and {lengths.shape[1]} length columns.")
        lengths[:, 1] = [len(seq) for seq in sequences]
        f["seqLengths"][:] = lengths
        values = np.concatenate([np.zeros(0, np.int32)] + [np.asarray(seq, np.int32) for seq in sequences])
        f.create_dataset(f"targets/data/{key}", data=values)
        f.require_group("targets/size").attrs[key] = np.array([dim, 1], dtype=np.int32)
        names = np.array(list(labels), dtype=object)
        f.require_group("targets/labels").create_dataset(key, data=names, dtype=_STR)


class RowWriter:
    """Writes rows of ``dim`` floats into the ``inputs`` block of a file ``create_rows_file`` laid out."""

    def __init__(self, path: str, offset: int | None, dim: int) -> None:
        self.path, self.offset, self.row_bytes = path, offset, dim * ROW_DTYPE.itemsize
        try:
            self._fd = os.open(path, os.O_WRONLY)
        except OSError as exc:
            raise DataError(f"Cannot open the output file '{path}' for writing: {exc.strerror}. All ranks "
                            "write into it: it must be on storage that every rank sees.") from None

    def write(self, first_row: int, rows: np.ndarray) -> None:
        """``rows`` (n, dim) at rows ``first_row``.. of the block."""
        data = np.ascontiguousarray(rows, dtype=ROW_DTYPE)
        if not data.size:
            return
        view = memoryview(data).cast("B")
        position = self.offset + first_row * self.row_bytes
        try:
            while view:
                written = os.pwrite(self._fd, view, position)
                view, position = view[written:], position + written
        except OSError as exc:
            raise DataError(f"Cannot write to the output file '{self.path}': {exc.strerror}.") from None

    def close(self) -> None:
        """Flush the rows to disk (before another process renames or reads the file)."""
        if self._fd < 0:
            return
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise DataError(f"Cannot write to the output file '{self.path}': {exc.strerror}.") from None
        finally:
            os.close(self._fd)
            self._fd = -1
