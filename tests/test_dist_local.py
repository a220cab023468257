"""Single-process parts of the distributed runtime: fusion buffers, the local backend, the protocol and
the user helpers without MPI, the failure handler and the stall watchdog."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from engine.distributed import (ParamAverage, ParamSyncSchedule, check_config_consistency,
                                create_communicator, reduce_scores, step_signal)
from engine.distributed.backend import check_reduction
from engine.distributed.fusion import ALIGN_BYTES, FusionBuffers
from engine.distributed.local_backend import LocalCommunicator
from engine.runtime.errors import ConfigError
from helpers import ROOT, child_env

pytestmark = pytest.mark.tf_latest

SHAPES = [(), (0,), (3, 5), (7,), (1,), (0, 4), (100, 3), (33,)]
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.float32]


def sample_arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(s) * 50).astype(d) for s, d in zip(SHAPES, DTYPES)]


@pytest.mark.parametrize("segment_bytes", [1, 24, 64, 100, 4096, 1 << 20])
def test_fusion_packs_every_array_and_walks_contiguous_segments(segment_bytes):
    arrays = sample_arrays()
    segments = []

    def double(segment: np.ndarray) -> None:
        segments.append((segment.dtype, segment.ctypes.data, segment.size))
        with np.errstate(over="ignore"):  # int8 wraps like the expected values; alignment gaps hold garbage
            segment *= 2

    results = FusionBuffers(segment_bytes).run(arrays, double)
    for a, r in zip(arrays, results):
        assert r.dtype == a.dtype and r.shape == a.shape
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(r, (a * 2).astype(a.dtype))
        if r.size:
            assert r.ctypes.data % ALIGN_BYTES == 0  # TensorFlow can wrap it without a copy
    for dtype in {d for d, _, _ in segments}:  # each dtype's segments tile one buffer, in order
        mine = [(p, n) for d, p, n in segments if d == dtype]
        for (p, n), (q, _) in zip(mine, mine[1:]):
            assert q == p + n * np.dtype(dtype).itemsize
        itemsize = np.dtype(dtype).itemsize
        assert all(n * itemsize <= max(segment_bytes, itemsize) for _, n in mine)


def test_fusion_reuses_a_buffer_only_when_no_result_points_into_it():
    fusion = FusionBuffers()
    add_one = lambda segment: segment.__iadd__(1)  # noqa: E731
    first = fusion.run([np.zeros(10, np.float32)], add_one)[0]
    held = [fusion.run([np.full(10, 5, np.float32)], add_one)[0] for _ in range(3)]
    assert (first == 1).all() and all((h == 6).all() for h in held)  # nothing overwritten
    assert len({h.ctypes.data for h in held} | {first.ctypes.data}) == 4
    del first, held
    addresses = {fusion.run([np.ones(10, np.float32)], add_one)[0].ctypes.data for _ in range(5)}
    assert len(addresses) == 1  # dropped results free the pooled buffer
    assert fusion.run([], add_one) == [] and fusion.run([np.zeros((0, 3))], add_one)[0].shape == (0, 3)


def test_reduction_arguments_are_checked():
    check_reduction("sum", [np.int8, np.float16, np.uint64])
    for op, dtypes, words in [("mean", [], "unknown op"), ("average", [np.int32], "floating-point"),
                              ("sum", [np.bool_], "not supported"), ("max", [np.complex64], "not supported")]:
        with pytest.raises(ValueError, match=words):
            check_reduction(op, dtypes)


def test_local_backend_is_rank_0_of_1_and_returns_copies():
    comm = create_communicator("local")
    assert isinstance(comm, LocalCommunicator)
    assert (comm.rank, comm.size, comm.local_rank, comm.local_size, comm.is_main) == (0, 1, 0, 1, True)
    arrays = sample_arrays()
    for op in ("sum", "min", "max"):
        results = comm.allreduce(arrays, op)
        for a, r in zip(arrays, results):
            np.testing.assert_array_equal(r, a)
            assert r is not a and (r.size == 0 or not np.shares_memory(r, a))
    with pytest.raises(ValueError):
        comm.allreduce([np.ones(2, np.int64)], "average")
    assert comm.broadcast_object({"a": 1}) == {"a": 1} and comm.allgather_object(3) == [3]
    assert comm.gather_object(4) == [4] and comm.scatter_object(["only"]) == "only"
    with pytest.raises(ValueError, match="root rank 1"):
        comm.broadcast_object(1, root=1)
    comm.barrier()


def test_local_backend_tensors_and_variables():
    import tensorflow as tf
    comm = create_communicator("local")
    tensors = [tf.constant([1.5, 2.0]), tf.constant([[3]], tf.int64)]
    reduced = tf.function(lambda: comm.allreduce_tensors(tensors, "sum"))()
    assert [r.numpy().tolist() for r in reduced] == [[1.5, 2.0], [[3]]]
    var = tf.Variable([1.0, 2.0])
    comm.broadcast_variables([var])
    assert var.numpy().tolist() == [1.0, 2.0]


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="distributed_backend.*'bogus'"):
        create_communicator("bogus")


def test_protocol_in_a_single_process():
    comm = LocalCommunicator()
    assert step_signal(comm, True, False).all_have_data
    signal = step_signal(comm, False, True, want_param_sync=True)
    assert not signal.all_have_data and signal.any_error and signal.failed_ranks == (0,) and signal.param_sync
    assert reduce_scores(comm, {"loss": 2.5, "frames": 10}) == {"frames": 10.0, "loss": 2.5}
    check_config_consistency(comm, {"learning_rate": 0.1, "f": len})


def test_param_sync_schedule_by_steps_and_by_time():
    steps = ParamSyncSchedule(step_interval=4)
    assert [s for s in range(12) if steps.wants_sync(s)] == [3, 7, 11]
    assert [s for s in range(3) if ParamSyncSchedule().wants_sync(s)] == [0, 1, 2]
    now = [0.0]
    strategy = ParamAverage(LocalCommunicator(), distribution="random_seed_offset",
                            schedule=ParamSyncSchedule(time_diff=5.0, clock=lambda: now[0]))
    due = []
    for step in range(10):
        now[0] = step * 2.0
        if strategy.before_step(step, object(), None).sync_params:
            due.append(step)
    assert due == [3, 6, 9]  # 6 s, 12 s, 18 s: at least 5 s after the previous average
    assert strategy.before_step(10, None, None) is None  # out of data: the epoch ends


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=child_env({"PYTHONPATH": str(ROOT)}), cwd=ROOT)


def test_helpers_work_without_mpi_and_never_import_it():
    result = run_python("""
        import sys
        import numpy as np
        from engine.distributed import helpers as dist
        assert (dist.rank(), dist.size(), dist.local_rank(), dist.is_main_process()) == (0, 1, 0, True)
        post = []
        assert dist.run_on_main(lambda: {"vocab": 3}, post_func=lambda: post.append(1)) == {"vocab": 3}
        assert post == []  # post_func is for the other ranks
        dist.run_on_main(lambda: None, post_func=lambda: post.append(1), run_post_on_main=True)
        assert post == [1]
        assert dist.once_per_node(lambda x: x * 2, 21) == 42
        assert dist.main_process_only(lambda: "main")() == "main"
        assert dist.all_reduce(3) == 3 and isinstance(dist.all_reduce(3), int)
        assert dist.all_reduce(3, "average") == 3.0 and isinstance(dist.all_reduce(3, "average"), float)
        assert dist.all_reduce(np.arange(3)).tolist() == [0, 1, 2]
        assert dist.broadcast_object("x") == "x" and dist.rank_prefixed_message("hi") == "hi"
        dist.barrier()
        try:
            dist.run_on_main(lambda: 1 / 0)
            raise SystemExit("error swallowed")
        except ZeroDivisionError:
            pass
        assert "mpi4py" not in sys.modules and "tensorflow" not in sys.modules, sorted(sys.modules)
        print("helpers ok")
    """)
    assert result.returncode == 0 and "helpers ok" in result.stdout, result.stdout + result.stderr


def test_uncaught_errors_single_process():
    """EngineError: one paragraph, its exit status; anything else: the traceback."""
    engine_error = run_python("""
        from engine.distributed import install_failure_handler
        from engine.runtime.errors import ConfigError
        install_failure_handler()
        raise ConfigError("Config key 'batch_size' is missing; set it to the frames per batch.")
    """)
    assert engine_error.returncode == 1  # Python's status after an excepthook (rnn.py returns exit_code)
    assert engine_error.stderr.strip() == \
        "-c: error: Config key 'batch_size' is missing; set it to the frames per batch."
    bug = run_python("""
        from engine.distributed import install_failure_handler
        install_failure_handler()
        {}["missing"]
    """)
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "KeyError: 'missing'" in bug.stderr


def test_stall_watchdog_ends_the_process():
    start = time.monotonic()
    result = run_python("""
        import time
        from engine.distributed.local_backend import LocalCommunicator
        from engine.distributed.watchdog import StallLimits
        comm = LocalCommunicator(StallLimits(timeout=3))  # above a busy machine's scheduling delays
        with comm.stall_guard("fast"):
            pass
        time.sleep(5)  # outside any guard: no stall
        with comm.stall_guard("gradient reduction"):
            with comm.stall_guard("allreduce"):
                time.sleep(300)
    """, timeout=400)
    assert time.monotonic() - start < 120, result.stderr  # Python's start, 5 s and 3 s; not the 300 s
    assert result.returncode == 1
    assert "'gradient reduction (allreduce)' did not complete within 3 s" in result.stderr, result.stderr
