"""``epoch_wise_filter``: RETURNN's ``EpochWiseFilter``, which drops long sequences in chosen epochs.

``{(1, 5): {"max_mean_len": 1000}}``: in (sub-)epochs 1 to 5 (``None`` or -1 as the end: no end; ``None``
as the start: 1) only the shortest sequences of the epoch are kept, as many as keep their mean length at
most ``max_mean_len`` (found by RETURNN's binary search, which may keep one more where the means do not
grow evenly); the kept ones stay in the epoch's order. The filter runs after ordering and
``partition_epoch``, on the sequences of the sub-epoch.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from engine.runtime.errors import DataError

FILTER_OPTIONS = ("max_mean_len",)


class EpochWiseFilter:
    def __init__(self, epochs_opts: dict[tuple[int | None, int | None], dict[str, Any]], *,
                 owner: str = "epoch_wise_filter") -> None:
        if not isinstance(epochs_opts, dict):
            raise DataError(f"{owner} must be a dict (first_epoch, last_epoch) -> options, got "
                            f"{epochs_opts!r}.")
        self.ranges = sorted((epoch_range(key, opts, owner, FILTER_OPTIONS, "RETURNN's filter")
                              for key, opts in epochs_opts.items()), key=lambda r: (r[0], r[1]))

    def filter(self, epoch: int, order: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The sequences of ``order`` (corpus indices) kept in ``epoch``; ``lengths`` per corpus index."""
        for start, end, opts in self.ranges:
            if start <= epoch <= end and opts.get("max_mean_len"):
                order = _max_mean_len(order, lengths, float(opts["max_mean_len"]))
        return order


def _max_mean_len(order: np.ndarray, lengths: np.ndarray, max_mean: float) -> np.ndarray:
    pairs = np.array(sorted((int(lengths[i]), int(i)) for i in order), dtype=np.int64).reshape(-1, 2)
    low, high = 1, len(pairs) + 1
    while low < high:  # RETURNN's binary_search_any: an exact hit ends the search
        mid = (low + high) // 2
        diff = np.mean(pairs[:mid, 0]) - max_mean
        if diff < 0:
            low = mid + 1
        elif diff > 0:
            high = mid
        else:
            low = mid
            break
    keep = set(pairs[:low, 1].tolist())
    return np.asarray([i for i in order if int(i) in keep], dtype=np.int64)


def epoch_range(key: Any, opts: Any, owner: str, options: Sequence[str],
                whose: str) -> tuple[int, int, dict[str, Any]]:
    """One entry of an ``epoch_wise_filter`` dict: (first epoch, last epoch, its options), checked
    (``options``: the names ``whose`` filter knows)."""
    if not (isinstance(key, tuple) and len(key) == 2):
        raise DataError(f"{owner}: key {key!r} is not a pair (first_epoch, last_epoch).")
    start = 1 if key[0] is None else key[0]
    end = sys.maxsize if key[1] is None or key[1] == -1 else key[1]
    if not (isinstance(start, int) and isinstance(end, int) and 1 <= start <= end):
        raise DataError(f"{owner}: epochs {key!r} must be 1 <= first <= last (None: open).")
    if not isinstance(opts, dict) or set(opts) - set(options):
        raise DataError(f"{owner}: options {opts!r} for epochs {key!r}: {whose} knows only "
                        f"{', '.join(options)}.")
    return start, end, opts
