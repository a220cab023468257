"""What a train epoch must have done before its score goes into the log, the learning-rate file and a
checkpoint: at least one step, and a finite score unless ``stop_on_nonfinite_train_score`` is False.

An epoch without a step trained nothing and has no score (0 / 0, NaN): with data-parallel ranks that
shard the train batches (``horovod_dataset_distribution = "shard"``, and always in grad mode) the epoch
ends for every rank when one rank is out of batches, so a train set of fewer batches than ranks gives some
rank none and the whole epoch no step. RETURNN has no key that allows this, and neither has this engine:
such an epoch always ends the training with a DataError (exit code 3) that gives the numbers, before
anything NaN is written.
"""
from __future__ import annotations

import math

from engine.runtime import log
from engine.runtime.errors import DataError, NonFiniteTrainScore


def no_step_error(epoch: int, batches: int, ranks: int, num_seqs: int, rank: int) -> DataError:
    """The error every rank raises for a train epoch that ran no step (rank 0 says it, the others are
    quiet). ``batches``: the train set's batches of this epoch for all ranks together; ``ranks``: how many
    ranks share them (1: a single process, or ranks that each read the whole set); ``num_seqs``: the
    sequences of the epoch."""
    what = f"train epoch {epoch} ran no step: the train set gives {batches} batch{'es' * (batches != 1)}"
    if ranks > 1:
        without = f"rank {batches}" if ranks - batches == 1 else f"ranks {batches} to {ranks - 1}"
        error = DataError(
            f"{what} for {ranks} ranks (horovod_dataset_distribution 'shard': rank r takes batches r, "
            f"r + {ranks}, ..., and the epoch ends for every rank when one has no batch left), so {without} "
            "got none and no rank trained. Nothing is trained or saved, and no score is written. "
            f"Make the train set give at least {ranks} batches (a smaller batch_size or max_seqs, or more "
            "data), or run with fewer ranks.")
    else:
        error = DataError(
            f"{what} ({num_seqs} sequences in the epoch; sequences longer than max_seq_length are left out). "
            "Nothing is trained or saved, and no score is written. Check the train dataset and "
            "max_seq_length.")
    error.agreed, error.quiet = True, rank != 0
    return error


def check_train_score(epoch: int, score: float, count: float, stop_on_nonfinite: bool, rank: int) -> None:
    """After a train epoch with steps: a score that is Inf or NaN. With ``stop_on_nonfinite_train_score``
    False, rank 0 warns and training goes on, as in RETURNN. With the key True no step met an Inf or NaN
    (that would have stopped the training already), so the score is NaN because the epoch counted nothing
    to average over (``count`` 0): an error on every rank rather than a NaN in the learning-rate file."""
    if math.isfinite(score):
        return
    if not stop_on_nonfinite:
        if rank == 0:
            log.warning(f"train epoch {epoch}: the score is {score} (Inf/NaN); "
                        "stop_on_nonfinite_train_score = False, so training goes on, as in RETURNN.")
        return
    error = NonFiniteTrainScore(
        f"stop_on_nonfinite_train_score: train epoch {epoch} ends with the score {score}, though no step met "
        f"an Inf or NaN: the epoch counted {count:g} target frames or labels to average over. Training "
        "stops before the score is written to the learning-rate file or a checkpoint. Check the train "
        "dataset's targets.")
    error.agreed, error.quiet = True, rank != 0
    raise error
