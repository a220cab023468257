"""Batches: grouping an epoch's sequences, padding them, sharding over ranks, prefetching.

``batch_size`` bounds the padded frames of a batch (``max_len * num_seqs``, for every key of the dataset,
each padded to its own longest sequence), ``max_seqs`` its sequence count; sequences longer than
``max_seq_length`` (an int for every key, a dict per key, or ``-n`` for ``{"classes": n}``, as in RETURNN)
are skipped (counted in the log), and a
sequence longer than ``batch_size`` on its own gets a batch of its own (with a warning), as in RETURNN.
The batch list depends only on the epoch order and the lengths, so every rank computes the same list;
with ``shard_size`` N, rank r materialises batches r, r+N, ... and reads only their sequences (training:
the ranks step together, so each gets whole batches of the one plan). Inference (``shard_by="frames"``)
has no step in common: rank r takes the r-th of N contiguous parts of the epoch with about equal frames
and batches it with the same options, so no rank waits for another with a batch more. With a
dataset's ``chunking`` the chunks take the place of the sequences in all of this (``max_seqs`` counts
chunks), as in RETURNN.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from engine.datasets.base import Dataset
from engine.datasets.buffers import ALIGN, BufferPool, carve, layout_bytes
from engine.datasets.chunking import EpochPieces, cut_into_chunks, whole_sequences
from engine.report import phases
from engine.report.timeline import DATA_WAIT
from engine.runtime import log
from engine.runtime.errors import ConfigError, DataError

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
        """Training needs ``batch_size``; eval and forward default to 5000 and never skip long sequences
        (the dev scoring within training takes the training's ``max_seq_length``: ``tasks/train.py``)."""
        if train and not config.has("batch_size"):
            raise ConfigError("Config key 'batch_size' is required for training: the maximum number of "
                              "padded frames (max_len * num_seqs) per batch and rank, e.g. "
                              "batch_size = 5000.")
        return cls(config.int("batch_size", DEFAULT_EVAL_BATCH_SIZE), config.int("max_seqs"),
                   config.typed("max_seq_length") if train else 0)


@dataclass
class Batch:
    """Sequences, or chunks of them (then a sequence's tag and position repeat for each of its chunks)."""

    data: dict[str, np.ndarray]  # key -> (num_seqs, max_len, ...) zero-padded; sparse keys int32 (B, T)
    lengths: dict[str, np.ndarray]  # key -> int32 (num_seqs,)
    seq_tags: list[str]
    seq_idx: np.ndarray  # positions in the epoch order
    corpus_seq_idx: np.ndarray  # indices in the full corpus (forward restores the original order with it)
    num_frames: dict[str, int]  # non-padded frames per key

    @property
    def num_seqs(self) -> int:
        return len(self.seq_tags)


def _length_limits(dataset: Dataset, keys: list[str], max_seq_length: int | dict | None) -> np.ndarray:
    """Per planned key (``keys``) the maximum length (0: none)."""
    if not max_seq_length:
        return np.zeros(len(keys), np.int64)
    if isinstance(max_seq_length, int) and not isinstance(max_seq_length, bool) and max_seq_length < 0:
        max_seq_length = {"classes": -max_seq_length}  # RETURNN's shorthand for a limit on the targets
    if isinstance(max_seq_length, dict):
        unknown = set(max_seq_length) - set(dataset.data_keys)
        if unknown:
            raise ConfigError(f"max_seq_length names key(s) {sorted(unknown)} that {dataset.name} does "
                              f"not have (its keys: {dataset.data_keys}).")
        limits = [max_seq_length.get(key) or 0 for key in keys]
    else:
        limits = [max_seq_length] * len(keys)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in limits):
        raise ConfigError(f"max_seq_length must be an integer (a negative -n limits only 'classes', to n) "
                          f"or a dict of data key -> integer >= 0, got {max_seq_length!r}.")
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
    """This rank's batches of an epoch, read as they are iterated; ``num_seqs``: the sequences (or chunks)
    they hold; ``all_shards``: the number of batches of all ranks together (a progress display's total)."""

    def __init__(self, batches: Iterator[Batch], num_seqs: int, all_shards: int) -> None:
        self._batches = batches
        self.num_seqs = num_seqs
        self.all_shards = all_shards

    def __iter__(self) -> Iterator[Batch]:
        return self._batches


def generate_batches(dataset: Dataset, options: BatchOptions, *, shard_rank: int = 0, shard_size: int = 1,
                     shard_by: str = "batches", keys: Sequence[str] | None = None, recurrent: bool = True,
                     skip: int = 0) -> PlannedBatches:
    """Batches of the current epoch (call ``dataset.init_seq_order`` first); this rank's shard only.

    ``shard_by``: ``"batches"`` (every N-th batch of the one plan) or ``"frames"`` (a contiguous part of
    the epoch with about 1/N of its frames, batched on its own; see the module's text).
    ``keys``: the data keys to batch (default: all of the dataset's); with ``dataset.chunking`` the
    batches hold chunks of the sequences (see ``chunking.py``), cut over these keys, unless the network
    is not ``recurrent`` (RETURNN ignores the chunking then). ``skip``: the first batches of the epoch's
    plan are already trained (a resumed epoch); not read.
    Planning happens now (lengths only, bad options raise here); data is read as the iterator advances."""
    if not 0 <= shard_rank < shard_size:
        raise ValueError(f"shard_rank {shard_rank} outside 0..{shard_size - 1}")
    if shard_by not in ("batches", "frames") or (shard_by == "frames" and skip):
        raise ValueError(f"shard_by must be 'batches' or 'frames' (skip, for a resumed training epoch, only "
                         f"with 'batches'), got {shard_by!r} with skip {skip}")
    keys = list(dataset.data_keys if keys is None else keys)
    for key in keys:
        dataset.key_info(key)  # a DataError naming the dataset's keys
    where = f"{dataset.name}, epoch {dataset.epoch}"
    chunking = dataset.chunking if recurrent else None
    if chunking is None and dataset.chunking is not None:
        log.debug(f"{where}: non-recurrent network, chunking ignored.")
    # As in RETURNN, whole sequences are planned on the lengths of all of the dataset's keys (a key the
    # network does not read still counts against batch_size and max_seq_length); chunks on the keys cut.
    plan_keys = dataset.data_keys if chunking is None else keys
    all_lengths = dataset.epoch_seq_lengths()
    _check_same_lengths(dataset, all_lengths, where)
    lengths = all_lengths[:, [dataset.data_keys.index(key) for key in keys]]
    plan_lengths = all_lengths[:, [dataset.data_keys.index(key) for key in plan_keys]]
    pieces = (whole_sequences(lengths) if chunking is None
              else cut_into_chunks(lengths, keys, chunking, owner=dataset.name))
    if chunking is not None:
        plan_lengths = pieces.lengths
    limits = _length_limits(dataset, plan_keys, options.max_seq_length)
    parts = (_frame_balanced_parts(plan_lengths, shard_size) if shard_by == "frames"
             else [np.arange(len(plan_lengths))])
    batches, skipped, oversized = [], 0, 0
    for part in parts:  # one part for "batches"; the plan of every rank's part for "frames" (lengths only)
        planned, part_skipped, part_oversized = plan_batches(
            plan_lengths[part], batch_size=options.batch_size, max_seqs=options.max_seqs, limits=limits)
        batches.append([part[b] for b in planned])
        skipped += part_skipped
        oversized += part_oversized
    what = "sequences" if chunking is None else "chunks"
    if skipped:
        log.info(f"{where}: skipped {skipped} of {len(pieces.positions)} {what} longer than max_seq_length "
                 f"{options.max_seq_length}.")
    if oversized:
        log.warning(f"{where}: {oversized} {what} longer than batch_size {options.batch_size}; each got a "
                    f"batch of its own.")
    if shard_by == "frames":
        mine, all_shards = batches[shard_rank], sum(map(len, batches))
    else:
        remaining = batches[0][skip:]
        mine, all_shards = remaining[shard_rank::shard_size], len(remaining)
    if mine:  # the next epoch likely starts as this one: that many positions feed every rank's 2 batches
        ahead = batches[0][:2 * shard_size] if shard_by == "batches" else []
        start = int(pieces.positions[np.concatenate(ahead)].max()) + 1 if ahead else 0
        dataset.will_read(pieces.positions[np.concatenate(mine)], next_epoch_start=start)
    return PlannedBatches(_materialise(dataset, keys, pieces, mine), num_seqs=sum(len(b) for b in mine),
                          all_shards=all_shards)


def _check_same_lengths(dataset: Dataset, all_lengths: np.ndarray, where: str) -> None:
    """Keys that share one time axis (``dataset.same_length_keys``) have equal lengths in every sequence
    of the epoch; RETURNN would silently take one key's lengths for all of them."""
    for group in dataset.same_length_keys:
        present = [key for key in group if key in dataset.data_keys]
        if len(present) < 2:
            continue
        group_lengths = all_lengths[:, [dataset.data_keys.index(key) for key in present]]
        differ = np.flatnonzero((group_lengths != group_lengths[:, :1]).any(axis=1))
        if len(differ):
            pos = int(differ[0])
            found = ", ".join(f"{key} {n}" for key, n in zip(present, group_lengths[pos].tolist()))
            raise DataError(f"{where}: sequence {dataset.get_seq_tag(pos)!r} has lengths {found}, but "
                            f"extern_data gives streams {', '.join(present)} one time axis (same_dim_tags_as "
                            f"with one DimensionTag), so they must have the same number of frames "
                            f"({len(differ)} of the epoch's {len(all_lengths)} sequences differ). RETURNN "
                            "would silently use one stream's lengths for all of them; fix the data, or give "
                            "the streams their own time axes (no shared tag).")


def _frame_balanced_parts(lengths: np.ndarray, parts: int) -> list[np.ndarray]:
    """``parts`` contiguous runs of the positions ``0..N-1`` with about equal frames (a position goes to
    the part its middle frame falls in; ``lengths``: ``(N, num_keys)``, the longest key counts)."""
    longest = lengths.max(axis=1) if len(lengths) else np.zeros(0, np.int64)
    middles = np.cumsum(longest) - longest / 2
    cuts = np.searchsorted(middles, longest.sum() * np.arange(1, parts) / parts)
    return np.split(np.arange(len(lengths)), cuts)


def _materialise(dataset: Dataset, keys: list[str], pieces: EpochPieces,
                 batches: list[np.ndarray]) -> Iterator[Batch]:
    infos = [dataset.key_info(key) for key in keys]
    dtypes = [np.dtype(np.int32) if info.sparse else np.dtype(info.dtype) for info in infos]
    if not batches:
        return
    sizes = np.array([len(piece_idx) for piece_idx in batches])
    maxima = np.maximum.reduceat(pieces.lengths[np.concatenate(batches)], np.cumsum(sizes) - sizes, axis=0)
    frame_bytes = np.array([math.prod(info.shape) * dtype.itemsize for info, dtype in zip(infos, dtypes)])
    largest = int((sizes[:, None] * maxima * frame_bytes).sum(axis=1).max()) + (len(keys) + 1) * ALIGN
    pool = BufferPool(largest)  # sized for the largest batch: buffers never grow
    for piece_idx, batch_max in zip(batches, maxima.tolist()):
        layout = [((len(piece_idx), t) + info.shape, dtype)
                  for t, info, dtype in zip(batch_max, infos, dtypes)]
        piece_lengths = pieces.lengths[piece_idx]
        arrays = carve(pool.take(layout_bytes(layout)), layout)
        positions = pieces.positions[piece_idx]
        for j, (pos, starts, row) in enumerate(zip(positions.tolist(), pieces.starts[piece_idx].tolist(),
                                                   piece_lengths.tolist())):
            for key, arr, start, length in zip(keys, arrays, starts, row):
                dataset.read_into(pos, key, arr[j, :length], start)
                if length < arr.shape[1]:
                    arr[j, length:] = 0
        yield Batch(
            data=dict(zip(keys, arrays)),
            lengths={key: piece_lengths[:, col].astype(np.int32) for col, key in enumerate(keys)},
            seq_tags=[dataset.get_seq_tag(pos) for pos in positions.tolist()],
            seq_idx=positions,
            corpus_seq_idx=dataset.order[positions],
            num_frames={key: int(piece_lengths[:, col].sum()) for col, key in enumerate(keys)},
        )


class BatchPrefetcher:
    """Runs a batch iterator in a background thread, up to ``depth`` batches ahead, so reading overlaps
    the training step. Loader errors are re-raised in the consuming thread; ``close()`` (or leaving the
    ``with`` block) stops the thread also when the consumer stops early.

    A consumer that finds no batch ready waits until ``depth`` batches are (or the data ends), so a
    loader-bound consumer is woken once per ``depth`` batches instead of once per batch: every wake-up is
    a cross-core thread switch costing tens of microseconds, as much as producing a small batch. This
    costs no throughput (the producer never pauses while the queue is not full); the first batch of the
    epoch is handed over alone, as the step has nothing else to do then."""

    def __init__(self, batches: Iterable[Batch], depth: int = 2) -> None:
        self._source = iter(batches)
        self.depth = max(1, depth)
        self._items: deque[tuple[str, object]] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._finished = False
        self._wait_for = 1  # the epoch's first batch goes to the step as soon as it is ready; then depth
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
                    if len(self._items) >= self._wait_for:
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
                while len(self._items) < self._wait_for and not (
                        self._items and self._items[-1][0] != "batch"):
                    self._cond.wait()
            self._wait_for = self.depth
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
