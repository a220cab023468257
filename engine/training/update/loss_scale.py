"""Dynamic loss scaling for ``tf_amp = "float16"``: the differentiated loss is multiplied by a scale S, so
that small gradients survive float16's backward pass, and the gradients are divided by S again (in
float32, before the ranks reduce them).

The rule (Keras' LossScaleOptimizer's and PyTorch's GradScaler's): S starts at 2^15. A step whose reduced
gradients hold an Inf or NaN (float16's range overflowed somewhere in the backward pass, on any rank)
is skipped, no parameter, optimizer slot or update count changes, and S halves (never below 1). After
``GROWTH_INTERVAL`` steps in a row without overflow S doubles.

Every rank makes the same decision: it is taken on the gradients after the reduction (``Steps._update``),
which every rank holds alike, and an Inf or NaN on one rank makes the sum non-finite on all of them (also
through ``distributed_wire_format``: the fp16 wire passes a non-finite tensor unscaled, bf16 has float32's
range). So the ranks skip the same step, and their S and good-step counts stay equal; both are part of
the optimizer state (``Updater.named_variables``: saved in checkpoints, broadcast from rank 0 at the
start, restored on resume). Param mode (``horovod_reduce_type = "param"``) reduces no gradients, so no
such agreement exists there: float16 is refused with it (``check_mode``).

Not a non-finite stop: an overflow under loss scaling is expected (every growth that goes too far meets
one), so it is not what ``stop_on_nonfinite_train_score`` stops for (``training/nonfinite.py``). A
non-finite *loss* is: the scale does not act on the forward pass, so that is a real overflow.
"""
from __future__ import annotations

import tensorflow as tf

from engine.runtime.errors import ConfigError

INITIAL_SCALE = 2.0 ** 15
GROWTH_INTERVAL = 2000  # good steps in a row before the scale doubles (Keras' and PyTorch's default)
PREFIX = "loss_scale/"  # its variables' names among the optimizer state
OVERFLOW = 4  # what ``Steps._update`` returns for a step the loss scale skipped (beside nonfinite's codes)


class LossScale:
    """The scale and the count of good steps since the last change, as variables."""

    def __init__(self, initial: float = INITIAL_SCALE, growth_interval: int = GROWTH_INTERVAL) -> None:
        self.growth_interval = int(growth_interval)
        self.scale = tf.Variable(float(initial), trainable=False, dtype=tf.float32, name="loss_scale")
        self.good_steps = tf.Variable(0, trainable=False, dtype=tf.int64, name="loss_scale_good_steps")

    def named_variables(self) -> dict[str, tf.Variable]:
        return {f"{PREFIX}scale": self.scale, f"{PREFIX}good_steps": self.good_steps}

    def scaled(self, loss: tf.Tensor) -> tf.Tensor:
        return loss * self.scale

    def unscaled(self, grads: list) -> list:
        """The gradients of the scaled loss divided by the scale (None stays None)."""
        inverse = 1.0 / self.scale
        return [None if g is None else g * tf.cast(inverse, g.dtype) for g in grads]

    def update(self, finite: tf.Tensor) -> None:
        """After a step's (reduced) gradients were found ``finite`` or not: halve, or count and maybe double.
        Usable inside a ``tf.function``."""
        good = self.good_steps + 1
        grow = tf.logical_and(finite, good >= self.growth_interval)
        halved = tf.maximum(self.scale / 2.0, 1.0)
        scale = tf.where(finite, tf.where(grow, self.scale * 2.0, self.scale), halved)
        self.scale.assign(scale)
        self.good_steps.assign(tf.where(finite, tf.where(grow, tf.constant(0, tf.int64), good),
                                        tf.constant(0, tf.int64)))


def loss_scale_for(dtype: str) -> LossScale | None:
    """The loss scale of a run computing in ``dtype`` (``tf_amp``), or None (float32 and bfloat16 need none:
    bfloat16 has float32's range)."""
    return LossScale() if dtype == "float16" else None


def check_mode(loss_scale: LossScale | None, keeps_rank_state: bool) -> None:
    """Refuses loss scaling where ranks update alone (param mode; see the module docstring)."""
    if loss_scale is not None and keeps_rank_state:
        raise ConfigError("Config key 'tf_amp' is 'float16', which needs loss scaling, whose skip-and-halve "
                          "decision every rank must take alike on the reduced gradients; with "
                          "horovod_reduce_type = 'param' no gradients are reduced. Use tf_amp = 'bfloat16' "
                          "(no loss scaling needed) or horovod_reduce_type = 'grad'.")
