"""Run under ``mpirun -np 2``: the wire-compressed reductions of one backend against numpy references.

    python wire_reduce.py --backend mpi|horovod|tf

Every rank sends its own float32 values (random, plus ties, overflow, subnormals, inf and NaN; and
values past fp16's range), and float64 / float16 / int32 / uint16 tensors beside them. The reference for
fp16 is numpy's float16 arithmetic on the values times the range guard's factor (computed here from its
definition in wire_guard.py), divided by it after the cast back; for bf16 TensorFlow's bfloat16
arithmetic (each rank's values rounded to the wire dtype, summed in it, cast back; an average then
divides in float32). The same in one call, in buckets, and through ``start_allreduce``. Any failed check
raises and the failure handler aborts the job; at the end every rank prints ``rank R: K wire checks
passed (BACKEND)``.
"""
from __future__ import annotations

import argparse

import numpy as np

from engine.distributed import create_communicator, install_failure_handler
from engine.runtime import process

SPECIAL = np.array([1.0, 2.0 ** -11, 1.0 + 2.0 ** -10, 40000.0, 2.0 ** -20, 3e-8, np.inf, -5.0, 0.0, np.nan,
                    1.0 + 2.0 ** -8, 2.0 ** -9, 3.0e38], np.float32)
SHAPES = [(), (7,), (5, 3), (300_007,), (0,), (1000,)]  # 300_007: several 1 MiB segments of wire bits


# past fp16's range: rank 0's 1e6 is inf in an unguarded cast, the two 40000s sum to inf unguarded
BIG = [np.array([40000.0, 1e6, -7e4, 3.0, 1e-30, 2.0 ** -20], np.float32),
       np.array([40000.0, 2e5, -1.0, 1e-9, 0.0, 2.0 ** -20], np.float32)]


def values(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    arrays = [np.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 3, shape), np.float32)
              for shape in SHAPES]
    # rank 0 sends the specials, rank 1 the small addends that make ties and overflows with them
    addends = [2.0 ** -11, 1.0, 2.0 ** -11, 40000.0, 2.0 ** -20, 3e-8, 1.0, 5.0, -0.0, 1.0, 2.0 ** -9,
               1.0 + 2.0 ** -8, 3.0e38]
    special = SPECIAL if rank == 0 else np.array(addends, np.float32)
    return arrays + [special, BIG[rank]]


def others(rank: int, backend: str) -> list[np.ndarray]:
    """Tensors of other dtypes, sent beside the float32 ones: never compressed. uint16 (the mpi backend's
    carrier of wire bits, which must not be confused with real uint16 values) only where Horovod, which
    has no uint16 reduction, is not the backend (the tf backend reduces uint16 widened to int32)."""
    arrays = [np.full((9,), 0.1 * (rank + 1), np.float64), np.full((4,), 0.1 * (rank + 1), np.float16),
              np.arange(6, dtype=np.int32) * (rank + 1)]
    return arrays + ([np.full((5,), 1000 * (rank + 1), np.uint16)] if backend != "horovod" else [])


def guard_factor(per_rank: tuple[np.ndarray, ...], size: int) -> np.float32:
    """The fp16 range guard's factor by its definition: the largest 2^e (e <= 127) with P * 2^e <= 65504 /
    (n (1 + 2^-11)^n), P the largest magnitude over the ranks; 1 when P is 0 or not finite."""
    if any(not np.isfinite(v).all() for v in per_rank):
        return np.float32(1.0)
    peak = max((float(np.abs(v).max()) if v.size else 0.0) for v in per_rank)
    if peak == 0:
        return np.float32(1.0)
    limit, e = 65504.0 / (size * (1 + 2.0 ** -11) ** size), 127
    while peak * 2.0 ** e > limit:
        e -= 1
    return np.float32(2.0 ** e)


def reference(all_values: list[list[np.ndarray]], wire: str, op: str, size: int) -> list[np.ndarray]:
    import tensorflow as tf

    out = []
    for per_rank in zip(*all_values):
        if wire == "fp16":
            factor = guard_factor(per_rank, size)
            total = (per_rank[0] * factor).astype(np.float16)
            for v in per_rank[1:]:
                total = total + (v * factor).astype(np.float16)  # numpy rounds each fp16 sum to fp16
            result = total.astype(np.float32) / factor
        else:
            total = tf.cast(per_rank[0], tf.bfloat16)
            for v in per_rank[1:]:
                total = total + tf.cast(v, tf.bfloat16)  # TensorFlow rounds each bf16 sum to bf16
            result = tf.cast(total, tf.float32).numpy()
        out.append(result / np.float32(size) if op == "average" else result)
    return out


def same(got, want, what: str) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    assert np.array_equal(got, want, equal_nan=True), \
        f"{what}: differ at {np.flatnonzero(~((got == want) | (np.isnan(got) & np.isnan(want))))[:5]}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    args = parser.parse_args()
    comm = create_communicator(args.backend)
    process.set_communicator(comm)
    install_failure_handler()
    import tensorflow as tf

    mine, plain = values(comm.rank), others(comm.rank, comm.name)
    all_values = comm.allgather_object(mine)
    checks = 0
    for wire in ("fp16", "bf16"):
        for op in ("sum", "average"):
            want = reference(all_values, wire, op, comm.size)
            tensors = [tf.constant(v) for v in mine]
            compiled = tf.function(lambda ts, wire=wire, op=op: comm.allreduce_tensors(ts, op, wire=wire))
            for how, got in (("eager", comm.allreduce_tensors(tensors, op, wire=wire)),
                             ("tf.function", compiled(tensors))):
                for i, (g, w) in enumerate(zip(got, want)):
                    same(g.numpy(), w, f"{wire} {op} {how} tensor {i}")
                    checks += 1
            # in buckets (each with its own range exchange), and started now, waited for later
            buckets = [[0, 6], [1, 2, 7], [3, 4, 5]]
            bucketed = tf.function(
                lambda ts, wire=wire, op=op: comm.allreduce_tensor_buckets(ts, buckets, op, wire=wire))
            started = comm.start_allreduce(mine, op, wire=wire).wait()
            for how, got in (("buckets", [g.numpy() for g in bucketed(tensors)]),
                             ("start_allreduce", started)):
                for i, (g, w) in enumerate(zip(got, want)):
                    same(g, w, f"{wire} {op} {how} tensor {i}")
                    checks += 1
            if op == "sum" and wire == "fp16":  # guarded: finite, within fp16's rounding of the exact sum
                big, exact = want[len(SHAPES) + 1], np.sum([b.astype(np.float64) for b in BIG], axis=0)
                floor = 2.0 ** -24 / guard_factor(tuple(BIG), comm.size)  # fp16's smallest step, unscaled
                assert np.isfinite(big).all() and (np.abs(big - exact) <= 2.0 ** -10 * np.abs(exact) + floor
                                                   ).all(), (big, exact)
        # mixed dtypes in one call, and a per-tensor list: the other dtypes and a float32 tensor marked
        # None give exactly the uncompressed reduction
        want_plain = [t.numpy() for t in comm.allreduce_tensors([tf.constant(p) for p in plain], "sum")]
        exact = comm.allreduce_tensors([tf.constant(mine[1])], "sum")[0].numpy()
        mixed = [tf.constant(p) for p in plain] + tensors + [tf.constant(mine[1])]
        marks = [wire] * (len(mixed) - 1) + [None]
        got = tf.function(lambda ts: comm.allreduce_tensors(ts, "sum", wire=marks))(mixed)
        want = [*want_plain, *reference(all_values, wire, "sum", comm.size), exact]
        for i, (g, w) in enumerate(zip(got, want)):
            same(g.numpy(), w, f"{wire} mixed tensor {i}")
            checks += 1
        assert not np.array_equal(want[len(plain) + 3], exact := comm.allreduce_tensors(
            [tf.constant(mine[3])], "sum")[0].numpy()), f"{wire} had no effect on random values"
        assert np.abs(want[len(plain) + 3] - exact).max() <= np.abs(exact).max() * 2.0 ** -6
    for bad, message in ((dict(wire="fp8"), "unknown wire format"),
                         (dict(wire="fp16", op="max"), "not 'max'")):
        try:
            comm.allreduce_tensors(tensors, bad.get("op", "sum"), wire=bad["wire"])
        except ValueError as exc:
            assert message in str(exc), exc
        else:
            raise AssertionError(f"no error for {bad}")
    comm.barrier()
    print(f"rank {comm.rank}: {checks} wire checks passed ({comm.name})", flush=True)


if __name__ == "__main__":
    main()
