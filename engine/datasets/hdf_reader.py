"""``HDFDataset``: RETURNN's HDF corpus layout (``docs/hdf-format.md``), one or several files.

Every file is checked completely when it is opened (objects, shapes, lengths against streams, agreement
between files, sparse class ids within ``[0, dim)``; with ``check_finite`` also no NaN/Inf in float
streams), so a broken corpus fails at start-up with the file, object and sequence named, not hours into
training. Data is read per sequence: with ``cache_size`` 0 straight from the file (only what is asked
for); with ``cache_size`` > 0 that many bytes of the corpus are preloaded into memory on first use,
smallest streams first (targets are small and cost a read per sequence each), the rest read from file.
"""
from __future__ import annotations

import os
import re

import h5py
import numpy as np

from engine.datasets.base import DataKeyInfo, Dataset
from engine.datasets.hdf_raw import RawRows
from engine.datasets.hdf_values import StreamValues
from engine.runtime.errors import DataError

_SIZE_SUFFIX = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_byte_size(value: int | float | str | None, *, key: str = "cache_size") -> int:
    """``0``, ``"0"``, ``1048576``, ``"512M"``, ``"1.5G"`` -> bytes (K/M/G/T are powers of 1024)."""
    if value is None:
        return 0
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([BKMGT]?)B?\s*", str(value), flags=re.IGNORECASE)
    if isinstance(value, bool) or not match:
        raise DataError(f"{key} {value!r} is not a byte size; give a number of bytes or a string like "
                        f"'0', '512M' or '2G'.")
    return int(float(match.group(1)) * _SIZE_SUFFIX[match.group(2).upper()])


def decode_str(item: bytes | str) -> str:
    """A tag or label as stored (fixed NUL-padded bytes or variable-length str) -> str."""
    if isinstance(item, (bytes, np.bytes_)):
        item = bytes(item).decode("utf-8", errors="replace")
    return str(item).split("\0")[0]


class _Stream:
    """One data key's stream in one file: reads rows from the cache, raw, or through h5py."""

    def __init__(self, ds: h5py.Dataset, fd: int | None) -> None:
        self.ds = ds
        self.raw = RawRows.open(fd, ds)
        self.nbytes = int(ds.size * ds.dtype.itemsize)
        self.cache_rows = 0  # rows [0, cache_rows) are preloaded on first use
        self.cache: np.ndarray | None = None

    def _cached(self, stop: int) -> bool:
        if stop > self.cache_rows:
            return False
        if self.cache is None:
            self.cache = self.ds[:self.cache_rows]
        return True

    def read(self, start: int, stop: int) -> np.ndarray:
        if self._cached(stop):
            return self.cache[start:stop].copy()
        if self.raw is None:  # h5py keeps the file's byte order; callers get native arrays
            data = self.ds[start:stop]
            return data if data.dtype.isnative else data.astype(data.dtype.newbyteorder("="))
        out = np.empty((stop - start,) + self.ds.shape[1:], self.raw.dtype)
        self.raw.read_into(start, out)
        return out

    def read_into(self, start: int, out: np.ndarray) -> None:
        stop = start + out.shape[0]
        if self._cached(stop):
            out[...] = self.cache[start:stop]
        elif self.raw is not None and out.dtype == self.raw.dtype:
            self.raw.read_into(start, out)
        else:
            out[...] = self.read(start, stop)


class _HDFFile:
    """One opened and checked corpus file."""

    def __init__(self, path: str, check_finite: bool = False) -> None:
        self.path = path
        self.check_finite = check_finite
        if not os.path.isfile(path):
            raise DataError(f"HDF file '{path}' does not exist (working directory: {os.getcwd()}).")
        try:
            self.h5 = h5py.File(path, "r")
        except OSError as exc:
            raise DataError(f"HDF file '{path}' cannot be opened: it is not an HDF5 file, or it is truncated "
                            f"or damaged ({exc}).") from None
        try:
            self._check_and_load()
            # raw reads use HDF5's own descriptor (positional reads leave its state alone), so a corpus of
            # hundreds of files does not need twice as many open files
            self.fd = self.h5.id.get_vfd_handle() if self.h5.driver == "sec2" else None
            self.streams = {key: _Stream(ds, self.fd) for key, ds in self._datasets.items()}
        except BaseException:
            self.h5.close()
            raise

    def _error(self, obj: str, problem: str) -> DataError:
        return DataError(f"HDF file '{self.path}', object '{obj}': {problem}")

    def _dataset(self, name: str) -> h5py.Dataset:
        obj = self.h5.get(name)
        if obj is None:
            raise self._error(name, "required object is missing.")
        if not isinstance(obj, h5py.Dataset):
            raise self._error(name, "expected a dataset, found a group.")
        return obj

    def _check_and_load(self) -> None:
        tags = self._dataset("seqTags")
        if tags.ndim != 1:
            raise self._error("seqTags", f"expected a 1-D dataset of strings, found shape {tags.shape}.")
        lengths_ds = self._dataset("seqLengths")
        if lengths_ds.ndim != 2 or lengths_ds.dtype.kind not in "iu":
            raise self._error("seqLengths", f"expected a 2-D integer dataset (num_seqs, columns), found "
                                            f"shape {lengths_ds.shape} dtype {lengths_ds.dtype}.")
        self.tags = tags[...]
        lengths = lengths_ds[...].astype(np.int64)
        if len(self.tags) != len(lengths):
            raise self._error("seqTags", f"has {len(self.tags)} entries, but seqLengths has {len(lengths)} "
                                         f"rows; both must count the same sequences.")
        self.num_seqs = len(lengths)

        target_keys = self._target_keys()
        self.keys = (["data"] if "inputs" in self.h5 else []) + target_keys
        if not self.keys:
            raise self._error("inputs", "the file has neither 'inputs' nor any 'targets/data/<key>' stream.")
        cols = lengths.shape[1]
        # without a targets group RETURNN assumes a dummy 'classes' column: 2 columns are fine then
        allowed = {len(self.keys)} | ({2} if "targets" not in self.h5 else set())
        if cols not in allowed:
            raise self._error("seqLengths", f"has {cols} columns, expected {len(self.keys)} (one per "
                                            f"stream in the order {self.keys}).")
        self.lengths = np.ascontiguousarray(lengths[:, :len(self.keys)])
        if (self.lengths < 0).any():
            row, col = np.argwhere(self.lengths < 0)[0]
            tag = decode_str(self.tags[row])
            raise self._error("seqLengths", f"has a negative length {self.lengths[row, col]} for sequence "
                                            f"{row} ('{tag}'), key '{self.keys[col]}'.")

        self.infos: dict[str, DataKeyInfo] = {}
        self._datasets: dict[str, h5py.Dataset] = {}
        for col, key in enumerate(self.keys):
            ds_name = "inputs" if key == "data" else f"targets/data/{key}"
            ds = self._datasets[key] = self._dataset(ds_name)
            if ds.dtype.kind not in "biuf" or ds.ndim < 1:
                raise self._error(ds_name, f"expected a numeric array with a time axis, found dtype "
                                           f"{ds.dtype} shape {ds.shape}.")
            total = int(self.lengths[:, col].sum())
            if total != ds.shape[0]:
                raise self._error(ds_name, f"has {ds.shape[0]} frames, but column {col} of seqLengths "
                                           f"sums to {total}.")
            self.infos[key] = self._input_info(ds) if key == "data" else self._target_info(key, ds)
            self._check_values(ds_name, ds, col, self.infos[key])
        self.labels = self._labels()

    def _check_values(self, ds_name: str, ds: h5py.Dataset, col: int, info: DataKeyInfo) -> None:
        values = StreamValues(f"HDF file '{self.path}', object '{ds_name}'", ds, self.lengths[:, col],
                              lambda seq: decode_str(self.tags[seq]))
        if info.sparse:
            dim_source = ("root attribute inputPattSize" if ds_name == "inputs"
                          else f"targets/size attribute '{ds_name.rsplit('/', 1)[-1]}'")
            values.check_class_ids(info.dim, dim_source)
        elif self.check_finite:
            values.check_finite()

    def _target_keys(self) -> list[str]:
        if "targets" not in self.h5:
            return []
        for sub in ("data", "size", "labels"):
            if not isinstance(self.h5["targets"].get(sub), h5py.Group):
                raise self._error(f"targets/{sub}", "missing: a 'targets' group needs all of the groups "
                                                    "targets/data, targets/size and targets/labels.")
        targets = self.h5["targets"]
        keys = sorted(set(targets["data"]) | set(targets["labels"]) | set(targets["size"].attrs))
        for key in keys:
            if key not in targets["data"]:
                raise self._error(f"targets/data/{key}", "missing, but targets/labels or targets/size "
                                                         "names this key.")
            if key not in targets["size"].attrs:
                raise self._error("targets/size", f"has no attribute '{key}' (its dim) for stream "
                                                  f"targets/data/{key}.")
        return keys

    def _input_info(self, ds: h5py.Dataset) -> DataKeyInfo:
        sparse = ds.dtype.kind in "iu" and ds.ndim == 1
        patt_size = self.h5.attrs.get("inputPattSize")
        if ds.ndim >= 2:
            dim = ds.shape[-1]
        elif patt_size is None:
            if sparse:
                raise self._error("inputPattSize", "root attribute missing; sparse 'inputs' need it as the "
                                                   "class count.")
            dim = 1
        else:
            dim = int(np.asarray(patt_size).reshape(-1)[0])
        return DataKeyInfo(dim=dim, sparse=sparse, dtype=ds.dtype.name, shape=ds.shape[1:])

    def _target_info(self, key: str, ds: h5py.Dataset) -> DataKeyInfo:
        size = np.asarray(self.h5["targets/size"].attrs[key])
        where = f"targets/size attribute '{key}'"
        if size.ndim == 0:
            dim, ndim = int(size), ds.ndim
        elif size.shape == (2,):
            dim, ndim = int(size[0]), int(size[1])
        else:
            raise self._error(where, f"expected a scalar dim or [dim, ndim], found {size.tolist()}.")
        if ndim != ds.ndim:
            raise self._error(where, f"says ndim {ndim}, but targets/data/{key} has shape {ds.shape}.")
        if ds.ndim >= 2 and dim != ds.shape[-1]:
            raise self._error(where, f"says dim {dim}, but targets/data/{key} has shape {ds.shape}.")
        sparse = ds.dtype.kind in "iu" and ndim <= 1
        return DataKeyInfo(dim=dim, sparse=sparse, dtype=ds.dtype.name, shape=ds.shape[1:])

    def _labels(self) -> dict[str, list[str]]:
        found = {}
        if "data" in self.infos and isinstance(self.h5.get("labels"), h5py.Dataset):
            found["data"] = self.h5["labels"][...]
        for key in self.keys:
            if key != "data" and isinstance(self.h5.get(f"targets/labels/{key}"), h5py.Dataset):
                found[key] = self.h5[f"targets/labels/{key}"][...]
        # RETURNN's writers store dummy label lists (e.g. one 'dummy-label'): keep only real ones
        return {key: [decode_str(x) for x in names.reshape(-1)] for key, names in found.items()
                if len(names) == self.infos[key].dim}

    def close(self) -> None:
        self.h5.close()


class HDFDataset(Dataset):
    """Sequences of one or several HDF files, concatenated in the order given.

    ``cache_size``: bytes of the corpus to preload (see above). ``check_finite``: also scan every dense
    float stream (``inputs``, dense targets) for NaN and +-Inf when opening, and refuse the file naming
    the first bad sequence; off by default because it reads the whole corpus once (about as long as
    reading it from disk), while the class-id check (always on) reads only the small sparse streams.
    """

    def __init__(self, files: list[str] | str, *, cache_size: int | str = 0, check_finite: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if not isinstance(check_finite, bool):
            raise DataError(f"{self.name}: check_finite must be True or False, got {check_finite!r}.")
        self.cache_size = parse_byte_size(cache_size)
        if isinstance(files, str):
            files = [files]
        if not files or not all(isinstance(f, str) for f in files):
            raise DataError(f"{self.name}: 'files' must be a non-empty list of HDF file names, "
                            f"got {files!r}.")
        self.files: list[_HDFFile] = []
        try:
            for path in files:
                self._add_file(_HDFFile(path, check_finite))
        except BaseException:
            self.close()
            raise
        self._col = {key: i for i, key in enumerate(self._keys)}
        counts = [f.num_seqs for f in self.files]
        self._file_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._seq_file = np.repeat(np.arange(len(self.files), dtype=np.int32), counts)
        self._lengths = np.concatenate([f.lengths for f in self.files]).astype(np.int64)
        # start row of every sequence within its own file's stream, per key column
        self._seq_start = np.concatenate(
            [np.cumsum(f.lengths, axis=0) - f.lengths for f in self.files]).astype(np.int64)
        self._plan_cache(self.cache_size)

    def _add_file(self, new: _HDFFile) -> None:
        if not self.files:
            self._keys, self.labels = dict(new.infos), dict(new.labels)
            self.files.append(new)
            return
        first = self.files[0]
        if new.keys != first.keys:
            new.close()
            raise DataError(f"HDF files '{first.path}' and '{new.path}' have different data keys: "
                            f"{first.keys} vs {new.keys}. Files of one corpus must have the same streams.")
        for key in new.keys:
            a, b = first.infos[key], new.infos[key]
            if (a.dim, a.ndim, a.shape, a.dtype) != (b.dim, b.ndim, b.shape, b.dtype):
                new.close()
                what = "inputs (inputPattSize)" if key == "data" else f"targets/size '{key}'"
                raise DataError(
                    f"HDF files '{first.path}' and '{new.path}' disagree on {what}: [dim, ndim] "
                    f"{[a.dim, a.ndim]} vs {[b.dim, b.ndim]}, frame shape {a.shape} vs {b.shape}, "
                    f"dtype {a.dtype} vs {b.dtype}.")
        for key, names in new.labels.items():
            self.labels.setdefault(key, names)
        self.files.append(new)

    def _plan_cache(self, budget: int) -> None:
        """Preload whole streams, smallest first, then a prefix of the next one; the rest stays on disk."""
        streams = sorted((s for f in self.files for s in f.streams.values()), key=lambda s: s.nbytes)
        for stream in streams:
            if budget <= 0:
                break
            row_bytes = max(1, stream.nbytes // max(1, stream.ds.shape[0]))
            stream.cache_rows = min(stream.ds.shape[0], budget // row_bytes)
            budget -= stream.cache_rows * row_bytes

    # ----- Dataset implementation -----
    def _corpus_num_seqs(self) -> int:
        return len(self._lengths)

    def _corpus_lengths(self) -> np.ndarray:
        return self._lengths

    def _locate(self, corpus_idx: int, key: str) -> tuple[_Stream, int, int]:
        col = self._col.get(key)
        if col is None:
            self.key_info(key)  # raises the DataError naming the keys
        file = self.files[self._seq_file[corpus_idx]]
        return file.streams[key], int(self._seq_start[corpus_idx, col]), int(self._lengths[corpus_idx, col])

    def _corpus_tag(self, corpus_idx: int) -> str:
        f = self._seq_file[corpus_idx]
        return decode_str(self.files[f].tags[corpus_idx - self._file_start[f]])

    def _corpus_data(self, corpus_idx: int, key: str) -> np.ndarray:
        stream, start, length = self._locate(corpus_idx, key)
        return stream.read(start, start + length)

    def _read_corpus_into(self, corpus_idx: int, key: str, out: np.ndarray, offset: int = 0) -> None:
        stream, start, length = self._locate(corpus_idx, key)
        assert 0 <= offset and offset + out.shape[0] <= length, (offset, out.shape, length)
        stream.read_into(start + offset, out)

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []

    def __repr__(self) -> str:
        paths = ", ".join(f.path for f in self.files[:3]) + (f", ... ({len(self.files)} files)"
                                                             if len(self.files) > 3 else "")
        return f"<HDFDataset [{paths}]: {self._corpus_num_seqs()} seqs, keys {self.data_keys}>"
