"""``NpzDataset``: a corpus in one NumPy ``.npz`` file, for data that exists as arrays already.

Layout (flat streams, like the HDF format): for every data key ``K`` an array ``K`` with all sequences
concatenated along time, ``(total_frames,)`` class indices or ``(total_frames, ...)`` features, and
``K_lengths`` with the per-sequence lengths. Optional: ``seq_tags`` (strings; default ``seq-<i>``),
``K_dim`` (class count of a sparse key; default max index + 1 -- give it, or train and dev may
disagree), ``K_labels`` (label names). Example::

    np.savez("train.npz", data=feats, data_lengths=[300, 250], classes=labels, classes_lengths=[300, 250],
             classes_dim=10)

Loaded with ``allow_pickle=False``: no object arrays, no code execution from the file.
"""
from __future__ import annotations

import os
import zipfile

import numpy as np

from engine.datasets.base import DataKeyInfo
from engine.datasets.memory import InMemoryDataset
from engine.runtime.errors import DataError

_SUFFIXES = ("_lengths", "_dim", "_labels")


class NpzDataset(InMemoryDataset):
    def __init__(self, file: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.file = file
        arrays = self._load(file)
        keys = [name for name in arrays if not name.endswith(_SUFFIXES) and name != "seq_tags"]
        keys = [k for k in keys if f"{k}_lengths" in arrays]
        if not keys:
            raise self._error("", f"no data key found; expected arrays 'K' and 'K_lengths' (found "
                                  f"{sorted(arrays)}).")
        keys.sort(key=lambda k: (k != "data", k))
        infos, streams, lengths = {}, {}, []
        for key in keys:
            stream, lens = arrays[key], arrays[f"{key}_lengths"].astype(np.int64).reshape(-1)
            if stream.ndim < 1 or stream.dtype.kind not in "biuf":
                raise self._error(key, f"expected a numeric array with a time axis, got {stream.dtype} "
                                       f"{stream.shape}.")
            if (lens < 0).any() or lens.sum() != len(stream):
                raise self._error(f"{key}_lengths", f"lengths must be >= 0 and sum to the {len(stream)} "
                                                    f"frames of '{key}' (they sum to {lens.sum()}).")
            if lengths and len(lens) != len(lengths[0]):
                raise self._error(f"{key}_lengths", f"has {len(lens)} sequences, '{keys[0]}_lengths' has "
                                                    f"{len(lengths[0])}.")
            sparse = stream.dtype.kind in "iu" and stream.ndim == 1
            if f"{key}_dim" in arrays:
                dim = int(arrays[f"{key}_dim"])
            elif sparse:
                dim = int(stream.max()) + 1 if len(stream) else 0
            else:
                dim = stream.shape[-1] if stream.ndim > 1 else 1
            infos[key] = DataKeyInfo(dim=dim, sparse=sparse, dtype=stream.dtype.name, shape=stream.shape[1:])
            streams[key], lengths = stream, lengths + [lens]
            if f"{key}_labels" in arrays:
                self.labels[key] = [str(x) for x in arrays[f"{key}_labels"].reshape(-1)]
        num_seqs = len(lengths[0])
        tags = [str(t) for t in arrays["seq_tags"].reshape(-1)] if "seq_tags" in arrays else \
            [f"seq-{i}" for i in range(num_seqs)]
        if len(tags) != num_seqs:
            raise self._error("seq_tags", f"has {len(tags)} entries for {num_seqs} sequences.")
        self._set_corpus(infos, streams, np.stack(lengths, axis=1), tags)

    def _error(self, array: str, problem: str) -> DataError:
        where = f", array '{array}'" if array else ""
        return DataError(f"NumPy file '{self.file}'{where}: {problem}")

    def _load(self, file: str) -> dict[str, np.ndarray]:
        if not os.path.isfile(file):
            raise DataError(f"NumPy file '{file}' does not exist (working directory: {os.getcwd()}).")
        if not zipfile.is_zipfile(file):
            raise DataError(f"NumPy file '{file}' is not an .npz archive (write it with numpy.savez).")
        try:
            with np.load(file, allow_pickle=False) as npz:
                return {name: npz[name] for name in npz.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise DataError(f"NumPy file '{file}' cannot be read as .npz (without pickled objects): "
                            f"{exc}.") from None
