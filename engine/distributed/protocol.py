"""The collectives of the data-parallel step protocol (``docs/distributed-protocol.md``).

Per step: ``step_signal`` (one small integer allreduce: who has data, who failed, who wants a parameter
sync or a checkpoint, who received a stop signal) and, after it, ``raise_on_failure``, so no rank waits
in a collective that a failed rank will never enter; ``agree_on_failure`` does the same between the
phases of a task (loading, saving), ``agree_on_stop`` for stop signals between epochs. ``reduce_scores``
sums score vectors over ranks; ``broadcast_initial`` gives every rank rank 0's parameters before step 1.
When each of them runs is the strategy's business (``strategy.py``).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from engine.distributed.backend import Communicator
from engine.report import phases
from engine.report.timeline import STEP_SIGNAL
from engine.runtime.errors import DistributedError, EngineError

# Step signal vector: [ranks out of data, ranks voting for a parameter sync, ranks voting for a checkpoint,
# exit code of each rank (0: no error)..., stop signal number each rank received (0: none)..., non-finite
# step of each rank (0: none; else NONFINITE_CODES * step of the epoch + what was found, 1..3)...]. Sharing
# the codes lets every rank end with the failing rank's code: mpirun returns the code of whichever rank
# exits first, so a bad corpus gives DataError's code however the ranks race.
_NO_DATA, _SYNC_VOTE, _CHECKPOINT_VOTE, _ERRORS = 0, 1, 2, 3
NONFINITE_CODES = 4  # what a non-finite step found: 1..3 (``engine.training.step.NONFINITE_*``)


@dataclass(frozen=True)
class StepSignal:
    all_have_data: bool
    any_error: bool
    failed_ranks: tuple[int, ...]
    param_sync: bool = False  # some rank voted for a (time-based) parameter sync at this step
    exit_code: int = 0  # the exit code of the lowest failed rank
    checkpoint: bool = False  # some rank voted for a checkpoint (its interval is due)
    stop_requests: tuple[tuple[int, int], ...] = ()  # (rank, signal number) of every rank asked to stop
    # (rank, step of the epoch, what was found) of every rank whose last step met an Inf/NaN
    nonfinite: tuple[tuple[int, int, int], ...] = ()


def exit_code_of(error: BaseException | None) -> int:
    """0 for no error, else the exit code the process ends with for it (``EngineError.exit_code``, or 1)."""
    return 0 if error is None else int(getattr(error, "exit_code", 1)) or 1


def step_signal(comm: Communicator, have_more_data: bool, had_error: bool | int,
                want_param_sync: bool = False, want_checkpoint: bool = False,
                stop_signal: int = 0, nonfinite: tuple[int, int] | None = None) -> StepSignal:
    """Exchange (have_more_data, had_error, want_param_sync, want_checkpoint, stop_signal, nonfinite) of
    every rank in one int32 allreduce. ``had_error``: False/0, or the exit code this rank will end with
    (True counts as 1); ``stop_signal``: the number of the stop signal this rank received, or 0;
    ``nonfinite``: (step of the epoch, what was found) when this rank's last step met an Inf/NaN."""
    vector = np.zeros(_ERRORS + 3 * comm.size, np.int32)
    vector[_NO_DATA] = not have_more_data
    vector[_SYNC_VOTE] = want_param_sync
    vector[_CHECKPOINT_VOTE] = want_checkpoint
    vector[_ERRORS + comm.rank] = had_error
    vector[_ERRORS + comm.size + comm.rank] = stop_signal
    if nonfinite is not None:
        step, found = nonfinite
        vector[_ERRORS + 2 * comm.size + comm.rank] = NONFINITE_CODES * step + found
    with comm.stall_guard("step signal"), phases.span("step signal", STEP_SIGNAL, bytes=vector.nbytes):
        (total,) = comm.allreduce([vector], "sum")
    errors = total[_ERRORS:_ERRORS + comm.size]
    stops = total[_ERRORS + comm.size:_ERRORS + 2 * comm.size]
    nonfinite_codes = total[_ERRORS + 2 * comm.size:]
    failed = tuple(int(r) for r in np.flatnonzero(errors))
    return StepSignal(all_have_data=bool(total[_NO_DATA] == 0), any_error=bool(failed), failed_ranks=failed,
                      param_sync=bool(total[_SYNC_VOTE] > 0),
                      exit_code=int(errors[failed[0]]) if failed else 0,
                      checkpoint=bool(total[_CHECKPOINT_VOTE] > 0),
                      stop_requests=tuple((int(r), int(stops[r])) for r in np.flatnonzero(stops)),
                      nonfinite=tuple((int(r), int(nonfinite_codes[r]) // NONFINITE_CODES,
                                       int(nonfinite_codes[r]) % NONFINITE_CODES)
                                      for r in np.flatnonzero(nonfinite_codes)))


def agree_on_stop(comm: Communicator, stop_signal: int) -> tuple[tuple[int, int], ...]:
    """Between the phases of training: (rank, signal number) of every rank that received a stop signal."""
    if comm.size == 1:
        return ((0, stop_signal),) if stop_signal else ()
    return step_signal(comm, have_more_data=True, had_error=False, stop_signal=stop_signal).stop_requests


def agree_on_failure(comm: Communicator, error: BaseException | None) -> None:
    """All ranks learn whether any rank failed (one signal collective); raise on every rank if one did."""
    if comm.size == 1:
        if error is not None:
            raise error
        return
    raise_on_failure(comm, step_signal(comm, have_more_data=True, had_error=exit_code_of(error)), error)


def raise_on_failure(comm: Communicator, signal: StepSignal, error: BaseException | None) -> None:
    """After a signal: if any rank failed, end every rank.

    The failing rank with the lowest index reports its own error; rank 0 (when it did not fail) names
    the failing rank; the others exit quietly, so an N-rank job prints one or two messages, not N."""
    if not signal.any_error:
        return
    failed = sorted(signal.failed_ranks)
    if error is not None and (not failed or comm.rank == failed[0]):
        if not isinstance(error, EngineError):
            raise error  # a bug: the failure handler prints the traceback and ends the job
        error.agreed = True
        raise error
    who = f"rank {', '.join(map(str, failed))}" if failed else "rank unknown"
    exc = DistributedError(f"Another rank failed ({who}); its error message is above or in its log file.")
    exc.agreed, exc.quiet = True, comm.rank != 0
    exc.exit_code = signal.exit_code or exc.exit_code  # every rank ends with the failing rank's code
    raise exc


def reduce_scores(comm: Communicator, scores: dict[str, float]) -> dict[str, float]:
    """Sums of each score (loss sums, error sums, frame counts) over all ranks, in one float64 allreduce.

    All ranks must pass the same keys; a checksum of the key names travels along and a mismatch raises
    DistributedError on every rank instead of silently adding unrelated numbers.
    """
    keys = sorted(scores)
    key_sum = zlib.crc32("\0".join(keys).encode())
    vector = np.array([float(scores[k]) for k in keys] + [key_sum], np.float64)
    with comm.stall_guard("score reduction"):
        (total,) = comm.allreduce([vector], "sum")
    if total[-1] != key_sum * comm.size:
        error = DistributedError(f"reduce_scores: the ranks reported different score names; rank {comm.rank} "
                                 f"has {keys}. Every rank must report the same scores.")
        error.agreed = True
        raise error
    return {k: float(v) for k, v in zip(keys, total[:-1])}


# What a step's score vector holds, in order: the loss and error sums, what they are divided by (frames
# for a frame-wise loss, target labels for ctc) and the input frames (the data lengths: what rates count).
SCORE_NAMES = ("loss", "error", "count", "frames")


def sum_score_vectors(comm: Communicator, scores: np.ndarray) -> np.ndarray:
    """A [loss sum, error sum, count, input frames] vector summed over all ranks."""
    totals = reduce_scores(comm, dict(zip(SCORE_NAMES, map(float, scores))))
    return np.array([totals[name] for name in SCORE_NAMES])


def broadcast_initial(comm: Communicator, variables: Sequence[Any]) -> None:
    """Rank 0's initial (or loaded) parameters to every rank, before step 1."""
    with comm.stall_guard("initial parameter broadcast"):
        comm.broadcast_variables(list(variables), root=0)
