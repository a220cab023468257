"""Mid-epoch checkpoints and exact resume with real 2-rank mpirun jobs: a run stopped by a signal on one
rank (exit 99, one line saying why, a checkpoint) and started again ends with parameters bitwise equal to
an uninterrupted run, in grad and in param mode; dropout, Adam's state, newbob's learning-rate history and
the data position all survive the stop."""
from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import ROOT, run_mpi

pytestmark = pytest.mark.mpi
SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")

NETWORK = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 8, "dropout": 0.2},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm", "dropout": 0.1}}


def config(tmp_path, **overrides) -> dict:
    values = {
        "train": {"class": "Task12AXDataset", "num_seqs": 48, "fixed_random_seed": 1, "seq_ordering": "random"},
        "dev": {"class": "Task12AXDataset", "num_seqs": 8, "fixed_random_seed": 2},
        "network": NETWORK, "optimizer": {"class": "adam"}, "learning_rate": 0.02,
        "learning_rate_control": "newbob", "newbob_relative_error_threshold": 0.5,  # decays every epoch
        "learning_rate_file": str(tmp_path / "lr.txt"), "model": str(tmp_path / "net"),
        "batch_size": 300, "max_seqs": 4, "num_epochs": 3, "log_verbosity": 3, "random_seed": 5,
        "use_horovod": True, "distributed_backend": "mpi", "checkpoint_interval": 4,
    }
    values.update(overrides)
    return values


def train(out, values: dict, *options: str, expect: int = 0):
    out.mkdir(exist_ok=True)
    result = run_mpi(2, [SCRIPT, str(out), repr(values), *options], timeout=240)
    assert result.returncode == expect, result.stdout + result.stderr
    if expect:
        return None, result.stdout + result.stderr
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(2)], result.stdout + result.stderr


def assert_bitwise_equal(resumed, reference) -> None:
    for rank in range(2):
        np.testing.assert_array_equal(resumed[rank]["params"], reference[rank]["params"])


@pytest.mark.parametrize("mode", [pytest.param({}, id="grad"),
                                  pytest.param({"horovod_reduce_type": "param", "horovod_param_sync_step": 3},
                                               id="param")])
def test_a_run_stopped_by_a_signal_on_one_rank_resumes_bitwise_equal(tmp_path, mode):
    reference, _ = train(tmp_path / "reference", config(tmp_path / "reference", **mode))
    assert not np.array_equal(reference[0]["params"], reference[0]["after_step"][0])  # it trained

    values = config(tmp_path / "stopped", **mode)
    # rank 1 gets SIGUSR1 in its 10th step (6 per epoch): all ranks save before the next one and exit 99
    _, output = train(tmp_path / "stopped", values, "fail=SIGUSR1", "fail_rank=1", "fail_step=9", expect=99)
    lines = [line for line in output.splitlines() if "stopping on request" in line]
    assert len(lines) == 1, output
    assert "SIGUSR1 received by rank 1; saved checkpoint" in lines[0] and "net.002.step" in lines[0], output
    names = sorted(os.listdir(tmp_path / "stopped"))
    assert [n for n in names if ".step" in n] == [lines[0].split("saved checkpoint ")[1].split(" ")[0]
                                                  .rsplit("/", 1)[1]], names  # older ones were removed

    resumed, output = train(tmp_path / "stopped", values)
    assert "train epoch 2: continuing after step 4 (8 batches of the epoch's plan done)" in output, output
    assert_bitwise_equal(resumed, reference)


def test_rso_probe(tmp_path):
    mode = {"horovod_reduce_type": "param", "horovod_dataset_distribution": "random_seed_offset",
            "horovod_param_sync_step": 100}
    reference, _ = train(tmp_path / "reference", config(tmp_path / "reference", **mode))
    values = config(tmp_path / "stopped", **mode)
    _, output = train(tmp_path / "stopped", values, "fail=SIGUSR2", "fail_rank=1", "fail_step=9", expect=99)
    print(output)
    resumed, output = train(tmp_path / "stopped", values)
    print(output)
    assert_bitwise_equal(resumed, reference)
