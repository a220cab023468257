"""Fusion: many arrays, one contiguous buffer per dtype, reduced in place in one pass over the buffer.

The pass goes in segments of ``SEGMENT_BYTES``: each segment is filled from the input arrays and handed
to the collective straight away, while it is still in the CPU cache. A buffer that fits one segment
(the 2-layer LSTM's 0.9 MB gradients) is one call. For 100 MB, 1 MiB segments made the 2-rank
reduction about twice as fast as one call over the whole buffer on the test machines (Open MPI then
streams the buffer through memory several times); 256 KiB to 2 MiB measured alike, smaller segments
pay per-call latency. ``benchmarks/bench_allreduce.py`` shows both (``raw`` and ``raw-seg``).

Each array's region starts at a 64-byte boundary, so the result views can be wrapped by TensorFlow
without a copy (``tf.numpy_function`` shares aligned numpy memory). A buffer is reused only when none
of its previous results is still referenced (every numpy view keeps a reference to its base array),
so results never change under the caller's feet. Two buffers per dtype are kept: TensorFlow drops
its references to a ``numpy_function``'s results only at the end of its next call, so inside a
``tf.function`` the calls alternate between them instead of allocating (and page-faulting) a fresh
buffer every step. (Results wrapped by ``tf.convert_to_tensor`` are likewise held until TensorFlow's
deferred release; while both pooled buffers are held, a call uses a fresh, unpooled buffer.)
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import numpy as np

SEGMENT_BYTES = 1 << 20
ALIGN_BYTES = 64
POOL_SIZE = 2


def group_by_dtype(arrays: Sequence[Any]) -> dict[Any, list[int]]:
    """Indices of the arrays (or tensors) of each dtype, in order of first appearance (the same on
    every rank, since all ranks pass the same list)."""
    groups: dict[Any, list[int]] = {}
    for i, array in enumerate(arrays):
        groups.setdefault(array.dtype, []).append(i)
    return groups


class FusionBuffers:
    """Reusable, aligned buffers per dtype, and the pack -> collective -> unpack walk over them."""

    def __init__(self, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.segment_bytes = segment_bytes
        self._pools: dict[np.dtype, list[np.ndarray]] = {}  # uint8 storage with ALIGN_BYTES of slack

    def run(self, arrays: Sequence[np.ndarray], collective: Callable[[np.ndarray], None]) -> list[np.ndarray]:
        """Apply ``collective`` (in place, segment by segment) to the fused arrays; results shaped like them.

        All arrays of one dtype go into one buffer; ``collective`` is called for consecutive segments of
        each buffer, dtype after dtype. Arrays with no elements cost nothing.
        """
        arrays = [np.asarray(a) for a in arrays]
        results: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
        for dtype, indices in group_by_dtype(arrays).items():
            flats = [arrays[i].reshape(-1) for i in indices]
            offsets, total = self._layout(flats, dtype.itemsize)
            buf = self._buffer(dtype, total)
            self._fill_and_apply(flats, offsets, buf, collective)
            for i, flat, offset in zip(indices, flats, offsets):
                results[i] = buf[offset:offset + flat.size].reshape(arrays[i].shape)
        return results

    @staticmethod
    def _layout(flats: list[np.ndarray], itemsize: int) -> tuple[list[int], int]:
        """Element offset of each array (aligned to ALIGN_BYTES) and the buffer length in elements."""
        align = max(1, ALIGN_BYTES // itemsize)
        offsets, end = [], 0
        for flat in flats:
            offsets.append(end)
            end += -(-flat.size // align) * align
        return offsets, end

    def _buffer(self, dtype: np.dtype, count: int) -> np.ndarray:
        """An aligned ``count``-element buffer that no earlier result points into."""
        nbytes = count * dtype.itemsize
        pool = self._pools.setdefault(dtype, [])
        # A free buffer is referenced only by the pool (and getrefcount's argument).
        free = [i for i in range(len(pool)) if sys.getrefcount(pool[i]) <= 2]
        fits = [i for i in free if pool[i].size >= nbytes + ALIGN_BYTES]
        if fits:
            raw = pool[fits[0]]
        else:
            raw = np.empty(nbytes + ALIGN_BYTES, np.uint8)
            if len(pool) < POOL_SIZE:
                pool.append(raw)
            elif free:  # replace a free buffer that is too small
                pool[free[0]] = raw
        start = -raw.ctypes.data % ALIGN_BYTES
        return raw[start:start + nbytes].view(dtype)

    def _fill_and_apply(self, flats: list[np.ndarray], offsets: list[int], buf: np.ndarray,
                        collective: Callable[[np.ndarray], None]) -> None:
        """Copy the arrays into ``buf`` one segment at a time, calling ``collective`` on each full segment.

        The alignment gaps between arrays are reduced too; their values are never read.
        """
        seg = max(1, self.segment_bytes // buf.itemsize)
        k, pos = 0, 0  # the array being copied, and how many of its elements are already in buf
        for start in range(0, buf.size, seg):
            stop = min(start + seg, buf.size)
            while k < len(flats) and offsets[k] + pos < stop:
                n = min(flats[k].size - pos, stop - offsets[k] - pos)
                at = offsets[k] + pos
                buf[at:at + n] = flats[k][pos:pos + n]
                pos += n
                if pos == flats[k].size:
                    k, pos = k + 1, 0
            collective(buf[start:stop])

    def pack(self, arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Copy the arrays into one buffer per dtype, without reducing: (the buffers, the results).

        The results are views of the buffers shaped like the arrays; they hold the reduced values once
        the buffers were reduced in place (``segments``). For a reduction that runs later, in another
        thread, while the caller's arrays may already be gone (``comm_thread``)."""
        arrays = [np.asarray(a) for a in arrays]
        results: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
        buffers = []
        for dtype, indices in group_by_dtype(arrays).items():
            flats = [arrays[i].reshape(-1) for i in indices]
            offsets, total = self._layout(flats, dtype.itemsize)
            buf = self._buffer(dtype, total)
            for i, flat, offset in zip(indices, flats, offsets):
                buf[offset:offset + flat.size] = flat
                results[i] = buf[offset:offset + flat.size].reshape(arrays[i].shape)
            buffers.append(buf)
        return buffers, results

    @staticmethod
    def segments(buf: np.ndarray, segment_bytes: int = SEGMENT_BYTES) -> list[np.ndarray]:
        """Consecutive views of ``buf`` of at most ``segment_bytes`` each (the reduction's unit)."""
        seg = max(1, segment_bytes // buf.itemsize)
        return [buf[start:start + seg] for start in range(0, buf.size, seg)]
