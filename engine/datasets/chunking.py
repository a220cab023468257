"""Chunking: training sequences cut into overlapping pieces that batch like sequences (RETURNN's rules).

``chunking = "size:step"`` (or ``"size"``, an int, a ``(size, step)`` pair, or per data key
``({"data": 200, "classes": 50}, {"data": 100, "classes": 25})``; ``"0"`` is off) and
``min_chunk_size`` (int or per-key dict, default 0). For a sequence of length L (per key), chunk j
covers frames ``[j*step, min(j*step + size, L))``. Chunks are made while the reference key (``data``
if it is batched, else the first key with a step > 0) has frames left at ``j*step``, and the cutting
stops after chunk j-1 once any key has no more than ``min_chunk_size`` frames left at ``j*step``. A
key of length 0 or 1 that differs from the reference (e.g. one label per sequence) is repeated whole
in every chunk; other keys must have the reference's length, or (with a step of their own) give the
same number of chunks. A sequence of length 0 gives no chunk.

A dataset holds its chunking (``Dataset.chunking``); ``batching.generate_batches`` cuts the epoch's
sequences into ``EpochPieces`` and plans batches over those, so ``max_seqs`` counts chunks and
``batch_size`` bounds padded chunk frames, and sharding over ranks and prefetching work unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from engine.runtime.errors import ConfigError, DataError

PerKey = int | dict  # one value for every key, or a value per data key


@dataclass(frozen=True)
class Chunking:
    size: PerKey
    step: PerKey
    min_size: PerKey = 0

    def per_key(self, keys: Sequence[str], owner: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(size, step, min_size) as int64 arrays over ``keys``; a dict must name every key."""
        return tuple(_for_keys(value, keys, what, owner)
                     for value, what in ((self.size, "chunking"), (self.step, "chunking step"),
                                         (self.min_size, "min_chunk_size")))


def _for_keys(value: PerKey, keys: Sequence[str], what: str, owner: str) -> np.ndarray:
    if not isinstance(value, dict):
        return np.full(len(keys), value, np.int64)
    missing = [key for key in keys if key not in value]
    if missing:
        raise ConfigError(f"{owner}: {what} is given per data key ({sorted(value)}), but the batches also "
                          f"hold {missing}; give a value for every key the network uses.")
    return np.array([value[key] for key in keys], np.int64)


def _check_numbers(value: Any, what: str, *, positive: bool) -> PerKey:
    items = value.values() if isinstance(value, dict) else [value]
    ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= (1 if positive else 0)
             for v in items)
    if not ok or (isinstance(value, dict) and not value):
        need = "positive integers" if positive else "integers >= 0"
        raise ConfigError(f"{what} must be an int or a dict of data key -> int ({need}), got {value!r}.")
    return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else int(value)


def parse_chunking(value: Any, min_chunk_size: Any = 0, *, owner: str = "chunking") -> Chunking | None:
    """RETURNN's forms of ``chunking`` -> ``Chunking``, or None when chunking is off
    (``0``, ``"0"``, None)."""
    text = value.strip() if isinstance(value, str) else None
    if text is not None:
        try:
            parts = [int(p) for p in text.split(":")] if text else []
        except ValueError:
            parts = []
        if len(parts) not in (1, 2):
            raise ConfigError(f"{owner}: {value!r} is not understood; write 'size:step' (e.g. '50:25'), "
                              "'size', or '0' for no chunking.")
        value = tuple(parts) if len(parts) == 2 else parts[0]
    if callable(value):
        raise ConfigError(f"{owner}: a chunking function is not supported; give 'size:step', or per data key "
                          "({'data': size, ...}, {'data': step, ...}).")
    size, step = value if isinstance(value, (tuple, list)) and len(value) == 2 else (value, None)
    if size is None or (not isinstance(size, dict) and size == 0):
        return None
    size = _check_numbers(size, f"{owner}: the chunk size", positive=True)
    if step is None or (not isinstance(step, dict) and step == 0):
        step = size
    step = _check_numbers(step, f"{owner}: the chunk step", positive=False)
    if isinstance(size, dict) != isinstance(step, dict) or (
            isinstance(size, dict) and sorted(size) != sorted(step)):
        raise ConfigError(f"{owner}: chunk sizes {size!r} and steps {step!r} must name the same data keys.")
    if (max(step.values()) if isinstance(step, dict) else step) <= 0:
        raise ConfigError(f"{owner}: the chunk step must be positive (for at least one data key), "
                          f"got {step!r}.")
    min_size = _check_numbers(min_chunk_size or 0, f"{owner}: min_chunk_size", positive=False)
    return Chunking(size, step, min_size)


@dataclass
class EpochPieces:
    """What batches are made of: whole sequences, or chunks of them. Row i is piece i of the epoch."""

    positions: np.ndarray  # (M,) position of the piece's sequence in the epoch order
    starts: np.ndarray  # (M, K) first frame per data key
    lengths: np.ndarray  # (M, K) frames per data key


def whole_sequences(lengths: np.ndarray) -> EpochPieces:
    return EpochPieces(np.arange(len(lengths), dtype=np.int64), np.zeros_like(lengths), lengths)


def cut_into_chunks(lengths: np.ndarray, keys: Sequence[str], chunking: Chunking, owner: str) -> EpochPieces:
    """The chunks of every sequence (``lengths``: ``(N, K)`` over ``keys``), sequence by sequence in order."""
    size, step, min_size = chunking.per_key(keys, owner)
    lengths = np.asarray(lengths, np.int64)
    ref = keys.index("data") if "data" in keys else keys.index(min(keys))
    if step[ref] == 0:
        ref = keys.index(min(key for key, s in zip(keys, step) if s > 0))
    whole = _keys_kept_whole(lengths, keys, step, min_size, ref, owner)
    count = -(-lengths[:, ref] // step[ref])  # chunk starts j*step below the reference length
    # after chunk j-1 the cutting stops once a key has <= min_size frames left at j*step
    left = lengths - min_size
    stop = np.where(step > 0, np.maximum(1, -(-left // np.maximum(step, 1))), np.where(left <= 0, 1, 2**62))
    count = np.minimum(count, stop.min(axis=1))
    seq = np.repeat(np.arange(len(lengths), dtype=np.int64), count)
    j = np.arange(len(seq), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    starts = j[:, None] * step[None, :]
    ends = np.minimum(starts + size[None, :], lengths[seq])
    full = whole[seq]
    starts = np.where(full, 0, starts)
    ends = np.where(full, lengths[seq], ends)
    return EpochPieces(seq, starts, np.maximum(ends - starts, 0))


def _keys_kept_whole(lengths: np.ndarray, keys: Sequence[str], step: np.ndarray, min_size: np.ndarray,
                     ref: int, owner: str) -> np.ndarray:
    """(N, K) True where a key is repeated whole in every chunk; raises where keys cannot be cut together."""
    same = (step == step[ref])[None, :] & (lengths == lengths[:, ref:ref + 1])
    whole = ~same & (lengths <= 1)
    other = ~same & ~whole
    for row, col in zip(*np.nonzero(other)):
        if step[col] in (0, step[ref]):
            raise DataError(f"{owner}: cannot chunk sequence {row} of the epoch: key '{keys[col]}' has "
                            f"{lengths[row, col]} frames but '{keys[ref]}' has {lengths[row, ref]}, "
                            f"with chunk step {step[col]}; give per-key chunk sizes and steps for streams "
                            "of other rates.")
        n_key = (lengths[row, col] - (min_size[col] or 1)) // step[col] + 1
        n_ref = (lengths[row, ref] - (min_size[ref] or 1)) // step[ref] + 1
        if n_key != n_ref:
            raise DataError(f"{owner}: cannot chunk sequence {row} of the epoch: key '{keys[col]}' "
                            f"({lengths[row, col]} frames, step {step[col]}) gives {n_key} chunks, but "
                            f"'{keys[ref]}' ({lengths[row, ref]} frames, step {step[ref]}) gives {n_ref}.")
    return whole
