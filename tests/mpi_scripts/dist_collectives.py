"""Run under ``mpirun -np N``: exact-result checks of one backend's collectives, of the step protocol and
of the user helpers. Any failed check raises, and the failure handler aborts the whole job; at the end
every rank prints ``rank R: K checks passed``.

    python dist_collectives.py --backend mpi [--no-tf] [--compare-with mpi]
"""
from __future__ import annotations

import argparse
import socket

import numpy as np

from engine.distributed import (ParamAverage, ParamSyncSchedule, StallLimits, auto_backend, broadcast_initial,
                                check_config_consistency, create_communicator, helpers,
                                install_failure_handler, reduce_scores, step_signal)
from engine.runtime import process
from engine.runtime.errors import ConfigError, DistributedError

SHAPES = [(), (0,), (3, 0), (7,), (5, 3), (1000,), (333, 17), (300_007,)] + [(1 + i % 5,) for i in range(60)]
ALL_DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8]
FLOAT_DTYPES = [np.float32, np.float64, np.float16]


def case(dtypes: list) -> list[tuple[tuple, type]]:
    """Shapes paired with dtypes, interleaved so that every dtype group has odd gaps and sizes."""
    return [(shape, dtypes[i % len(dtypes)]) for i, shape in enumerate(SHAPES)]


def base(shape: tuple, dtype: type) -> np.ndarray:
    return (np.arange(int(np.prod(shape))) % 11).reshape(shape).astype(dtype)


def contribution(shape: tuple, dtype: type, rank: int) -> np.ndarray:
    """Rank r sends base * (r + 1) + r: every exact result below has a closed form."""
    return (base(shape, dtype) * (rank + 1) + rank).astype(dtype)


def expected(shape: tuple, dtype: type, op: str, size: int) -> np.ndarray:
    b = base(shape, np.float64)
    s, t = size * (size + 1) // 2, size * (size - 1) // 2
    value = {"sum": b * s + t, "average": (b * s + t) / size, "min": b, "max": b * size + size - 1}[op]
    return value.astype(dtype)


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    assert np.array_equal(got, want), f"{what}: values differ, first: {got.ravel()[:5]} vs {want.ravel()[:5]}"


def check_identity(comm) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    assert (comm.rank, comm.size) == (world.Get_rank(), world.Get_size()), "rank/size disagree with MPI"
    assert 0 <= comm.local_rank < comm.local_size <= comm.size
    hosts = comm.allgather_object(socket.gethostname())
    ranks_here = [r for r, host in enumerate(hosts) if host == socket.gethostname()]
    assert comm.local_size == len(ranks_here) and comm.local_rank == ranks_here.index(comm.rank)


def check_allreduce(comm) -> None:
    for op in ("sum", "min", "max", "average"):
        cases = case(FLOAT_DTYPES if op == "average" else ALL_DTYPES)
        got = comm.allreduce([contribution(s, d, comm.rank) for s, d in cases], op)
        assert len(got) == len(cases)
        for (shape, dtype), result in zip(cases, got):
            want = expected(shape, dtype, op, comm.size)
            assert_same(result, want, f"allreduce {op} {dtype.__name__}{shape}")
    assert comm.allreduce([], "sum") == []
    try:
        comm.allreduce([np.ones(3, np.int32)], "average")
        raise AssertionError("average of int32 was accepted")
    except ValueError:
        pass


def check_results_stay_valid(comm) -> None:
    """A second call must not overwrite the results of the first (the fusion buffer is reused)."""
    first = comm.allreduce([np.full(10, comm.rank + 1.0, np.float32)], "sum")
    second = comm.allreduce([np.full(10, 100.0, np.float32)], "sum")
    assert first[0][0] == comm.size * (comm.size + 1) / 2 and second[0][0] == 100.0 * comm.size
    del first, second
    for _ in range(3):  # and results that are dropped free the buffer for reuse
        (again,) = comm.allreduce([np.ones(10, np.float32)], "sum")
        assert again[0] == comm.size


def check_allreduce_tensors(comm) -> None:
    import tensorflow as tf

    for op in ("sum", "max", "average"):
        cases = case(FLOAT_DTYPES if op == "average" else ALL_DTYPES)
        inputs = [tf.constant(contribution(s, d, comm.rank)) for s, d in cases]
        graph = tf.function(lambda *ts, op=op: comm.allreduce_tensors(list(ts), op))
        for mode, results in (("tf.function", graph(*inputs)), ("eager", comm.allreduce_tensors(inputs, op))):
            for (shape, dtype), result in zip(cases, results):
                assert result.shape == shape, f"{mode} {op}: shape {result.shape} != {shape}"
                want = expected(shape, dtype, op, comm.size)
                assert_same(result.numpy(), want, f"{mode} {op} {dtype.__name__}{shape}")


def check_broadcast(comm) -> None:
    import tensorflow as tf

    for root in (0, comm.size - 1):
        cases = case(ALL_DTYPES)[:12]
        variables = [tf.Variable(contribution(s, d, comm.rank)) for s, d in cases]
        comm.broadcast_variables(variables, root=root)
        for (shape, dtype), var in zip(cases, variables):
            assert_same(var.numpy(), contribution(shape, dtype, root), f"broadcast_variables root {root}")
    variables = [tf.Variable(np.full((4, 3), comm.rank, np.float32))]
    broadcast_initial(comm, variables)
    assert (variables[0].numpy() == 0).all()


def check_objects(comm) -> None:
    obj = comm.broadcast_object({"from": comm.rank, "data": list(range(comm.rank + 3))}, root=comm.size - 1)
    assert obj == {"from": comm.size - 1, "data": list(range(comm.size + 2))}
    assert comm.allgather_object(("rank", comm.rank)) == [("rank", r) for r in range(comm.size)]
    root = comm.size - 1
    gathered = comm.gather_object({"rank": comm.rank}, root=root)
    assert gathered == ([{"rank": r} for r in range(comm.size)] if comm.rank == root else None), gathered
    parts = [f"part {r}" for r in range(comm.size)] if comm.rank == root else None
    assert comm.scatter_object(parts, root=root) == f"part {comm.rank}"
    comm.barrier()


def check_step_signal(comm) -> None:
    last = comm.size - 1
    sig = step_signal(comm, have_more_data=True, had_error=False)
    assert sig.all_have_data and not sig.any_error and sig.failed_ranks == () and not sig.param_sync
    sig = step_signal(comm, have_more_data=comm.rank != last, had_error=False)
    assert not sig.all_have_data and not sig.any_error, "one rank out of data must stop all"
    sig = step_signal(comm, have_more_data=True, had_error=comm.rank in (0, last),
                      want_param_sync=comm.rank == last)
    assert sig.any_error and sig.failed_ranks == tuple(sorted({0, last}))
    assert sig.param_sync and sig.all_have_data and not sig.checkpoint and sig.stop_requests == ()
    sig = step_signal(comm, have_more_data=True, had_error=3 if comm.rank == last else 0)
    assert sig.failed_ranks == (last,) and sig.exit_code == 3, "the failing rank's exit code reaches all"
    # one rank's clock says a checkpoint is due, another got SIGUSR2 (12): every rank learns both
    sig = step_signal(comm, have_more_data=True, had_error=False, want_checkpoint=comm.rank == 0,
                      stop_signal=12 if comm.rank == last else 0)
    assert sig.checkpoint and sig.stop_requests == ((last, 12),) and not sig.any_error
    batches, steps = iter(range(5 + 2 * comm.rank)), 0  # rank 0 runs out first, after 5 batches
    while step_signal(comm, have_more_data=next(batches, None) is not None, had_error=False).all_have_data:
        steps += 1
    assert comm.allgather_object(steps) == [5] * comm.size, "all ranks must end the epoch together"


def param_sync_steps(comm, distribution: str) -> list[int]:
    """Steps after which ParamAverage's plan says "average", with 8 batches per rank and a time-based
    schedule whose clocks run at different speeds: rank r passes 10 s at step ceil(10 / (2 + r))."""
    fake_time = [0.0]
    strategy = ParamAverage(comm, distribution=distribution,
                            schedule=ParamSyncSchedule(time_diff=10.0, clock=lambda: fake_time[0]))
    synced_at, step = [], 0
    while True:
        fake_time[0] = step * (2.0 + comm.rank)
        plan = strategy.before_step(step, object() if step < 8 else None, None)
        if plan is None:
            return synced_at
        if plan.sync_params:
            synced_at.append(step)
        step += 1


def check_param_sync_agreement(comm) -> None:
    """shard: the ranks' votes travel in the per-step signal, and all average at the first vote.
    random_seed_offset: no per-step signal; each rank averages at its own vote, where the others meet it
    (or end the epoch), so every rank averages equally often."""
    everyone = comm.allgather_object(param_sync_steps(comm, "shard"))
    assert all(s == everyone[0] for s in everyone), f"ranks synced at different steps: {everyone}"
    assert everyone[0][0] == -(-10 // (comm.size + 1)), everyone  # the fastest clock decides
    own = comm.allgather_object(param_sync_steps(comm, "random_seed_offset"))
    assert len({len(s) for s in own}) == 1, f"ranks averaged a different number of times: {own}"
    assert own[0][0] == 5 and own[-1][0] == -(-10 // (comm.size + 1)), own  # each at its own clock
    by_step = ParamSyncSchedule(step_interval=3)
    assert [s for s in range(9) if by_step.wants_sync(s)] == [2, 5, 8]


def check_scores(comm) -> None:
    total = reduce_scores(comm, {"loss": 0.5 * (comm.rank + 1), "frames": 100 + comm.rank, "errors": 3})
    size = comm.size
    assert total == {"loss": 0.5 * size * (size + 1) / 2, "frames": 100 * size + size * (size - 1) / 2,
                     "errors": 3 * size}
    if size > 1:
        try:
            reduce_scores(comm, {"loss": 1.0, ("frames" if comm.rank == 0 else "frame"): 1.0})
            raise AssertionError("different score keys were summed")
        except DistributedError as exc:
            assert exc.agreed and "different score names" in str(exc)


def check_config_check(comm) -> None:
    same = {"learning_rate": 0.01, "network": {"out": {"class": "softmax", "from": ["a", "b"]}},
            "func": lambda x: x + 1, "obj": object()}
    check_config_consistency(comm, same)
    if comm.size == 1:
        return
    differing = dict(same, learning_rate=0.01 * (comm.rank + 1), batch_size=5000)
    if comm.rank == 1:
        differing["only_on_rank_1"] = True
        del differing["batch_size"]
    try:
        check_config_consistency(comm, differing)
        raise AssertionError("config mismatch not detected")
    except ConfigError as exc:
        text = str(exc)
        assert exc.agreed and exc.quiet == (comm.rank != 0)
        for key in ("'learning_rate'", "'only_on_rank_1'", "'batch_size'"):
            assert key in text, f"{key} missing from: {text}"
        assert "'network'" not in text and "'func'" not in text and "'obj'" not in text, text
        assert "rank 0: 0.01" in text and "(not set)" in text, text


def check_helpers(comm) -> None:
    assert (helpers.rank(), helpers.size(), helpers.local_rank()) == (comm.rank, comm.size, comm.local_rank)
    assert helpers.is_main_process() == (comm.rank == 0)
    post_calls = []
    result = helpers.run_on_main(lambda: {"built_by": helpers.rank()}, post_func=lambda: post_calls.append(1))
    assert result == {"built_by": 0} and len(post_calls) == (0 if comm.rank == 0 else 1)

    def failing() -> None:
        raise OSError("disk full while preparing data")

    try:
        helpers.run_on_main(failing)
        raise AssertionError("run_on_main swallowed the error")
    except OSError as exc:
        assert comm.rank == 0 and exc.agreed
    except DistributedError as exc:
        assert comm.rank > 0 and exc.quiet and exc.agreed and "disk full" in str(exc)
    node_result = helpers.once_per_node(lambda: ("prepared by", helpers.rank()))
    assert node_result == ("prepared by", comm.rank - comm.local_rank) or comm.local_size != comm.size
    assert helpers.all_reduce(comm.rank + 1) == comm.size * (comm.size + 1) // 2
    assert helpers.all_reduce(2, "average") == 2.0
    assert helpers.all_reduce(float(comm.rank), "max") == comm.size - 1
    want = np.arange(4) * (comm.size * (comm.size - 1) // 2)
    assert_same(helpers.all_reduce(np.arange(4) * comm.rank), want, "all_reduce array")
    only_main = helpers.main_process_only(lambda: "ran")
    assert only_main() == ("ran" if comm.rank == 0 else None)
    prefixed = helpers.rank_prefixed_message("a\nb")
    assert prefixed == (f"[rank {comm.rank}] a\n[rank {comm.rank}] b" if comm.size > 1 else "a\nb")
    assert helpers.broadcast_object(comm.rank * 10, root=comm.size - 1) == (comm.size - 1) * 10
    helpers.barrier()


def check_bitwise_agreement(comm, other) -> None:
    """Two backends give byte-identical results on the same random inputs with 2 ranks. With more, the
    backends may add the ranks' values in another order: then equal to the dtype's rounding."""
    import tensorflow as tf

    rng = np.random.default_rng(1234 + comm.rank)
    arrays = [rng.standard_normal(shape).astype(dtype) for shape, dtype in case(FLOAT_DTYPES)]
    for op in ("sum", "average"):
        for a, b in zip(comm.allreduce(arrays, op), other.allreduce(arrays, op)):
            assert_agree(a, b, f"{comm.name} vs {other.name} ({op}, {a.dtype}{a.shape})", comm.size)
        tensors = [tf.constant(a) for a in arrays]
        mine = tf.function(lambda *ts, op=op: comm.allreduce_tensors(list(ts), op))(*tensors)
        theirs = tf.function(lambda *ts, op=op: other.allreduce_tensors(list(ts), op))(*tensors)
        for a, b in zip(mine, theirs):
            assert_agree(a.numpy(), b.numpy(), f"{comm.name} vs {other.name} in tf.function ({op})",
                         comm.size)


def assert_agree(a: np.ndarray, b: np.ndarray, what: str, size: int) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
    if size <= 2:
        assert a.tobytes() == b.tobytes(), f"{what} differ: {np.flatnonzero(a != b)[:5]}"
        return
    # a sum of `size` values of magnitude up to ~5 (standard normal), rounded differently per addition
    tolerance = 8 * size * float(np.finfo(a.dtype).eps)
    np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance, err_msg=what)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--no-tf", action="store_true", help="skip the checks that need TensorFlow")
    parser.add_argument("--compare-with", help="also check bit-identical results against this backend")
    args = parser.parse_args()
    comm = create_communicator(args.backend, StallLimits(timeout=120))
    assert comm.name == args.backend, f"asked for {args.backend}, got {comm.name}"
    process.set_communicator(comm)
    install_failure_handler()
    checks = [check_identity, check_allreduce, check_results_stay_valid, check_objects, check_step_signal,
              check_param_sync_agreement, check_scores, check_config_check, check_helpers]
    if not args.no_tf:
        checks += [check_allreduce_tensors, check_broadcast]
    for check in checks:
        check(comm)
    if args.compare_with:
        other = create_communicator(args.compare_with)
        check_bitwise_agreement(comm, other)
        checks.append(check_bitwise_agreement)
    if not args.no_tf:  # last: "auto" may start Horovod (on GPUs with NCCL), never on the CPU
        assert create_communicator("auto", device="cpu").name == "mpi"
        expected, _ = auto_backend("")
        auto = create_communicator("auto")
        assert auto.name == expected, auto.name
        # ranks that would choose differently (a host with GPUs among hosts without) all take mpi
        from engine.distributed import select
        other = "horovod" if expected == "mpi" else "mpi"
        select.auto_backend = lambda device="": (other if comm.rank == 1 else expected, "test")
        assert create_communicator("auto").name == "mpi"
        select.auto_backend = auto_backend
        checks.append(create_communicator)
    comm.barrier()
    print(f"rank {comm.rank}: {len(checks)} checks passed ({comm.name} backend, {comm.size} ranks)",
          flush=True)


if __name__ == "__main__":
    main()
