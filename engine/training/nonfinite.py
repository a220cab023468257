"""``stop_on_nonfinite_train_score`` [True]: training ends at the first Inf or NaN, with one message.

What RETURNN does (``returnn/tf/engine.py``, ``Runner.run`` and ``Engine.train_epoch``; the PyTorch
engine's ``train_epoch`` likewise): after every train step, when the key is true (its default), it checks
the epoch's accumulated scores and raises "Inf/nan score in step N", after the step's update was
applied; the TensorFlow engine then saves the model as ``<model>.<epoch>.crash_<step>`` and exits with
1. With the key false nothing is checked per step: the updates are applied as they come (Inf/NaN
gradients make the parameters Inf/NaN, and every later score with them), the epoch's final score is
printed as broken, and training goes on, saving its checkpoints as usual.

Here, with the key true, each update checks the scores and the gradients it would apply (after
clipping, noise and ``maximize_grad_norm``; ``Steps._update``): an Inf or NaN skips the update, so the
parameters and the optimizer state stay those of the step before, and training ends with one paragraph
naming the epoch, the step and the newest checkpoint (which a rerun resumes from), exit code 3
(``NonFiniteTrainScore``). The parameters are also checked after each update (an overflow of the update
itself ends training the same way) and before every checkpoint is written (``Checkpointer``): nothing
with an Inf or NaN is saved. In grad mode the scores and gradients are the reduced ones, so every rank
finds the same and ends at once; in param mode the rank tells the others in the next step signal. With
the key false: RETURNN's behaviour, plus a warning after an epoch whose train score is not finite.

With ``distributed_wire_format = "fp16"`` a reduced gradient is never made non-finite by fp16's range:
every reduction is scaled into it first (``engine/distributed/wire_guard.py``), and a tensor that holds an
Inf or NaN on some rank travels unscaled. So what is found here is non-finite in float32 as well, and
the same on every rank.

With ``tf_amp = "float16"`` a non-finite reduced gradient with finite scores is float16's overflow under
loss scaling, an expected event: ``Steps._update`` skips that update and halves the scale
(``update/loss_scale.py``) and reports it as ``FINITE``, so nothing here stops for it. A non-finite loss
still stops (the scale does not act on the forward pass).
"""
from __future__ import annotations

from typing import Sequence

from engine.runtime.errors import NonFiniteTrainScore

# What a train step's update found (``Steps.nonfinite``): all finite; an Inf/NaN score (loss) or
# gradient, so the update was not applied; or parameters that the update itself made Inf/NaN (an
# overflow of the optimizer's arithmetic). The step signal carries them (``protocol.NONFINITE_CODES``).
FINITE, NONFINITE_LOSS, NONFINITE_GRADIENT, NONFINITE_PARAMS = 0, 1, 2, 3
NONFINITE_WHAT = {NONFINITE_LOSS: "a non-finite loss", NONFINITE_GRADIENT: "a non-finite gradient",
                  NONFINITE_PARAMS: "non-finite parameters after its update"}

ADVICE = ("Lower the learning rate or clip the gradients (gradient_clip_global_norm), check the data for "
          "Inf/NaN (HDFDataset's check_finite), or set stop_on_nonfinite_train_score = False to train on as "
          "RETURNN does.")


def nonfinite_error(found: Sequence[tuple[int, int, int]], epoch: int, *, epoch_global_step: int | None,
                    checkpoint: str, several_ranks: bool, rank: int) -> NonFiniteTrainScore:
    """The error every rank raises: rank 0 says it, the others are quiet. ``found``: (rank, step of the
    epoch counted from 1, what was found) per rank that found something (in grad mode rank 0's stands
    for all); ``epoch_global_step``: the global step at the epoch's start (None: unknown);
    ``checkpoint``: what ``newest_checkpoint_text`` says."""
    parts = []
    for who, step, what in found:
        at = f"step {step}" + (f" (global step {epoch_global_step + step})" if epoch_global_step is not None
                               else "")
        parts.append((f"rank {who}'s " if several_ranks else "") + f"{at} had {NONFINITE_WHAT[what]}")
    if any(what == NONFINITE_PARAMS for _, _, what in found):
        outcome = "The parameters in memory are broken; training stops without saving them."
    else:
        outcome = "That update was not applied; training stops without saving."
    error = NonFiniteTrainScore(f"stop_on_nonfinite_train_score: in train epoch {epoch}, {'; '.join(parts)}. "
                                f"{outcome} {checkpoint} {ADVICE}")
    error.agreed, error.quiet = True, rank != 0
    return error


def newest_checkpoint_text(prefix: str | None, newest: str | None) -> str:
    """Names the checkpoint a rerun would resume from (``newest``, under ``prefix``), or that there is
    none."""
    if not prefix:
        return "No checkpoint is saved in this run ('model' is not set)."
    if newest is None:
        return f"There is no checkpoint under '{prefix}': a rerun starts afresh."
    return (f"The last good checkpoint is '{newest}': a rerun resumes from it and meets the same step again "
            "unless the config or the data change.")
