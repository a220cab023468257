"""``HDFWriter``: streams sequences into an HDF file in RETURNN's layout (``docs/hdf-format.md``).

Sequences are appended one at a time with no second pass: they are buffered up to ``flush_bytes`` and
appended to resizable (chunked) datasets, the way RETURNN's streaming writer works. The file is
written under a temporary name in the target directory (created as ``engine.runtime.atomic_file`` does:
unpredictable name, exclusive, never through a planted symlink) and flushed to disk and renamed on
``close()``, so an interrupted write (exception, kill, full disk) never leaves a broken file under the
final name; on an exception inside ``with HDFWriter(...)`` the temporary file is removed.

Layout choices that keep RETURNN's reader happy: ``data`` becomes ``inputs``; every other key becomes a
target with all of ``targets/data``, ``targets/size`` (``[dim, ndim]``) and ``targets/labels``; the
columns of ``seqLengths`` are ``data`` then the targets in sorted order, and a file with only ``data``
gets no ``targets`` group and a second (dummy) column, which RETURNN expects in that case.

``returnn_dump=True`` (``hdf-dump``) writes what RETURNN's ``HDFDatasetWriter.dump_from_dataset`` writes
for a dataset with ``data`` and targets, dtype for dtype: tags and label names as fixed-width bytes
(``S<longest + 1>``; tags kept in memory and written at the end, where the longest is known), a target
without label names named ``<key>-class-<i>``, ``targets/size`` as int64, no input ``labels`` and of the
file's attributes only ``inputPattSize``. Otherwise it writes the layout of RETURNN's ``SimpleHDFWriter``
(variable-length UTF-8 strings, the old-format attributes ``numSeqs`` ... beside ``inputPattSize``).
"""
from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

import h5py
import numpy as np

from engine.datasets.base import DataKeyInfo
from engine.runtime.atomic_file import commit, create_temp_beside, discard
from engine.runtime.errors import DataError

_STR = h5py.string_dtype("utf-8")
_CHUNK_BYTES = 1 << 20


def _fixed_width(texts: Sequence[str]) -> np.ndarray:
    """UTF-8 bytes of each text in one fixed width, one byte more than the longest (RETURNN's ``S<n>``)."""
    encoded = [t.encode("utf-8") for t in texts]
    return np.array(encoded, dtype=f"S{max(map(len, encoded), default=0) + 1}")


class HDFWriter:
    """``HDFWriter(path, {"data": DataKeyInfo(dim=40), "classes": DataKeyInfo(dim=10, sparse=True)})``."""

    def __init__(self, path: str, keys: Mapping[str, DataKeyInfo], *,
                 labels: Mapping[str, Sequence[str]] | None = None, overwrite: bool = True,
                 flush_bytes: int = 16 << 20, returnn_dump: bool = False,
                 input_patt_size: int | None = None) -> None:
        """``input_patt_size``: the root attribute ``inputPattSize`` (default: the dim of ``data``, or 1)."""
        self.path = path
        self.input_patt_size = input_patt_size
        self.returnn_dump = returnn_dump
        self._all_tags: list[str] = []  # returnn_dump: written at close, as fixed-width bytes
        if not keys:
            raise DataError(f"HDFWriter '{path}': no data keys given; 'data' or a target is needed.")
        for key, info in keys.items():
            if not isinstance(info, DataKeyInfo) or not key or "/" in key:
                raise DataError(f"HDFWriter '{path}': key {key!r} must be a name without '/' mapped to a "
                                f"DataKeyInfo, got {info!r}.")
        self.infos = dict(keys)
        # column order of seqLengths: data first, then the targets sorted (RETURNN's reader expects this)
        self.keys = (["data"] if "data" in keys else []) + sorted(k for k in keys if k != "data")
        # a file with only 'data' has no targets group; RETURNN then expects a dummy second column
        self._dummy_column = self.keys == ["data"]
        self.labels = {k: list(v) for k, v in (labels or {}).items() if k in keys and v}
        for key, names in self.labels.items():
            if len(names) != keys[key].dim:
                raise DataError(f"HDFWriter '{path}': key '{key}' has dim {keys[key].dim} but {len(names)} "
                                f"label names.")
        if not overwrite and os.path.exists(path):
            raise DataError(f"Output file '{path}' exists already; remove it or allow overwriting.")
        self.flush_bytes = flush_bytes
        self.num_seqs = 0
        self.num_frames = {key: 0 for key in self.keys}
        self._buffer: dict[str, list[np.ndarray]] = {key: [] for key in self.keys}
        self._buffer_tags: list[str] = []
        self._buffer_lengths: list[list[int]] = []
        self._buffered_bytes = 0
        self._datasets: dict[str, h5py.Dataset] = {}
        try:
            self.tmp_path = create_temp_beside(path)
        except OSError as exc:
            folder = os.path.dirname(os.path.abspath(path))
            raise DataError(f"Cannot create output file '{path}' in '{folder}': {exc.strerror}.") from None
        self._h5: h5py.File | None = h5py.File(self.tmp_path, "w")

    # ----- writing -----
    def insert(self, tag: str, data: Mapping[str, np.ndarray]) -> None:
        """Append one sequence: an array for every key (``(T,)`` sparse, ``(T, *shape)`` dense)."""
        if self._h5 is None:
            raise RuntimeError(f"HDFWriter '{self.path}' is closed")
        if set(data) != set(self.keys):
            raise DataError(f"HDFWriter '{self.path}', sequence '{tag}': keys {sorted(data)} given, expected "
                            f"exactly {self.keys}.")
        arrays = {key: self._checked(tag, key, data[key]) for key in self.keys}
        for key, arr in arrays.items():
            self._buffer[key].append(arr)
            self._buffered_bytes += arr.nbytes
        self._buffer_tags.append(str(tag))
        self._buffer_lengths.append([len(arrays[key]) for key in self.keys])
        if self._buffered_bytes >= self.flush_bytes:
            self._flush()

    def _checked(self, tag: str, key: str, value: np.ndarray) -> np.ndarray:
        info = self.infos[key]
        arr = np.asarray(value)
        where = f"HDFWriter '{self.path}', sequence '{tag}', key '{key}'"
        if arr.ndim != 1 + len(info.shape) or arr.shape[1:] != info.shape:
            expected = "(T" + "".join(f", {d}" for d in info.shape) + ")"
            raise DataError(f"{where}: expected shape {expected}, got {arr.shape}.")
        if arr.dtype.kind not in "biuf" or not np.can_cast(arr.dtype, info.dtype, "same_kind"):
            raise DataError(f"{where}: dtype {arr.dtype} cannot be stored as {info.dtype}.")
        if info.sparse and arr.size and (arr.min() < 0 or arr.max() >= info.dim):
            raise DataError(f"{where}: class indices must lie in [0, {info.dim}), "
                            f"got {arr.min()}..{arr.max()}.")
        return np.ascontiguousarray(arr, dtype=info.dtype)

    def _flush(self) -> None:
        if not self._buffer_tags and self._datasets:
            return
        if not self._datasets:
            self._create_layout()
        for key in self.keys:
            self._append(self._datasets[key], self._buffer[key])
            self.num_frames[key] += sum(len(a) for a in self._buffer[key])
            self._buffer[key] = []
        lengths = np.array(self._buffer_lengths, dtype=np.int32).reshape(-1, len(self.keys))
        if self._dummy_column:
            lengths = np.concatenate([lengths, lengths], axis=1)
        self._append(self._datasets["seqLengths"], [lengths])
        if self.returnn_dump:
            self._all_tags += self._buffer_tags
        else:
            tags = self._datasets["seqTags"]
            tags.resize(self.num_seqs + len(self._buffer_tags), axis=0)
            tags[self.num_seqs:] = np.array(self._buffer_tags, dtype=object)
        self.num_seqs += len(self._buffer_tags)
        self._buffer_tags, self._buffer_lengths, self._buffered_bytes = [], [], 0

    @staticmethod
    def _append(ds: h5py.Dataset, parts: list[np.ndarray]) -> None:
        if not parts:
            return
        block = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if not len(block):
            return
        old = ds.shape[0]
        ds.resize(old + len(block), axis=0)
        ds[old:] = block

    def _create_layout(self) -> None:
        """Datasets are created at the first flush, when the buffered data tells a sensible chunk size."""
        h5 = self._h5
        num_cols = len(self.keys) + self._dummy_column
        seqs = max(1, len(self._buffer_tags))
        seq_chunk = min(seqs, 4096)
        if not self.returnn_dump:
            self._datasets["seqTags"] = h5.create_dataset("seqTags", (0,), dtype=_STR, maxshape=(None,),
                                                          chunks=(seq_chunk,))
        self._datasets["seqLengths"] = h5.create_dataset("seqLengths", (0, num_cols), dtype="int32",
                                                         maxshape=(None, num_cols),
                                                         chunks=(seq_chunk, num_cols))
        targets = [k for k in self.keys if k != "data"]
        if targets:
            for sub in ("data", "size", "labels"):
                h5.create_group(f"targets/{sub}")
        for key in self.keys:
            info = self.infos[key]
            row_bytes = max(1, np.dtype(info.dtype).itemsize * math.prod(info.shape))
            buffered_rows = sum(len(a) for a in self._buffer[key])
            chunk_rows = max(1, min(buffered_rows, _CHUNK_BYTES // row_bytes))
            name = "inputs" if key == "data" else f"targets/data/{key}"
            self._datasets[key] = h5.create_dataset(name, (0,) + info.shape, dtype=info.dtype,
                                                    maxshape=(None,) + info.shape,
                                                    chunks=(chunk_rows,) + info.shape)
            if key != "data":
                size_dtype = np.int64 if self.returnn_dump else np.int32
                h5["targets/size"].attrs[key] = np.array([info.dim, info.ndim], dtype=size_dtype)
                if self.returnn_dump:
                    names = self.labels.get(key) or [f"{key}-class-{i}" for i in range(info.dim)]
                    h5["targets/labels"].create_dataset(key, data=_fixed_width(names))
                else:
                    names = np.array(self.labels.get(key, []), dtype=object)
                    h5["targets/labels"].create_dataset(key, data=names, dtype=_STR)
        if not self.returnn_dump:
            h5.create_dataset("labels", data=np.array(self.labels.get("data", []), dtype=object), dtype=_STR)

    # ----- finishing -----
    def close(self) -> None:
        """Write what is buffered and move the file to its final name."""
        if self._h5 is None:
            return
        try:
            self._flush()
            attrs = self._h5.attrs
            main = self.keys[0]
            default_size = self.infos["data"].dim if "data" in self.infos else 1
            attrs["inputPattSize"] = default_size if self.input_patt_size is None else self.input_patt_size
            if self.returnn_dump:
                self._h5.create_dataset("seqTags", data=_fixed_width(self._all_tags))
            else:
                attrs["numSeqs"] = np.int64(self.num_seqs)
                attrs["numTimesteps"] = np.int64(self.num_frames[main])
                attrs["numLabels"] = np.int64(self.infos[main].dim)
                attrs["numDims"] = np.int64(1)
            self._h5.close()
            self._h5 = None
            commit(self.tmp_path, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop the file: nothing appears under the final name."""
        if self._h5 is not None:
            try:
                self._h5.close()
            except Exception:  # already failing; the temp file is removed either way
                pass
            self._h5 = None
        discard(self.tmp_path)

    def __enter__(self) -> HDFWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if getattr(self, "_h5", None) is not None:
            try:
                self.abort()  # never closed: an unfinished file must not be left behind
            except Exception:  # interpreter shutdown: modules may be gone already
                pass
