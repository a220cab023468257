"""Several trainings one after the other in one MPI job (one TensorFlow start-up for all of them), each
rank recording its final parameters, for tests that compare backends and modes.

    python train_runs.py OUT_DIR 'LIST_OF_CONFIG_DICT_LITERALS' [fail_rank=R fail_run=K]

Writes ``OUT_DIR/run<K>_rank<R>.npy``: run K's trainable parameters, flattened and concatenated (float64).
A backend that must start before TensorFlow's first operation (``tf``) goes first in the list.
``fail_rank=R fail_run=K``: rank R raises in its second train step of run K (the job must end there).
"""
import ast
import os
import sys

import numpy as np

from engine.config.loader import Config
from engine.distributed import fail as fail_job
from engine.runtime import log, process
from engine.runtime.errors import EngineError
from engine.tasks.train import run_train
from engine.training import step as step_module


def main() -> None:
    out_dir, configs_text, *options = sys.argv[1:]
    opts = dict(o.split("=", 1) for o in options)
    fail_rank, fail_run = int(opts.get("fail_rank", -1)), int(opts.get("fail_run", 0))
    recorded = {"run": 0}

    class RecordingSteps(step_module.Steps):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.count = 0
            recorded["steps"] = self

        def train(self, batch):
            if process.rank() == fail_rank and recorded["run"] == fail_run and self.count == 1:
                raise RuntimeError(f"injected failure in train step {self.count} on rank {fail_rank}")
            self.count += 1
            return super().train(batch)

    import engine.tasks.train as train_module
    train_module.Steps = RecordingSteps
    for k, config_dict in enumerate(ast.literal_eval(configs_text)):
        recorded["run"] = k
        config = Config(config_dict)
        log.init(verbosity=config.int("log_verbosity", 3))
        try:
            run_train(config)
        except EngineError as exc:
            fail_job(exc)
        params = np.concatenate([v.numpy().ravel() for v in recorded["steps"].params]).astype(np.float64)
        np.save(os.path.join(out_dir, f"run{k}_rank{process.rank()}.npy"), params)
        print(f"rank {process.rank()}: run {k} done after {recorded['steps'].count} steps", flush=True)
        process.set_communicator(None)  # the next run creates its own


if __name__ == "__main__":
    main()
