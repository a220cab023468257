"""Direct reads of uncompressed HDF5 datasets: one ``os.preadv`` per sequence, straight into the batch.

Reading a sequence through h5py costs a fixed ~10 us of selection handling plus a copy into a new
array, which the batcher then copies again into the padded batch. For the common layouts of corpus
files the rows of a stream lie contiguously in the file: contiguous datasets (RETURNN's ``hdf_dump``),
and chunked datasets whose chunks span whole rows without filters (resizable datasets of the streaming
writers). For those we locate the chunks once and read bytes straight into the caller's buffer.
Anything else (compression or other filters, non-native byte order, external or virtual storage,
missing chunks) gets ``None`` from ``RawRows.open`` and the reader uses h5py. The layout interpretation
is checked against h5py on sample rows at open time, so a misread falls back instead of corrupting data.
"""
from __future__ import annotations

import math
import os

import h5py
import numpy as np

from engine.runtime.errors import DataError


class RawRows:
    """Raw reads of one dataset by row: rows ``[k * chunk_rows, ...)`` start at byte ``offsets[k]``."""

    def __init__(self, fd: int, ds: h5py.Dataset, chunk_rows: int, offsets: np.ndarray) -> None:
        self.fd = fd
        self.dtype = ds.dtype
        self.row_shape = ds.shape[1:]
        self.row_bytes = ds.dtype.itemsize * math.prod(self.row_shape)
        self.num_rows = ds.shape[0]
        self.chunk_rows = chunk_rows
        self.offsets = [int(o) for o in offsets]
        self.where = f"'{ds.name}' in HDF file '{ds.file.filename}'"

    @classmethod
    def open(cls, fd: int | None, ds: h5py.Dataset) -> RawRows | None:
        if fd is None or not hasattr(os, "preadv") or ds.dtype.kind not in "biuf" or not ds.dtype.isnative:
            return None
        if ds.is_virtual or ds.ndim < 1 or ds.shape[0] == 0:
            return None
        plist = ds.id.get_create_plist()
        if plist.get_nfilters() or plist.get_external_count():
            return None
        if ds.chunks is None:
            offset = ds.id.get_offset()
            raw = None if offset is None else cls(fd, ds, ds.shape[0], np.array([offset]))
        else:
            raw = cls._open_chunked(fd, ds)
        return raw if raw is not None and raw._agrees_with_h5py(ds) else None

    @classmethod
    def _open_chunked(cls, fd: int, ds: h5py.Dataset) -> RawRows | None:
        if tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
            return None  # a chunk holds partial rows: rows are not contiguous in the file
        chunk_rows = ds.chunks[0]
        num_chunks = -(-ds.shape[0] // chunk_rows)
        offsets = np.full(num_chunks, -1, dtype=np.int64)
        if hasattr(ds.id, "chunk_iter"):
            def visit(info) -> None:
                offsets[info.chunk_offset[0] // chunk_rows] = info.byte_offset
            ds.id.chunk_iter(visit)
        else:
            for i in range(num_chunks):
                info = ds.id.get_chunk_info_by_coord((i * chunk_rows,) + (0,) * (ds.ndim - 1))
                offsets[i] = -1 if info.byte_offset is None else info.byte_offset
        if (offsets < 0).any():
            return None  # unwritten chunks read as fill value: leave them to HDF5
        return cls(fd, ds, chunk_rows, offsets)

    def _agrees_with_h5py(self, ds: h5py.Dataset) -> bool:
        n = self.num_rows
        for start in {0, min(n - 1, self.chunk_rows - 1), n // 2, n - 1}:
            stop = min(n, start + 2)
            out = np.empty((stop - start,) + self.row_shape, self.dtype)
            try:
                self.read_into(start, out)
            except DataError:
                return False
            if out.tobytes() != ds[start:stop].tobytes():
                return False
        return True

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Rows ``[start, start + len(out))`` into ``out`` (C-contiguous, this dataset's dtype)."""
        if out.size == 0:
            return
        buf = memoryview(out).cast("B")
        pos, num = 0, out.shape[0]
        while num > 0:
            chunk, row_in_chunk = divmod(start, self.chunk_rows)
            take = min(num, self.chunk_rows - row_in_chunk)
            nbytes = take * self.row_bytes
            offset = self.offsets[chunk] + row_in_chunk * self.row_bytes
            self._pread_exact(buf[pos:pos + nbytes], offset, start)
            start, num, pos = start + take, num - take, pos + nbytes

    def _pread_exact(self, buf: memoryview, offset: int, row: int) -> None:
        done = 0
        while done < len(buf):  # regular files return short counts only at EOF or for huge reads
            got = os.preadv(self.fd, [buf[done:]], offset + done)
            if got <= 0:
                raise DataError(f"Reading row {row} of {self.where} hit the end of the file: the file is "
                                f"truncated or was changed while in use.")
            done += got
