"""Mid-epoch checkpoints and exact resume with real 2-rank mpirun jobs: a run stopped by a signal on one
rank (exit 99, one line saying why, a checkpoint) and started again, or restarted by ``supervise`` after a
rank was SIGKILLed, ends with parameters bitwise equal to an uninterrupted run, in grad and in param mode
(also with ``random_seed_offset``, where the ranks do not meet every step); dropout, Adam's state, newbob's
learning-rate history and the data position all survive. Each uninterrupted reference runs once.

A resumed run must show that it continued: a run that ignored the checkpoint and trained from the start
would end with the same parameters, so every resume test also checks rank 0's resume lines (the
checkpoint the stop saved, its step) and that each rank trained only the steps that were left.

The step at which ``supervise``'s test kills a rank is random: set ``TEST_SEED`` to repeat a failed run
(the seed is printed, and named in the failure message)."""
from __future__ import annotations

import os
import random
import re
import sys

import numpy as np
import pytest

from helpers import BIN, ROOT, mpirun_cmd, run, run_mpi

pytestmark = pytest.mark.mpi
SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")

NETWORK = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 8, "dropout": 0.2},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm", "dropout": 0.1}}
MODES = {
    "grad": {},
    "param": {"horovod_reduce_type": "param", "horovod_param_sync_step": 3},
    # the average reduces the change since the last one: a mid-epoch checkpoint keeps that base
    "param-fp16": {"horovod_reduce_type": "param", "horovod_param_sync_step": 3,
                   "distributed_wire_format": "fp16"},
    "param-rso": {"horovod_reduce_type": "param", "horovod_dataset_distribution": "random_seed_offset",
                  "horovod_param_sync_step": 100,  # the ranks meet only at the end of an epoch
                  # no fixed_random_seed, which would ignore the ranks' offsets: each rank its own data
                  "train": {"class": "Task12AXDataset", "num_seqs": 48, "seq_ordering": "random"}},
    "horovod": {"distributed_backend": "horovod"},
}
STEPS_PER_EPOCH = 6  # per rank, 2 ranks sharding 12 batches; 12 per rank with random_seed_offset


def config(folder, mode: str) -> dict:
    values = {
        "train": {"class": "Task12AXDataset", "num_seqs": 48, "fixed_random_seed": 1,
                  "seq_ordering": "random"},
        "dev": {"class": "Task12AXDataset", "num_seqs": 8, "fixed_random_seed": 2},
        "network": NETWORK, "optimizer": {"class": "adam"}, "learning_rate": 0.02,
        "learning_rate_control": "newbob", "newbob_relative_error_threshold": 0.5,  # decays every epoch
        "learning_rate_file": str(folder / "lr.txt"), "model": str(folder / "net"),
        "batch_size": 300, "max_seqs": 4, "num_epochs": 2, "log_verbosity": 3, "random_seed": 5,
        "use_horovod": True, "distributed_backend": "mpi", "checkpoint_interval": 4,
    }
    values.update(MODES[mode])
    return values


def train(folder, values: dict, *options: str, expect: int = 0):
    folder.mkdir(exist_ok=True)
    result = run_mpi(2, [SCRIPT, str(folder), repr(values), *options], timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == expect, output
    return (None if expect else [dict(np.load(folder / f"rank{r}.npz")) for r in range(2)]), output


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of each mode (the Horovod test compares with grad's), all trained in one job
    the first time one is asked for: a run's parameters depend only on its config (stateless random
    ops), not on the process it runs in."""
    runs = {}

    def get(mode: str):
        if not runs:
            folder = tmp_path_factory.mktemp("reference")
            modes = [name for name in MODES if name != "horovod"]
            result = run_mpi(2, [SCRIPT, str(folder), repr([config(folder / f"run{k}", name)
                                                            for k, name in enumerate(modes)])], timeout=400)
            assert result.returncode == 0, result.stdout + result.stderr
            for k, name in enumerate(modes):
                runs[name] = [dict(np.load(folder / f"run{k}" / f"rank{r}.npz")) for r in range(2)]
                assert not np.array_equal(runs[name][0]["params"], runs[name][0]["after_step"][0])  # trained
                steps = 2 * STEPS_PER_EPOCH * (2 if MODES[name].get("horovod_dataset_distribution") else 1)
                assert [int(r["num_steps"]) for r in runs[name]] == [steps, steps]
        return runs[mode]

    return get


def assert_equal_runs(resumed, reference, exact: bool = True) -> None:
    for rank in range(2):
        if exact:
            np.testing.assert_array_equal(resumed[rank]["params"], reference[rank]["params"])
        else:
            np.testing.assert_allclose(resumed[rank]["params"], reference[rank]["params"], rtol=1e-6,
                                       atol=1e-7)


def assert_resumed(output: str, saved: str, resumed: list, reference: list, epoch_step: int,
                   done: list[int]) -> None:
    """The run continued from ``saved`` (the checkpoint the stop wrote): rank 0 names it with its epoch and
    global step and continues after ``epoch_step`` steps of that epoch, and rank r trains ``done[r]``
    steps fewer than the uninterrupted run (a run that started afresh would train all of them)."""
    epoch, global_step = (int(n) for n in re.search(r"\.(\d{3})\.step(\d+)$", saved).groups())
    assert f"resuming in epoch {epoch} at global step {global_step} from {saved}\n" in output, output
    assert f"train epoch {epoch}: continuing after step {epoch_step} (" in output, output
    left = [int(r["num_steps"]) - d for r, d in zip(reference, done)]
    assert [int(r["num_steps"]) for r in resumed] == left, output


def stop_and_resume(folder, mode: str, signal_name: str, step: int) -> tuple[list, str, str, str]:
    values = config(folder, mode)
    _, stopped = train(folder, values, f"fail={signal_name}", "fail_rank=1", f"fail_step={step}", expect=99)
    lines = [line for line in stopped.splitlines() if "stopping on request" in line]
    assert len(lines) == 1, stopped
    assert f"{signal_name} received by rank 1; saved checkpoint {folder}/net." in lines[0], stopped
    saved = lines[0].split("saved checkpoint ")[1].split(" ")[0]
    assert os.path.isfile(saved), stopped
    assert lines[0].endswith("exiting with code 99: run the same command to resume."), stopped
    mid_epoch = sorted(name for name in os.listdir(folder) if ".step" in name)
    assert mid_epoch == ([os.path.basename(saved)] if ".step" in saved else []), mid_epoch  # older: removed
    assert "resuming" not in stopped and "continuing after" not in stopped, stopped  # the first run: afresh
    resumed, output = train(folder, values)
    return resumed, stopped, output, saved


@pytest.mark.parametrize("mode", ["grad", "param", "param-fp16"])
def test_a_run_stopped_by_sigusr1_on_one_rank_resumes_at_the_next_batch_bitwise(tmp_path, reference, mode):
    # rank 1 gets SIGUSR1 in its 10th step: all ranks save the state after it and exit 99
    resumed, stopped, output, saved = stop_and_resume(tmp_path, mode, "SIGUSR1", step=9)
    assert "(epoch 2, step 4 of the epoch)" in stopped, stopped
    assert saved == f"{tmp_path}/net.002.step10", stopped
    assert "train epoch 2: continuing after step 4 (8 batches of the epoch's plan done)" in output, output
    assert_resumed(output, saved, resumed, reference(mode), epoch_step=4, done=[10, 10])
    assert_equal_runs(resumed, reference(mode))
    if mode == "param":  # the ranks' Adam states differ: the epoch checkpoint holds each rank's
        # epoch 2's checkpoint and learning-rate history move aside: a restart at 2 does not mix with them
        again = dict(config(tmp_path, mode), start_epoch=2, move_old_checkpoints=True)
        from_epoch_1, output = train(tmp_path, again)
        assert f"resuming after epoch 1 from {tmp_path}/net.001\n" in output, output
        assert "move_old_checkpoints: moved" in output, output
        assert [int(r["num_steps"]) for r in from_epoch_1] == [STEPS_PER_EPOCH] * 2  # epoch 2 only
        assert_equal_runs(from_epoch_1, reference(mode))


def test_without_a_step_signal_a_stop_reaches_every_rank_and_resumes_bitwise_equal(tmp_path, reference):
    """param + random_seed_offset: rank 1 tells rank 0 over the side channel; both stop within a step,
    each at its own position, also when rank 0 is already out of data."""
    resumed, stopped, output, saved = stop_and_resume(tmp_path, "param-rso", "SIGTERM", step=9)
    at = re.search(r"\(epoch 1, step (\d+) of the epoch\)", stopped)
    assert at, stopped
    rank0_steps = int(at.group(1))  # where rank 0 heard of the stop (its own pace), or out of data
    assert 1 <= rank0_steps <= 2 * STEPS_PER_EPOCH, stopped
    # rank 1 stops after the step in which it got the signal (its 10th), rank 0 at the position it saved
    assert_resumed(output, saved, resumed, reference("param-rso"), epoch_step=rank0_steps,
                   done=[rank0_steps, 10])
    assert_equal_runs(resumed, reference("param-rso"))


def test_horovod_run_stopped_by_sigusr2_resumes_equal(tmp_path, reference):
    """Compared with the uninterrupted run on the mpi backend: with 2 ranks the backends agree bit for bit,
    and a sum of 2 does not depend on Horovod's fusion order, so this is exact too (see
    docs/long-jobs.md for 3 and more ranks)."""
    resumed, stopped, output, saved = stop_and_resume(tmp_path, "horovod", "SIGUSR2", step=3)
    assert "(epoch 1, step 4 of the epoch)" in stopped, stopped
    assert "using the horovod backend" in stopped and "using the horovod backend" in output, output
    assert "train epoch 1: continuing after step 4 (8 batches of the epoch's plan done)" in output, output
    assert_resumed(output, saved, resumed, reference("grad"), epoch_step=4, done=[4, 4])
    assert_equal_runs(resumed, reference("grad"), exact=False)
    assert_equal_runs(resumed, reference("grad"))


def test_supervise_restarts_a_job_whose_rank_was_sigkilled_and_it_ends_bitwise_equal(tmp_path, reference):
    seed = int(os.environ.get("TEST_SEED") or random.randrange(2**32))
    print(f"TEST_SEED={seed}")  # pytest shows it with a failure; the assertions name it too
    step = random.Random(seed).randrange(1, 2 * STEPS_PER_EPOCH)  # any step of the run but the first
    values = config(tmp_path, "grad")
    command = mpirun_cmd(2, [sys.executable, SCRIPT, str(tmp_path), repr(values), "fail=kill", "fail_rank=1",
                             f"fail_step={step}", f"fail_once={tmp_path / 'killed'}"])
    result = run([str(BIN / "supervise"), "--backoff", "0.1", "--", *command], timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"killed in step {step} (TEST_SEED={seed}):\n{output}"
    assert os.path.exists(tmp_path / "killed")
    assert "(128 + SIGKILL) (attempt 1 of 4); restart 1 of 3" in output, f"TEST_SEED={seed}\n{output}"
    resumes = output.count("resuming in epoch") + output.count("resuming after epoch")
    assert resumes == (1 if step >= 4 else 0), f"TEST_SEED={seed}\n{output}"  # first checkpoint: step 4
    resumed = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]
    assert_equal_runs(resumed, reference("grad"))
