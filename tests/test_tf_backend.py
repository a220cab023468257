"""The tf backend (TensorFlow's collective ops, ``distributed_backend = "tf"``) in real mpirun jobs on the
CPU: exact collectives in 2 and 3 ranks, training equal to the mpi backend, a failing rank ending the job.
Also in the newest-TensorFlow environment, where it is the only backend that reduces inside TensorFlow
without Horovod. Few launches, each checking much: every launch pays TensorFlow's start-up per rank."""
from __future__ import annotations

import time

import numpy as np
import pytest

from helpers import ROOT, engine_errors, run_mpi

MPIRUN = [pytest.mark.mpi, pytest.mark.tf_latest, pytest.mark.tf_latest_mpi, pytest.mark.slow]

SCRIPTS = ROOT / "tests" / "mpi_scripts"

NETWORK = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 8},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}


def config(**overrides) -> dict:
    base = {"train": {"class": "DummyDataset", "input_dim": 5, "output_dim": 3, "num_seqs": 24, "seq_len": 10,
                      "fixed_random_seed": 7},
            "network": NETWORK, "optimizer": {"class": "sgd"}, "learning_rate": 0.5, "batch_size": 40,
            "num_epochs": 1, "log_verbosity": 2, "random_seed": 3, "use_horovod": True}
    return {**base, **overrides}


def mpirun_test(test):
    for mark in MPIRUN:
        test = mark(test)
    return test


def test_auto_takes_the_tf_backend_on_gpus_without_horovod(monkeypatch):
    import tensorflow as tf

    from engine.distributed import select

    missing = "ModuleNotFoundError: No module named 'horovod'"
    gpus = lambda kind=None: ["GPU:0"] if kind == "GPU" else []  # noqa: E731
    monkeypatch.setattr(tf.config, "list_physical_devices", gpus)
    monkeypatch.setattr(select, "horovod_import_error", lambda: missing)
    assert select.auto_backend("") == ("tf", f"training on GPUs, but Horovod does not import ({missing})")
    assert select.auto_backend("cpu")[0] == "mpi"  # the GPUs hidden by the config: the CPU's backend


def test_the_ring_for_gpu_tensors_is_the_tf_backends_alone():
    from engine.config.loader import Config
    from engine.distributed.settings import DataParallelSettings
    from engine.runtime.errors import ConfigError

    def settings(**keys):
        return DataParallelSettings.from_config(Config({"use_horovod": True, **keys}))

    assert settings(distributed_backend="tf", distributed_tf_gpu_reduction="ring").tf_gpu_reduction == "ring"
    assert settings(distributed_backend="mpi").tf_gpu_reduction == "nccl"
    with pytest.raises(ConfigError, match="'distributed_tf_gpu_reduction' = 'ring' only applies to "
                                          "distributed_backend = 'tf', but distributed_backend is 'auto'"):
        settings(distributed_tf_gpu_reduction="ring")
    with pytest.raises(ConfigError, match="distributed_tf_gpu_reduction"):
        settings(distributed_backend="tf", distributed_tf_gpu_reduction="gloo")


# two signatures of the tf backend's form (device kind, dtype, length, op) whose keys collide
COLLIDING = (("CPU", "float32", 10758, "Add"), ("CPU", "float32", 15405165, "Add"))


def test_instance_keys_are_the_crc_whatever_the_order_and_a_collision_takes_the_next_free_key():
    import zlib

    from engine.distributed.tf_backend import InstanceKeys

    def crc_key(signature):
        return 1 + zlib.crc32(repr(signature).encode()) % 0x7FFFFFF0

    others = [("CPU", "float32", n, "Add") for n in (5, 17, 1000)] + [("GPU", "float16", 5, "Max")]
    forward, backward = InstanceKeys(), InstanceKeys()
    keys_forward = {s: forward.key(s) for s in others}
    keys_backward = {s: backward.key(s) for s in reversed(others)}
    assert keys_forward == keys_backward == {s: crc_key(s) for s in others}
    assert forward.key(others[0]) == keys_forward[others[0]]  # met again (a retrace): the same key

    first, second = COLLIDING
    assert crc_key(first) == crc_key(second)
    keys = InstanceKeys()
    assert (keys.key(first), keys.key(second)) == (crc_key(first), crc_key(first) + 1)
    keys = InstanceKeys()  # the order decides which of the two moves
    assert (keys.key(second), keys.key(first)) == (crc_key(first), crc_key(first) + 1)


def assert_collectives_exact(output: str, stdout: str, ranks: int) -> None:
    """Sums, min, max and averages of every dtype, fused, eager and in tf.function, against closed-form
    results; against the mpi backend bit for bit (2 ranks) or to rounding (3); broadcasts, objects, the
    step protocol; with 2 ranks also fp16/bf16 on the wire against numpy references."""
    assert f"using the tf backend (distributed_backend = 'tf'); {ranks} ranks" in output
    assert "tf backend: CPU tensors reduced by RING, GPU tensors by NCCL" in output
    for rank in range(ranks):
        assert f"rank {rank}: 13 checks passed (tf backend, {ranks} ranks)" in stdout, output
        if ranks == 2:
            assert f"rank {rank}: 154 wire checks passed (tf)" in stdout, output


# Each job first checks the collectives (tests/mpi_scripts/tf_backend_checks.py), then trains in the same
# processes (train_runs.py): one TensorFlow start-up and one tf cluster per rank for both.
@mpirun_test
def test_collectives_exact_then_training_equals_the_mpi_backend_and_a_failing_rank_ends_the_job(tmp_path):
    """grad mode (in small buckets) and param mode with fp16 on the wire train to the same parameters
    as with the mpi backend (bit for bit: 2 ranks add in one order); then rank 1 fails in a tf-backend
    run and the job ends with its message instead of hanging."""
    param = {"horovod_reduce_type": "param", "horovod_param_sync_step": 2, "distributed_wire_format": "fp16"}
    # the first also with the ring for GPU tensors (ranks sharing a GPU): the key passes, the CPU's math stays
    runs = [config(distributed_backend="tf", distributed_bucket_mb=0.0005,  # a bucket per tensor or two
                   distributed_tf_gpu_reduction="ring"),
            config(distributed_backend="tf", **param),
            config(distributed_backend="mpi"),
            config(distributed_backend="mpi", **param),
            config(distributed_backend="tf")]
    start = time.monotonic()
    args = [str(SCRIPTS / "tf_backend_checks.py"), str(tmp_path), repr(runs), "fail_rank=1", "fail_run=4"]
    result = run_mpi(2, args, timeout=300)
    output = result.stdout + result.stderr
    assert_collectives_exact(output, result.stdout, 2)
    assert result.returncode != 0, output
    assert output.count("RuntimeError: injected failure in train step 1 on rank 1") == 1, output
    assert "[rank 1] Traceback (most recent call last):" in output
    assert "MPI_ABORT was invoked on rank 1" in output
    assert time.monotonic() - start < 270  # ended by the failure handling, not by the test's timeout
    params = [[np.load(tmp_path / f"run{k}_rank{r}.npy") for r in (0, 1)] for k in range(4)]
    for k, (rank0, rank1) in enumerate(params):
        np.testing.assert_array_equal(rank0, rank1, err_msg=f"run {k}: the ranks differ")
    tf_grad, tf_param, mpi_grad, mpi_param = (p[0] for p in params)
    np.testing.assert_array_equal(tf_grad, mpi_grad)
    np.testing.assert_array_equal(tf_param, mpi_param)
    assert not np.allclose(tf_grad, tf_param)  # the runs differ: each was its own training


@mpirun_test
@pytest.mark.newest_tf_only  # TensorFlow 2.15 runs the tf backend's 2-rank test above; 3 ranks cost 2 minutes
def test_collectives_exact_then_three_ranks_train_as_with_the_mpi_backend(tmp_path):
    """3 ranks in grad and param mode: the tf backend's ring adds the three parts in another order than
    MPI's reduction, so the trainings agree to float rounding, and within each run the ranks bit for bit."""
    param = {"horovod_reduce_type": "param", "horovod_param_sync_step": 2}
    runs = [config(distributed_backend="tf"), config(distributed_backend="tf", **param),
            config(distributed_backend="mpi"), config(distributed_backend="mpi", **param)]
    result = run_mpi(3, [str(SCRIPTS / "tf_backend_checks.py"), str(tmp_path), repr(runs)], timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert_collectives_exact(output, result.stdout, 3)
    params = [[np.load(tmp_path / f"run{k}_rank{r}.npy") for r in range(3)] for k in range(4)]
    for k, ranks in enumerate(params):
        for other in ranks[1:]:
            np.testing.assert_array_equal(ranks[0], other, err_msg=f"run {k}: the ranks differ")
    tf_grad, tf_param, mpi_grad, mpi_param = (p[0] for p in params)
    np.testing.assert_allclose(tf_grad, mpi_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf_param, mpi_param, rtol=1e-5, atol=1e-6)
    assert not np.allclose(tf_grad, tf_param)  # the runs differ: each was its own training


@mpirun_test
def test_a_rank_that_stops_answering_inside_a_tf_function_is_named():
    """The stall watchdog sees the wait inside TensorFlow's collective (no Python runs there) and ends
    the job with the message of the other backends."""
    args = [str(SCRIPTS / "dist_failure.py"), "stall_in_graph", "--backend", "tf", "--stall-timeout", "3"]
    start = time.monotonic()
    result = run_mpi(2, args, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert engine_errors(output) == 1, output
    assert ("[rank 0] error: rank 1 did not reach collective #2 'allreduce in a tf.function' within 3 s"
            in output), output
    assert time.monotonic() - start < 90, output
