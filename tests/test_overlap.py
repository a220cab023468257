"""Overlap of the gradient reduction with the backward pass (``distributed_bucket_mb``): the bucket
assignment, the mpi backend's communication thread, the strategy's use of buckets, and real 2-rank jobs
on both backends (results against numpy, training bit-identical to one reduction per step, a failing
rank ending the job)."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from engine.config.loader import Config
from engine.distributed.backend import DoneReduction, check_buckets
from engine.distributed.buckets import HOROVOD_FUSION_ENV, MB, assign_buckets, set_horovod_fusion_threshold
from engine.distributed.comm_thread import ReductionThread
from engine.distributed.fusion import SEGMENT_BYTES, FusionBuffers
from engine.distributed.settings import DataParallelSettings
from engine.runtime.errors import ConfigError, DistributedError
from helpers import ROOT, run_mpi

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "overlap_checks.py")
TRAIN = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")
# The mpi backend also runs on the newest TensorFlow; Horovod exists only in the TF 2.15 environment.
BACKENDS = [pytest.param("mpi", marks=pytest.mark.tf_latest), "horovod"]


# ----- bucket assignment -----
@pytest.mark.tf_latest
def test_buckets_walk_the_tensors_from_last_to_first_and_close_at_the_cap():
    sizes = [4 * MB, 1 * MB, 2 * MB, 3 * MB, 1 * MB]
    assert assign_buckets(sizes, 4) == [[4, 3], [2, 1], [0]]
    assert assign_buckets(sizes, 1000) == [[4, 3, 2, 1, 0]]
    assert assign_buckets(sizes, 0) == [[4, 3, 2, 1, 0]]  # 0: one reduction after the backward pass


@pytest.mark.tf_latest
def test_a_first_bucket_of_its_own_size_and_oversized_tensors_alone():
    sizes = [10 * MB, 0.5 * MB, 0.5 * MB, 0.5 * MB, 30 * MB, 0.25 * MB]
    assert assign_buckets(sizes, 25, first_mb=1) == [[5], [4], [3, 2, 1, 0]]  # 30 MB: a bucket alone
    assert assign_buckets(sizes, 25, first_mb=40) == [[5, 4, 3, 2, 1], [0]]
    assert assign_buckets(sizes, 25) == [[5], [4], [3, 2, 1, 0]]
    assert assign_buckets([], 25) == []
    with pytest.raises(ValueError):
        assign_buckets(sizes, -1)


@pytest.mark.tf_latest
def test_every_tensor_in_exactly_one_bucket_and_the_same_on_every_call():
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = list(rng.integers(0, 3 * MB, rng.integers(1, 40)))
        cap, first = float(rng.uniform(0.1, 5)), float(rng.uniform(0.05, 2))
        buckets = assign_buckets(sizes, cap, first)
        check_buckets(len(sizes), buckets)  # raises otherwise
        assert [i for b in buckets for i in b] == list(range(len(sizes)))[::-1]
        for k, bucket in enumerate(buckets):  # over the cap only as a single tensor
            limit = (first if k == 0 else cap) * MB
            assert len(bucket) == 1 or sum(sizes[i] for i in bucket) <= limit
        assert assign_buckets(sizes, cap, first) == buckets
    with pytest.raises(ValueError, match="exactly once"):
        check_buckets(3, [[2, 1], [1, 0]])


@pytest.mark.tf_latest
def test_horovod_fusion_threshold_follows_the_bucket_size_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv(HOROVOD_FUSION_ENV, raising=False)
    set_horovod_fusion_threshold(0)
    assert HOROVOD_FUSION_ENV not in os.environ
    set_horovod_fusion_threshold(2.5)
    assert os.environ[HOROVOD_FUSION_ENV] == "2500000"
    monkeypatch.setenv(HOROVOD_FUSION_ENV, "123")
    set_horovod_fusion_threshold(25)
    assert os.environ[HOROVOD_FUSION_ENV] == "123"


# ----- the key -----
@pytest.mark.tf_latest
@pytest.mark.parametrize("value", [-1, "-0.5", "big", float("inf"), float("nan")])
def test_a_bad_bucket_size_is_a_config_error_naming_the_key(value):
    with pytest.raises(ConfigError, match="distributed_bucket_mb"):
        DataParallelSettings.from_config(Config({"use_horovod": True, "distributed_bucket_mb": value}))


@pytest.mark.tf_latest
def test_the_bucket_size_is_read_in_mb():
    settings = DataParallelSettings.from_config(Config({"use_horovod": True, "distributed_bucket_mb": "0.5"}))
    assert settings.bucket_mb == 0.5
    assert DataParallelSettings.from_config(Config({"use_horovod": True})).bucket_mb > 0  # the default


# ----- the communication thread, with a stand-in for MPI -----
class FakeComm:
    """Allreduce of 2 ranks whose other rank sends the same values: the sum doubles each element."""

    def __init__(self, fail_on_call: int = -1, delay: float = 0.0) -> None:
        self.calls, self.fail_on_call, self.delay = 0, fail_on_call, delay
        self.threads: set[str] = set()

    def Get_size(self) -> int:
        return 2

    def Allreduce(self, in_place, segment, op) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("MPI_ERR_TRUNCATE: message truncated")
        time.sleep(self.delay)
        segment *= 2


def thread_for(comm: FakeComm, watched: list) -> ReductionThread:
    import contextlib

    @contextlib.contextmanager
    def collective(name):
        watched.append(name)
        yield

    return ReductionThread(comm, {"sum": "SUM", "average": "SUM"}, None, collective)


@pytest.mark.tf_latest
def test_the_thread_reduces_copies_in_segments_while_the_caller_goes_on():
    comm, watched = FakeComm(delay=0.05), []
    reducer = thread_for(comm, watched)
    big = np.arange(SEGMENT_BYTES // 4 * 2 + 3, dtype=np.float32)  # 3 segments
    small = np.array([1.5, -2.0], np.float64)
    job = reducer.start([big, small], "average", label="gradient allreduce (bucket 1 of 1)",
                        watched_as="allreduce in a tf.function")
    big[:] = -1  # the caller may reuse its arrays at once
    assert not job.done()  # the thread still sleeps in the first segment
    results = job.wait()
    np.testing.assert_array_equal(results[0], np.arange(big.size, dtype=np.float32))  # 2x / 2 ranks
    np.testing.assert_array_equal(results[1], small)
    assert comm.calls == 4 and comm.threads == {"allreduce-thread"}
    assert watched == ["allreduce in a tf.function"]  # the stall watchdog sees the thread's wait
    assert job.reduce_seconds >= 0.15 and job.waited_seconds > 0
    assert all(r.ctypes.data % 64 == 0 for r in results)  # TensorFlow wraps them without a copy


@pytest.mark.tf_latest
def test_an_error_in_the_thread_fails_the_wait_with_a_clear_message_and_the_thread_goes_on():
    reducer = thread_for(FakeComm(fail_on_call=1), [])
    failed = reducer.start([np.ones(3, np.float32)], "sum", label="gradient allreduce (bucket 2 of 3)")
    later = reducer.start([np.ones(3, np.float32)], "sum")
    with pytest.raises(DistributedError, match=r"gradient allreduce \(bucket 2 of 3\) failed in the "
                                               r"communication thread: RuntimeError: MPI_ERR_TRUNCATE"):
        failed.wait()
    np.testing.assert_array_equal(later.wait()[0], [2, 2, 2])


@pytest.mark.tf_latest
def test_pack_copies_into_aligned_buffers_per_dtype():
    arrays = [np.arange(5, dtype=np.float32), np.arange(3, dtype=np.int64).reshape(3, 1),
              np.zeros((0,), np.float32), np.full((), 7, np.float32)]
    buffers, results = FusionBuffers().pack(arrays)
    assert [b.dtype for b in buffers] == [np.float32, np.int64]
    for got, want in zip(results, arrays):
        assert got.shape == want.shape and np.array_equal(got, want)
        assert got.size == 0 or got.ctypes.data % 64 == 0
    assert [s.size for s in FusionBuffers.segments(np.zeros(10, np.float32), 16)] == [4, 4, 2]


# ----- the strategy and the default implementation -----
@pytest.mark.tf_latest
def test_grad_mode_reduces_in_buckets_with_the_scores_in_the_first():
    import tensorflow as tf

    from engine.distributed.local_backend import LocalCommunicator
    from engine.distributed.strategy import GradAllreduce

    class Recording(LocalCommunicator):
        size = 2
        calls: list = []

        def allreduce_tensor_buckets(self, tensors, buckets, op="sum", *, timed_as=None, wire=None):
            self.calls.append(([int(t.shape.num_elements()) for t in tensors], buckets))
            return super().allreduce_tensor_buckets(tensors, buckets, op, timed_as=timed_as, wire=wire)

    comm = Recording()
    grads = [tf.ones([249_000]), tf.ones([10]), tf.ones([300_000]), tf.ones([5])]  # bytes: 996k, 40, 1.2M, 20
    scores = tf.constant([1.0, 2.0, 3.0, 4.0])
    strategy = GradAllreduce(comm, normalization="average", bucket_mb=1.0)
    reduced, reduced_scores = strategy.reduce_gradients(grads, scores)
    assert comm.calls == [([249_000, 10, 300_000, 5, 4], [[3, 4], [2], [1, 0]])]
    for got, want in zip(reduced, grads):
        np.testing.assert_array_equal(got.numpy(), want.numpy() / 2)  # the local sum, averaged over 2
    np.testing.assert_array_equal(reduced_scores.numpy(), scores.numpy())
    comm.calls.clear()
    GradAllreduce(comm, bucket_mb=0.0).reduce_gradients(grads, scores)
    assert comm.calls == []  # 0: the single fused reduction of before


@pytest.mark.tf_latest
def test_start_allreduce_without_a_thread_is_done_at_once():
    from engine.distributed.local_backend import LocalCommunicator

    handle = LocalCommunicator().start_allreduce([np.arange(3.0)], "average")
    assert isinstance(handle, DoneReduction) and handle.done()
    np.testing.assert_array_equal(handle.wait()[0], np.arange(3.0))


# ----- real 2-rank jobs -----
@pytest.mark.tf_latest_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_bucketed_reductions_equal_numpy_then_a_rank_failing_between_its_buckets_ends_the_job(backend):
    start = time.monotonic()
    result = run_mpi(2, [SCRIPT, "--backend", backend, "--fail-mid-step"], timeout=240)
    output = result.stdout + result.stderr
    assert result.stdout.count(f"overlap checks passed (10 checks, {backend} backend)") == 2, output
    assert result.returncode != 0, output
    assert "RuntimeError: boom: injected failure in the backward pass of rank 1" in output, output
    assert "MPI_ABORT was invoked on rank 1" in output, output
    assert time.monotonic() - start < 200, output  # ended by the failure, not the 300 s stall watchdog


NETWORK = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 8},
           "hidden": {"class": "linear", "activation": "tanh", "n_out": 12, "from": "lstm"},
           "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}


def train_two_ranks(tmp_path, *runs: dict) -> list[list[dict]]:
    """The trainings one after the other in one 2-rank job (each with ``runs[k]`` over the base config);
    per run, each rank's record."""
    base = {"train": {"class": "DummyDataset", "input_dim": 5, "output_dim": 3, "num_seqs": 16,
                      "seq_len": 10, "fixed_random_seed": 7},
            "network": NETWORK, "optimizer": {"class": "adam"}, "learning_rate": 0.01, "batch_size": 20,
            "num_epochs": 1, "log_verbosity": 2, "random_seed": 3, "use_horovod": True}
    result = run_mpi(2, [TRAIN, str(tmp_path), repr([{**base, **run} for run in runs])], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    return [[dict(np.load(tmp_path / f"run{k}" / f"rank{r}.npz")) for r in range(2)]
            for k in range(len(runs))]


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_training_with_buckets_is_bit_identical_to_one_reduction_per_step(tmp_path, backend):
    # 0.0005 MB: the 8-unit LSTM's and the layers' 500-1000 byte tensors make several buckets
    bucketed, single = train_two_ranks(
        tmp_path, {"distributed_backend": backend, "distributed_bucket_mb": 0.0005},
        {"distributed_backend": backend, "distributed_bucket_mb": 0})
    assert bucketed[0]["num_steps"] == single[0]["num_steps"] == 4
    assert not np.array_equal(single[0]["params"], single[0]["after_step"][0])  # it did train
    for rank in range(2):
        np.testing.assert_array_equal(bucketed[rank]["after_step"], single[rank]["after_step"])
        np.testing.assert_array_equal(bucketed[rank]["params"], single[0]["params"])


@pytest.mark.tf_latest_mpi
@pytest.mark.tf_latest
@pytest.mark.mpi
def test_a_failing_rank_in_bucketed_training_ends_the_job(tmp_path):
    config = {"train": {"class": "DummyDataset", "input_dim": 5, "output_dim": 3, "num_seqs": 16,
                        "seq_len": 10},
              "network": NETWORK, "batch_size": 20, "num_epochs": 1, "log_verbosity": 2, "use_horovod": True,
              "distributed_backend": "mpi", "distributed_bucket_mb": 0.0005}
    start = time.monotonic()
    result = run_mpi(2, [TRAIN, str(tmp_path), repr(config), "fail=step", "fail_rank=1", "fail_step=2"],
                     timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert output.count("RuntimeError: injected failure in train step 2 on rank 1") == 1, output
    assert time.monotonic() - start < 200, output  # ended by the failure, not the 300 s stall watchdog
