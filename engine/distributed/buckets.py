"""Gradient buckets: which tensors are reduced together while the backward pass still runs.

The backward pass produces the last layers' gradients first, so the tensors are taken in reverse order
(the variables' order is the model's, first layer first) and cut into buckets of about
``distributed_bucket_mb`` MB (1e6 bytes), as PyTorch's DistributedDataParallel does. A bucket is
reduced as soon as all its tensors exist, while TensorFlow computes the earlier layers' gradients.
``first_mb`` caps the first bucket separately (DDP: 1 MB): a small first bucket starts the link early.

The assignment depends only on the tensors' sizes and order, which every rank has in common, so every
rank reduces the same buckets in the same order. Pure functions; no TensorFlow, no MPI.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

MB = 1_000_000
# The first bucket's cap (None: distributed_bucket_mb, like the others); chosen by measurement
# (docs/performance.md, "Overlap").
FIRST_BUCKET_MB: float | None = None
HOROVOD_FUSION_ENV = "HOROVOD_FUSION_THRESHOLD"


def assign_buckets(sizes: Sequence[int], bucket_mb: float, first_mb: float | None = None) -> list[list[int]]:
    """Indices of ``sizes`` (bytes per tensor) grouped into buckets, in reduction order.

    The tensors are walked from the last to the first; a bucket closes when adding the next tensor would
    take it past its cap (a tensor larger than the cap gets a bucket of its own). ``bucket_mb`` 0: one
    bucket with everything. Within a bucket, indices keep the walk's (reverse) order.
    """
    if bucket_mb < 0 or (first_mb is not None and first_mb < 0):
        raise ValueError(f"assign_buckets: bucket sizes must be >= 0, got {bucket_mb} and {first_mb}")
    order = list(range(len(sizes)))[::-1]
    if bucket_mb == 0 or not order:
        return [order] if order else []
    caps = (first_mb if first_mb is not None else bucket_mb) * MB, bucket_mb * MB
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index in order:
        cap = caps[0] if not buckets else caps[1]
        if current and filled + sizes[index] > cap:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    buckets.append(current)
    return buckets


def buckets_for(tensors: Sequence[Any], bucket_mb: float) -> list[list[int]]:
    """``assign_buckets`` for tensors or variables (anything with ``shape`` and ``dtype``); one of unknown
    shape counts as infinitely large (a bucket of its own)."""
    sizes = []
    for tensor in tensors:
        count = tensor.shape.num_elements()
        sizes.append(float("inf") if count is None else count * tensor.dtype.size)
    return assign_buckets(sizes, bucket_mb, FIRST_BUCKET_MB)


def set_horovod_fusion_threshold(bucket_mb: float) -> None:
    """Horovod fuses the tensors that are ready within one cycle up to HOROVOD_FUSION_THRESHOLD bytes;
    with buckets, that threshold is the bucket size (a variable the user set wins). Horovod reads it in
    ``hvd.init``, so this runs before the communicator is created."""
    if bucket_mb > 0:
        os.environ.setdefault(HOROVOD_FUSION_ENV, str(int(round(bucket_mb * MB))))
