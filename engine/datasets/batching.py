"""Batches: grouping an epoch's sequences, padding them, sharding over ranks, prefetching.

``batch_size`` bounds the padded frames of a batch (``max_len * num_seqs``, for every key), ``max_seqs``
its sequence count; sequences longer than ``max_seq_length`` are skipped (counted in the log), and a
sequence longer than ``batch_size`` on its own gets a batch of its own (with a warning), as in RETURNN.
The batch list depends only on the epoch order and the lengths, so every rank computes the same list;
with ``shard_size`` N, rank r materialises batches r, r+N, ... and reads only their sequences.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from engine import log, phases
from engine.datasets.base import Dataset
from engine.datasets.buffers import ALIGN, BufferPool, carve, layout_bytes
from engine.errors import ConfigError
from engine.timeline import DATA_WAIT

DEFAULT_EVAL_BATCH_SIZE = 5000


@dataclass(frozen=True)
class BatchOptions:
    """How sequences are grouped into batches: the keys ``batch_size``, ``max_seqs``, ``max_seq_length``."""

    batch_size: int
    max_seqs: int = -1
    max_seq_length: int | dict = 0

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer (padded frames per batch), "
                              f"got {self.batch_size!r}.")
        if not isinstance(self.max_seqs, int) or self.max_seqs == 0 or self.max_seqs < -1:
            raise ConfigError(f"max_seqs must be a positive integer or -1 (no limit), got {self.max_seqs!r}.")

    @classmethod
    def from_config(cls, config: Any, *, train: bool) -> BatchOptions:
        """Training needs ``batch_size``; eval and forward default to 5000 and never skip long sequences."""
        if train and not config.has("batch_size"):
            raise ConfigError("Config key 'batch_size' is required for training: the maximum number of "
                              "padded frames (max_len * num_seqs) per batch and rank, e.g. "
                              "batch_size = 5000.")
        return cls(config.int("batch_size", DEFAULT_EVAL_BATCH_SIZE), config.int("max_seqs"),
                   config.typed("max_seq_length") if train else 0)


@dataclass
class Batch:
    data: dict[str, np.ndarray]  # key -> (num_seqs, max_len, ...) zero-padded; sparse keys int32 (B, T)
    lengths: dict[str, np.ndarray]  # key -> int32 (num_seqs,)
    seq_tags: list[str]
    seq_idx: np.ndarray  # positions in the epoch order
    corpus_seq_idx: np.ndarray  # indices in the full corpus (forward restores the original order with it)
    num_frames: dict[str, int]  # non-padded frames per key

    @property
    def num_seqs(self) -> int:
        return len(self.seq_tags)


def _length_limits(dataset: Dataset, max_seq_length: int | dict | None) -> np.ndarray:
    """Per data-key column the maximum length (0: none)."""
    keys = dataset.data_keys
    if not max_seq_length:
        return np.zeros(len(keys), np.int64)
    if isinstance(max_seq_length, dict):
        unknown = set(max_seq_length) - set(keys)
        if unknown:
            raise ConfigError(f"max_seq_length names key(s) {sorted(unknown)} that {dataset.name} does "
                              f"not have (its keys: {keys}).")
        limits = [max_seq_length.get(key) or 0 for key in keys]
    else:
        limits = [max_seq_length] * len(keys)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in limits):
        raise ConfigError(f"max_seq_length must be an integer >= 0 or a dict of them, "
                          f"got {max_seq_length!r}.")
    return np.array(limits, np.int64)


def plan_batches(lengths: np.ndarray, *, batch_size: int, max_seqs: int = -1,
                 limits: np.ndarray | None = None) -> tuple[list[np.ndarray], int, int]:
    """Group epoch positions ``0..N-1`` (``lengths``: ``(N, num_keys)``) into batches, in order.

    Returns (batches, skipped for max_seq_length, oversized sequences given a batch of their own)."""
    longest = lengths.max(axis=1)
    keep = np.ones(len(lengths), bool)
    if limits is not None and limits.any():
        keep = ~((lengths > np.where(limits > 0, limits, np.iinfo(np.int64).max)).any(axis=1))
    positions = np.flatnonzero(keep)
    batches: list[np.ndarray] = []
    current: list[int] = []
    current_max = oversized = 0
    for pos, length in zip(positions.tolist(), longest[positions].tolist()):
        if length > batch_size:
            oversized += 1
            if current:
                batches.append(np.array(current, np.int64))
            batches.append(np.array([pos], np.int64))
            current, current_max = [], 0
            continue
        new_max = max(current_max, length)
        if current and (new_max * (len(current) + 1) > batch_size or len(current) == max_seqs):
            batches.append(np.array(current, np.int64))
            current, new_max = [], length
        current.append(pos)
        current_max = new_max
    if current:
        batches.append(np.array(current, np.int64))
    return batches, len(lengths) - len(positions), oversized


class PlannedBatches:
    """This rank's batches of an epoch, planned; iterating reads them. ``all_shards``: the number of
    batches of all ranks together (a progress display's total)."""

    def __init__(self, dataset: Dataset, lengths: np.ndarray, batches: list[np.ndarray],
                 all_shards: int) -> None:
        self._dataset, self._lengths, self._batches = dataset, lengths, batches
        self.all_shards = all_shards

    def __iter__(self) -> Iterator[Batch]:
        return _materialise(self._dataset, self._lengths, self._batches)


def generate_batches(dataset: Dataset, options: BatchOptions, *, shard_rank: int = 0,
                     shard_size: int = 1) -> PlannedBatches:
    """Batches of the current epoch (call ``dataset.init_seq_order`` first); this rank's shard only.

    Planning happens now (lengths only, bad options raise here); data is read as the iteration advances."""
    if not 0 <= shard_rank < shard_size:
        raise ValueError(f"shard_rank {shard_rank} outside 0..{shard_size - 1}")
    lengths = dataset.epoch_seq_lengths()
    batches, skipped, oversized = plan_batches(lengths, batch_size=options.batch_size,
                                               max_seqs=options.max_seqs,
                                               limits=_length_limits(dataset, options.max_seq_length))
    where = f"{dataset.name}, epoch {dataset.epoch}"
    if skipped:
        log.info(f"{where}: skipped {skipped} of {len(lengths)} sequences longer than max_seq_length "
                 f"{options.max_seq_length}.")
    if oversized:
        log.warning(f"{where}: {oversized} sequence(s) longer than batch_size {options.batch_size}; each got "
                    "a batch of its own.")
    return PlannedBatches(dataset, lengths, batches[shard_rank::shard_size], len(batches))


def _materialise(dataset: Dataset, lengths: np.ndarray, batches: list[np.ndarray]) -> Iterator[Batch]:
    keys = dataset.data_keys
    infos = [dataset.key_info(key) for key in keys]
    dtypes = [np.dtype(np.int32) if info.sparse else np.dtype(info.dtype) for info in infos]
    if not batches:
        return
    sizes = np.array([len(seq_idx) for seq_idx in batches])
    maxima = np.maximum.reduceat(lengths[np.concatenate(batches)], np.cumsum(sizes) - sizes, axis=0)
    frame_bytes = np.array([math.prod(info.shape) * dtype.itemsize for info, dtype in zip(infos, dtypes)])
    largest = int((sizes[:, None] * maxima * frame_bytes).sum(axis=1).max()) + (len(keys) + 1) * ALIGN
    pool = BufferPool(largest)  # sized for the largest batch: buffers never grow
    for seq_idx, batch_max in zip(batches, maxima.tolist()):
        layout = [((len(seq_idx), t) + info.shape, dtype) for t, info, dtype in zip(batch_max, infos, dtypes)]
        seq_lengths = lengths[seq_idx]
        arrays = carve(pool.take(layout_bytes(layout)), layout)
        positions = seq_idx.tolist()
        for j, (pos, row) in enumerate(zip(positions, seq_lengths.tolist())):
            for key, arr, length in zip(keys, arrays, row):
                dataset.read_into(pos, key, arr[j, :length])
                if length < arr.shape[1]:
                    arr[j, length:] = 0
        yield Batch(
            data=dict(zip(keys, arrays)),
            lengths={key: seq_lengths[:, col].astype(np.int32) for col, key in enumerate(keys)},
            seq_tags=[dataset.get_seq_tag(pos) for pos in positions],
            seq_idx=seq_idx,
            corpus_seq_idx=dataset.order[seq_idx],
            num_frames={key: int(seq_lengths[:, col].sum()) for col, key in enumerate(keys)},
        )


class BatchPrefetcher:
    """Runs a batch iterator in a background thread, up to ``depth`` batches ahead, so reading overlaps
    the training step. Loader errors are re-raised in the consuming thread; ``close()`` (or leaving the
    ``with`` block) stops the thread also when the consumer stops early.

    A consumer that finds no batch ready waits until ``depth`` batches are (or the data ends), so a
    loader-bound consumer is woken once per ``depth`` batches instead of once per batch: every wake-up is
    a cross-core thread switch costing tens of microseconds, as much as producing a small batch. This
    costs no throughput (the producer never pauses while the queue is not full), only one batch of
    latency at the start of an epoch."""

    def __init__(self, batches: Iterable[Batch], depth: int = 2) -> None:
        self._source = iter(batches)
        self.depth = max(1, depth)
        self._items: deque[tuple[str, object]] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._finished = False
        self._thread = threading.Thread(target=self._produce, name="batch-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for batch in self._source:
                with self._cond:
                    while len(self._items) >= self.depth and not self._stop:
                        self._cond.wait()
                    if self._stop:
                        return
                    self._items.append(("batch", batch))
                    if len(self._items) >= self.depth:
                        self._cond.notify_all()
            self._put_last(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put_last(("error", exc))
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()  # a generator is closed in the thread that ran it

    def _put_last(self, item: tuple[str, object]) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def __iter__(self) -> BatchPrefetcher:
        return self

    def __next__(self) -> Batch:
        if self._finished:
            raise StopIteration
        with phases.span("data wait", DATA_WAIT), self._cond:
            if not self._items:
                while len(self._items) < self.depth and not (self._items and self._items[-1][0] != "batch"):
                    self._cond.wait()
            kind, value = self._items.popleft()
            self._cond.notify_all()  # room for the producer
        if kind == "batch":
            return value
        self._finished = True
        self._thread.join()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        self._finished = True
        with self._cond:
            self._stop = True
            self._items.clear()
            self._cond.notify_all()
        self._thread.join(timeout=60)
        if self._thread.is_alive():
            log.warning("The batch prefetch thread did not stop within 60 s (a read is hanging?).")

    def __enter__(self) -> BatchPrefetcher:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
