"""Train steps with ``tf_amp = "float16"`` on every rank, one rank's batch made to overflow float16's range
in the backward pass at chosen steps, for the loss-scale test (tests/test_mixed_precision.py).

    python loss_scale_steps.py OUT_DIR 'CONFIG_DICT_LITERAL' NUM_STEPS 'OVERFLOWS' INITIAL_SCALE GROWTH

``OVERFLOWS``: a literal dict step -> the rank whose inputs are multiplied by 1000 at that step (the
forward pass stays within float16's range, the gradient of the scaled loss does not). Writes
``OUT_DIR/rank<R>.npz``: per step the loss scale, its good-step count, the update count, what the step
reported (``Steps.nonfinite``), whether this rank's own gradient was finite before the reduction, and all
trainable parameters after the step (``params``, steps x values).
"""
import ast
import os
import sys

import numpy as np
import tensorflow as tf

from engine.config.loader import Config
from engine.distributed import broadcast_initial, fail, start
from engine.model import build_model
from engine.runtime import log
from engine.runtime.errors import EngineError
from engine.training.step import Steps
from engine.training.update.updater import Updater


class Batch:
    def __init__(self, rank: int, step: int, factor: float) -> None:
        rng = np.random.RandomState(100 * step + rank)
        lengths = np.array([6, 4 + rank], np.int32)
        self.data = {"data": factor * rng.randn(2, 6, 5).astype(np.float32),
                     "classes": rng.randint(0, 3, (2, 6)).astype(np.int32)}
        self.lengths = {"data": lengths, "classes": lengths}


def own_gradient_finite(steps: Steps, batch: Batch) -> bool:
    """This rank's gradient of the scaled loss, unscaled, before any reduction: finite or not."""
    data, lengths, targets, target_lengths = steps._inputs(batch)
    with tf.GradientTape() as tape:
        outputs = steps.model(data, lengths, training=True)
        losses = steps.model.compute_losses(outputs, targets, target_lengths, training=True)
        scaled = steps._scaled(steps._differentiated(losses))
    grads = steps._unscaled(tape.gradient(scaled, steps.params))
    return all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)


def main() -> None:
    out_dir, config_text, num_steps, overflows, initial, growth = sys.argv[1:]
    config = Config(ast.literal_eval(config_text))
    overflows = ast.literal_eval(overflows)
    log.init(verbosity=1)
    strategy = start(config)
    rank = strategy.comm.rank
    model = build_model(config, input_dim=5, input_sparse=False, target_dims={"classes": 3})
    updater = Updater.from_config(config, model.named_trainable_variables())
    updater.loss_scale.scale.assign(float(initial))  # small, so that only the injected steps overflow
    updater.loss_scale.growth_interval = int(growth)  # before the step is traced
    broadcast_initial(strategy.comm, list(model.variables) + updater.variables)
    steps = Steps(model, updater, strategy)
    record = {k: [] for k in ("scale", "good_steps", "iterations", "found", "own_finite", "params")}
    for step in range(int(num_steps)):
        batch = Batch(rank, step, 1000.0 if overflows.get(step) == rank else 1.0)
        record["own_finite"].append(own_gradient_finite(steps, batch))
        plan = strategy.before_step(step, batch, None)
        steps.train(batch)
        strategy.after_step(plan, list(model.trainable_variables))
        record["found"].append(steps.nonfinite)
        record["scale"].append(float(updater.loss_scale.scale.numpy()))
        record["good_steps"].append(int(updater.loss_scale.good_steps.numpy()))
        record["iterations"].append(int(updater.iterations.numpy()))
        record["params"].append(np.concatenate([v.numpy().ravel() for v in steps.params]))
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **{k: np.array(v) for k, v in record.items()})


if __name__ == "__main__":
    try:
        main()
    except EngineError as exc:
        fail(exc)
