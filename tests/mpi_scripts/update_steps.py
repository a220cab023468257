"""A few train steps through the engine's step and updater on fixed per-rank batches, for tests that
recompute the update by hand.

    python update_steps.py OUT_DIR 'CONFIG_DICT_LITERAL' NUM_STEPS

The config gives ``network`` (input dim 2, target ``classes`` with 3 classes), the optimizer and the
gradient and data-parallel keys. Rank R's batch at step S is drawn from the seed 100 * S + R. Writes
``OUT_DIR/rank<R>.npz``: ``initial/<var>`` and ``final/<var>`` (the trainable variables before the first
and after the last step) and ``step<S>/data``, ``/classes``, ``/lengths`` (the batches this rank used).
"""
import ast
import os
import sys

import numpy as np

from engine.config.loader import Config
from engine.distributed import broadcast_initial, fail, start
from engine.model import build_model
from engine.runtime import log
from engine.runtime.errors import EngineError
from engine.training.step import Steps
from engine.training.update.updater import Updater


class Batch:
    def __init__(self, rank: int, step: int) -> None:
        rng = np.random.RandomState(100 * step + rank)
        lengths = np.array([5, 3 + rank], np.int32)  # unequal frames per rank
        self.data = {"data": 2.0 * rng.randn(2, 5, 2).astype(np.float32),
                     "classes": rng.randint(0, 3, (2, 5)).astype(np.int32)}
        self.lengths = {"data": lengths, "classes": lengths}


def main() -> None:
    out_dir, config_text, num_steps = sys.argv[1:]
    config = Config(ast.literal_eval(config_text))
    log.init(verbosity=1)
    strategy = start(config)
    rank = strategy.comm.rank
    model = build_model(config, input_dim=2, input_sparse=False, target_dims={"classes": 3})
    updater = Updater.from_config(config, model.named_trainable_variables(), l2=model.l2_factors(),
                                  parts=model.returnn_parts())
    broadcast_initial(strategy.comm, list(model.variables) + updater.variables)
    steps = Steps(model, updater, strategy)
    named = model.named_trainable_variables()
    out = {f"initial/{name}": var.numpy() for name, var in named.items()}
    for step in range(int(num_steps)):
        batch = Batch(rank, step)
        plan = strategy.before_step(step, batch, None)
        steps.train(batch)
        strategy.after_step(plan, list(model.trainable_variables))
        out.update({f"step{step}/{key}": value for key, value in batch.data.items()})
        out[f"step{step}/lengths"] = batch.lengths["data"]
    out.update({f"final/{name}": var.numpy() for name, var in named.items()})
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **out)


if __name__ == "__main__":
    try:
        main()
    except EngineError as exc:  # as rnn.py ends: one message, the error's exit code
        fail(exc)
