"""Reusable memory for batch arrays.

Fresh memory costs a page fault per 4 KiB on first touch, which for a memory-speed loader (corpus in
the page cache or in the HDF cache) costs about as much as reading the data itself. Batches are
therefore carved out of a few recycled buffers. A buffer is reused only when no array built on it is
alive: every NumPy view (and whatever wraps one, e.g. a TensorFlow tensor sharing its memory) holds a
reference to the buffer, so its reference count returns to the count it had when it was created,
measured the same way, only once the consumer has dropped the whole batch.
"""
from __future__ import annotations

import math
import sys

import numpy as np

ALIGN = 64  # bytes; what TensorFlow needs to share memory instead of copying


class BufferPool:
    def __init__(self, typical_bytes: int = 0, max_buffers: int = 8) -> None:
        """``typical_bytes``: what the largest batch needs, so buffers need not grow."""
        self.max_buffers = max_buffers
        self._buffers: list[np.ndarray] = []
        self._idle_refs: list[int] = []  # reference count of each buffer while nothing uses it
        self._largest = typical_bytes

    def _refs(self, i: int) -> int:
        return sys.getrefcount(self._buffers[i])

    def _is_idle(self, i: int) -> bool:
        return self._refs(i) == self._idle_refs[i]

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of at least ``nbytes``; build the batch's views on it right away."""
        replace = None
        for i in range(len(self._buffers)):  # no loop variable bound to a buffer: it would count as a user
            if self._is_idle(i):
                if self._buffers[i].nbytes >= nbytes:
                    return self._buffers[i]
                replace = i
        self._largest = max(self._largest, nbytes)
        if replace is None:
            if len(self._buffers) == self.max_buffers:
                return np.empty(self._largest, np.uint8)  # all pooled buffers are in use: an unpooled one
            self._buffers.append(None)
            self._idle_refs.append(0)
            replace = len(self._buffers) - 1
        self._buffers[replace] = np.empty(self._largest, np.uint8)
        self._idle_refs[replace] = self._refs(replace)
        return self._buffers[replace]


def carve(buf: np.ndarray, layout: list[tuple[tuple[int, ...], np.dtype]]) -> list[np.ndarray]:
    """Arrays of the given (shape, dtype) laid out one after another, each ``ALIGN``-aligned."""
    out, pos = [], (-buf.ctypes.data) % ALIGN
    for shape, dtype in layout:
        nbytes = math.prod(shape) * dtype.itemsize
        out.append(buf[pos:pos + nbytes].view(dtype).reshape(shape))
        pos += -(-nbytes // ALIGN) * ALIGN
    return out


def layout_bytes(layout: list[tuple[tuple[int, ...], np.dtype]]) -> int:
    """Bytes ``carve`` needs for ``layout``, including the slack to align the start."""
    return sum(-(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
               for shape, dtype in layout) + ALIGN
