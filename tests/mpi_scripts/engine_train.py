"""Train through the engine's own API and record what each rank saw, for the engine tests.

    python engine_train.py OUT_DIR 'CONFIG_DICT_LITERAL' [options]
    python engine_train.py OUT_DIR '[CONFIG_DICT_LITERAL or [CONFIG_DICT_LITERAL, [options]], ...]' [options]
        [fail=step|loader|kill|stall|eio|nan|scale|SIGUSR1|SIGUSR2|SIGTERM] [fail_rank=R] [fail_step=S]
        [fail_once=MARKER_FILE] [fail_scale=FACTOR] [ready=FILE] [step_sleep=SECONDS] [slow_save=SECONDS]
        [fp16_guard=off]

Writes ``OUT_DIR/rank<R>.npz``: the final parameters, and per train step a parameter checksum after the
step and (where a sync followed) after the sync, so tests can compare ranks and runs. A signal name as
``fail`` makes rank R send itself that signal in its step S (counted from 0 in this process); with
``fail_once`` only if MARKER_FILE does not exist yet (it is created then), so a restarted job runs through.
``fail=nan`` puts a NaN into the first input value of rank R's batch in its step S (a broken feature);
``fail=scale`` multiplies that batch's input by ``fail_scale`` (default 1e6: loud features, gradients
far past fp16's range while float32 holds them). ``fp16_guard=off`` builds the communicators without the
fp16 range guard (engine/distributed/wire_guard.py), to show what it prevents.
``fail=eio`` makes rank R's checkpoint reads fail with EIO, as a flaky disk or network file system does
(with ``fail_once``: only until MARKER_FILE exists, which the first failed read creates).
A run stopped on request exits with 99 and writes nothing; other engine errors end it as in rnn.py.
``ready``: rank 0 creates FILE after its first train step (a test then knows training runs);
``step_sleep``: every rank sleeps that long after each step (training that lasts while a test acts);
``slow_save``: rank 0 takes that much longer to write each checkpoint (slow storage).

A list of configs trains them one after the other in the same processes (one TensorFlow start-up and one
MPI job for all: the suite's cost is the number of processes it starts). Run K writes
``OUT_DIR/run<K>/rank<R>.npz``, and rank 0 prints ``=== run K`` before it starts; the options after the
list apply to every run, and a run's own options are added to them. A run that ends the job (an error, a
stop) must be the last one.
"""
import ast
import contextlib
import dataclasses
import os
import signal
import sys
import time

import numpy as np

from engine.config.loader import Config
from engine.distributed import fail as fail_job
from engine.distributed.strategy import ParamAverage
from engine.runtime import log, process
from engine.runtime.errors import EngineError
from engine.runtime.launch import env_rank
from engine.tasks.train import run_train
from engine.training import step as step_module


def main() -> None:
    out_dir, config_text, *options = sys.argv[1:]
    runs = ast.literal_eval(config_text)
    if isinstance(runs, dict):
        train_once(out_dir, runs, options)
        return
    for k, run in enumerate(runs):
        values, own_options = (run, []) if isinstance(run, dict) else run
        folder = os.path.join(out_dir, f"run{k}")
        os.makedirs(folder, exist_ok=True)
        if env_rank() == 0:  # one marker a run: tests split rank 0's output at them
            print(f"=== run {k}", flush=True)
        train_once(folder, values, [*options, *own_options])
        process.set_communicator(None)  # the next run creates its own


_original_average = ParamAverage.average_parameters


def train_once(out_dir: str, values: dict, options: list[str]) -> None:
    opts = dict(o.split("=", 1) for o in options)
    config = Config(values)
    log.init(verbosity=config.int("log_verbosity", 3))
    fail = opts.get("fail")
    fail_rank, fail_step = int(opts.get("fail_rank", 1)), int(opts.get("fail_step", 1))
    trace = {"after_step": [], "after_sync": [], "sync_steps": []}
    recorded = {}

    class RecordingSteps(step_module.Steps):
        """The engine's steps, observed (and broken on purpose where the test asks for it)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.count = 0
            recorded["steps"] = self

        def checksum(self):
            return np.concatenate([v.numpy().ravel() for v in self.params]).astype(np.float64)

        def train(self, batch):
            batch = self.inject_failure(batch)
            scores = super().train(batch)
            self.step_recorded()
            return scores

        def train_accumulating(self, batch):  # accum_grad_multiple_step > 1: counted like a step
            batch = self.inject_failure(batch)
            result = super().train_accumulating(batch)
            self.step_recorded()
            return result

        def inject_failure(self, batch):
            rank = process.rank()
            once = opts.get("fail_once")
            if rank == fail_rank and self.count == fail_step and not (once and os.path.exists(once)):
                if once:
                    open(once, "w").close()
                if fail in ("SIGUSR1", "SIGUSR2", "SIGTERM"):
                    os.kill(os.getpid(), signal.Signals[fail])
                if fail == "step":
                    raise RuntimeError(f"injected failure in train step {self.count} on rank {rank}")
                if fail == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if fail == "stall":
                    time.sleep(600)  # alive, but never joins the step's gradient reduction
                if fail == "nan":
                    data = np.array(batch.data["data"], np.float32)
                    data.flat[0] = np.nan
                    batch = dataclasses.replace(batch, data={**batch.data, "data": data})
                if fail == "scale":
                    data = np.array(batch.data["data"], np.float32) * np.float32(opts.get("fail_scale", 1e6))
                    batch = dataclasses.replace(batch, data={**batch.data, "data": data})
            return batch

        def step_recorded(self):
            trace["after_step"].append(self.checksum())
            self.count += 1
            if process.rank() == 0 and self.count == 1 and "ready" in opts:
                open(opts["ready"], "w").close()
            time.sleep(float(opts.get("step_sleep", 0)))

    def recording_average(self, params):
        _original_average(self, params)
        trace["sync_steps"].append(recorded["steps"].count - 1)
        trace["after_sync"].append(recorded["steps"].checksum())

    import engine.tasks.train as train_module
    from engine.distributed import backend

    with contextlib.ExitStack() as patches:  # this run's changes to the engine, undone before the next run
        def patch(owner, name: str, value) -> None:
            patches.callback(setattr, owner, name, getattr(owner, name))
            setattr(owner, name, value)

        patch(ParamAverage, "average_parameters", recording_average)
        patch(step_module, "Steps", RecordingSteps)
        patch(train_module, "Steps", RecordingSteps)
        if opts.get("fp16_guard") == "off":
            patch(backend, "RangeGuard", lambda size: None)  # communicators made from now on have no guard
        if fail == "loader":
            _break_loader(patch, fail_rank, fail_step)
        if fail == "eio" and process.rank() == fail_rank:
            _break_checkpoint_reads(patch, opts.get("fail_once"))
        if "slow_save" in opts:
            _slow_down_saves(patch, float(opts["slow_save"]))
        try:
            run_train(config)
        except EngineError as exc:  # as rnn.py ends: one message (none for a stop), the error's exit code
            fail_job(exc)
    steps = recorded["steps"]
    np.savez(os.path.join(out_dir, f"rank{process.rank()}.npz"), params=steps.checksum(),
             after_step=np.array(trace["after_step"]), after_sync=np.array(trace["after_sync"]),
             sync_steps=np.array(trace["sync_steps"]), num_steps=steps.count)


def _slow_down_saves(patch, seconds: float) -> None:
    """Rank 0 (the one that writes) spends ``seconds`` more in every checkpoint write."""
    from engine.training.checkpoints import policy

    save = policy.save_checkpoint

    def slow_save(*args, **kwargs):
        time.sleep(seconds)
        return save(*args, **kwargs)

    patch(policy, "save_checkpoint", slow_save)


def _break_loader(patch, fail_rank: int, fail_after_reads: int) -> None:
    """Make the data loader of ``fail_rank`` raise a DataError after some sequences (a corrupt corpus)."""
    from engine.datasets.base import Dataset
    from engine.runtime.errors import DataError

    original = Dataset.read_into
    reads = {"n": 0}

    def read_into(self, seq_idx, key, out, offset=0):
        if process.rank() == fail_rank:
            reads["n"] += 1
            if reads["n"] > fail_after_reads:
                raise DataError(f"injected corrupt sequence {seq_idx} in dataset {self.name!r}")
        return original(self, seq_idx, key, out, offset)

    patch(Dataset, "read_into", read_into)


def _break_checkpoint_reads(patch, once: str | None) -> None:
    """Opening a checkpoint for reading fails with EIO (until ``once`` exists, if given)."""
    import errno

    from engine.training.checkpoints import reading as checkpoint_read

    real = checkpoint_read.h5py

    class FailingReads:  # h5py as checkpoint_read sees it, but File(path, "r") fails
        def __getattr__(self, name):
            return getattr(real, name)

        def File(self, path, mode="r", *args, **kwargs):
            if mode == "r" and not (once and os.path.exists(once)):
                if once:
                    open(once, "w").close()
                raise OSError(errno.EIO, f"Unable to synchronously open file (unable to read '{path}': "
                                         "errno = 5, error message = 'Input/output error')")
            return real.File(path, mode, *args, **kwargs)

    patch(checkpoint_read, "h5py", FailingReads())


if __name__ == "__main__":
    main()
