"""Sequence order per epoch: ``seq_ordering``, ``partition_epoch`` and the seeds.

Orders: ``default`` (corpus order), ``reverse``, ``sorted`` / ``sorted_reverse`` (by the length of the
first data key, stable), ``random`` / ``random:N`` (a new permutation every N full epochs),
``laplace`` / ``laplace:N`` / ``laplace:.S`` (a random permutation cut into bins, each bin sorted by
length, alternately ascending and descending, so neighbouring batches have similar lengths; as in
RETURNN's ``Dataset.get_seq_order_for_epoch``: bare ``laplace`` is 2 bins, ``laplace:N`` N bins,
``laplace:.S`` max(num_seqs // S, 2) bins; ``laplace:N:M`` or ``laplace:.S:M`` keeps the seed M epochs).

The seed of a full epoch is ``fixed_random_seed`` when given (the same order every epoch; the offset
below is then ignored, as in RETURNN's ``Dataset._get_random_seed_for_epoch``), else the full-epoch
number divided down by N plus ``random_seed_offset`` (``rank * 16127`` gives every rank its own order).
With ``partition_epoch`` P the full-epoch order is computed once per P sub-epochs and sub-epoch k takes
the k-th of P consecutive slices (the first N % P of them one sequence longer, as in RETURNN), so every
sequence is seen exactly once per P.
``numpy.random.RandomState`` is used because its streams are stable across NumPy versions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.runtime.errors import DataError

LAPLACE_DEFAULT_BINS = 2  # RETURNN's, for a bare "laplace" and the least for "laplace:.S"
_FORMS = ("default, reverse, sorted, sorted_reverse, random, random:N, laplace, laplace:N, laplace:.S "
          "(optionally :M)")


@dataclass(frozen=True)
class SeqOrdering:
    method: str  # default | reverse | sorted | sorted_reverse | random | laplace
    seed_epochs: int = 1  # random:N, laplace:...:M
    bins: int | None = None  # laplace:N (bare laplace: 2)
    seqs_per_bin: int | None = None  # laplace:.S


def parse_seq_ordering(text: str | SeqOrdering, *, owner: str = "dataset") -> SeqOrdering:
    if isinstance(text, SeqOrdering):
        return text
    bad = DataError(f"{owner}: unknown seq_ordering {text!r}; expected one of: {_FORMS}.")
    if not isinstance(text, str):
        raise bad
    parts = text.split(":")
    method, args = parts[0], parts[1:]

    def positive(arg: str) -> int:
        if not arg.isdigit() or int(arg) < 1:
            raise bad
        return int(arg)

    if method in ("default", "reverse", "sorted", "sorted_reverse") and not args:
        return SeqOrdering(method)
    if method == "random" and len(args) <= 1:
        return SeqOrdering(method, seed_epochs=positive(args[0]) if args else 1)
    if method == "laplace" and not args:
        return SeqOrdering(method, bins=LAPLACE_DEFAULT_BINS)
    if method == "laplace" and len(args) in (1, 2):
        seed_epochs = positive(args[1]) if len(args) == 2 else 1
        if args[0].startswith("."):
            return SeqOrdering(method, seed_epochs=seed_epochs, seqs_per_bin=positive(args[0][1:]))
        return SeqOrdering(method, seed_epochs=seed_epochs, bins=positive(args[0]))
    raise bad


def epoch_seed(full_epoch: int, *, seed_epochs: int = 1, fixed_random_seed: int | None = None,
               random_seed_offset: int = 0) -> int:
    """The ordering (and generated data's) seed of ``full_epoch``: ``fixed_random_seed`` alone when given
    (RETURNN then ignores ``random_seed_offset`` too), else the epoch divided down by ``seed_epochs``
    plus ``random_seed_offset``."""
    if fixed_random_seed is not None:
        return int(fixed_random_seed) % 2**32
    return ((full_epoch - 1) // seed_epochs + 1 + int(random_seed_offset)) % 2**32


def full_epoch_order(ordering: SeqOrdering, num_seqs: int, get_lengths: Callable[[], np.ndarray],
                     seed: int) -> np.ndarray:
    """The order of all ``num_seqs`` corpus indices for one full epoch."""
    method = ordering.method
    if method == "default":
        return np.arange(num_seqs, dtype=np.int64)
    if method == "reverse":
        return np.arange(num_seqs - 1, -1, -1, dtype=np.int64)
    rng = np.random.RandomState(seed)
    if method == "random":
        return rng.permutation(num_seqs).astype(np.int64)
    lengths = np.asarray(get_lengths())
    if method == "sorted":
        return np.argsort(lengths, kind="stable").astype(np.int64)
    if method == "sorted_reverse":
        return np.argsort(-lengths, kind="stable").astype(np.int64)
    # laplace: shuffled, cut into bins, each bin sorted (alternating direction)
    perm = rng.permutation(num_seqs)
    bins = ordering.bins if ordering.bins is not None else \
        max(num_seqs // ordering.seqs_per_bin, LAPLACE_DEFAULT_BINS)
    # more bins than sequences: the extra ones would be empty or hold one sequence, the same order
    bins = max(1, min(bins, num_seqs))
    parts = []
    for b in range(bins):
        part = perm[b * num_seqs // bins:(b + 1) * num_seqs // bins]
        key = lengths[part] if b % 2 == 0 else -lengths[part]
        parts.append(part[np.argsort(key, kind="stable")])
    return np.concatenate(parts).astype(np.int64)


def epoch_order(ordering: SeqOrdering, *, num_seqs: int, epoch: int, get_lengths: Callable[[], np.ndarray],
                partition_epoch: int = 1, fixed_random_seed: int | None = None,
                random_seed_offset: int = 0) -> np.ndarray:
    """Corpus indices of (sub-)epoch ``epoch`` (1-based), in order."""
    if epoch < 1:
        raise ValueError(f"epochs count from 1, got {epoch}")
    full_epoch = (epoch - 1) // partition_epoch + 1
    seed = epoch_seed(full_epoch, seed_epochs=ordering.seed_epochs, fixed_random_seed=fixed_random_seed,
                      random_seed_offset=random_seed_offset)
    order = full_epoch_order(ordering, num_seqs, get_lengths, seed)
    part = (epoch - 1) % partition_epoch
    # RETURNN's split (Dataset._apply_partition_epoch_and_sharding): the first num_seqs % P parts are the
    # ones a sequence longer
    size, longer = divmod(num_seqs, partition_epoch)
    start = part * size + min(part, longer)
    return order[start:start + size + (part < longer)]
