"""Run under ``mpirun -np 2``: the overlapped reductions (gradient buckets, ``start_allreduce``) against
numpy, on one backend. Any failed check raises, and the failure handler aborts the job; once all passed,
every rank prints ``rank R: overlap checks passed (N checks, BACKEND backend)``.

    python overlap_checks.py --backend mpi|horovod [--fail-mid-step]

``--fail-mid-step``: after the checks, rank 1 raises inside a bucketed reduction's tf.function after its
first bucket was started; the job must end with that error, not hang.
"""
from __future__ import annotations

import argparse

import numpy as np

from engine.distributed import create_communicator, install_failure_handler
from engine.distributed.buckets import assign_buckets
from engine.runtime import process

# sizes around the fusion segment (1 MiB) and the bucket caps below, several dtypes, empty tensors
SHAPES = [(300_007,), (5, 3), (0,), (700, 600), (7,), (), (1000,), (333, 17), (2, 0), (1 << 18,)]
DTYPES = [np.float32, np.float64, np.float32, np.float16, np.int32, np.float32, np.int64, np.float64,
          np.float32, np.float32]


def rank_arrays(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 + rank)
    arrays = []
    for shape, dtype in zip(SHAPES, DTYPES):
        if np.dtype(dtype).kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(rng.integers(-1000, 1000, shape).astype(dtype))
    return arrays


def reference(op: str, size: int) -> list[np.ndarray]:
    """The numpy result: with 2 ranks one addition per element, so the order cannot matter."""
    per_rank = [rank_arrays(r) for r in range(size)]
    results = []
    for parts in zip(*per_rank):
        total = parts[0].copy()
        for part in parts[1:]:
            total += part  # in the array's own dtype, as MPI adds
        if op == "average":
            total = total / np.array(size, total.dtype)
        results.append(total)
    return results


def check_equal(got: list, want: list, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, \
            f"{what}[{i}]: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        assert np.array_equal(g, w), f"{what}[{i}]: values differ"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--fail-mid-step", action="store_true")
    args = parser.parse_args()
    install_failure_handler()
    comm = create_communicator(args.backend)
    process.set_communicator(comm)
    import tensorflow as tf

    arrays = rank_arrays(comm.rank)
    sizes = [a.nbytes for a in arrays]
    checks = 0
    for bucket_mb, first_mb in ((0.5, None), (1.0, 0.1), (100.0, None), (0.0, None)):
        for op in ("sum", "average"):
            keep = [i for i, a in enumerate(arrays) if op == "sum" or a.dtype.kind == "f"]
            tensors = [tf.constant(arrays[i]) for i in keep]
            want = [reference(op, comm.size)[i] for i in keep]
            use = assign_buckets([sizes[i] for i in keep], bucket_mb, first_mb)

            @tf.function
            def reduce(ts, use=use, op=op):
                return comm.allreduce_tensor_buckets(ts, use, op,
                                                     timed_as=("gradient allreduce", "allreduce"))

            for _ in range(3):  # the buffers' reuse across steps must not change earlier results
                check_equal(reduce(tensors), want, f"buckets {bucket_mb}/{first_mb} {op}")
            checks += 1
    # start now, wait later; the caller may change its arrays at once
    mine = [a.copy() for a in arrays]
    handle = comm.start_allreduce(mine, "sum")
    for a in mine:
        a[...] = 0
    check_equal(handle.wait(), reference("sum", comm.size), "start_allreduce")
    assert handle.reduce_seconds > 0 and handle.waited_seconds >= 0, \
        (handle.reduce_seconds, handle.waited_seconds)
    handles = [comm.start_allreduce(arrays[:3], "sum"), comm.start_allreduce(arrays[3:], "sum")]
    check_equal([r for h in handles for r in h.wait()], reference("sum", comm.size), "two handles")
    checks += 2
    comm.barrier()
    print(f"rank {comm.rank}: overlap checks passed ({checks} checks, {args.backend} backend)", flush=True)
    if args.fail_mid_step:
        fail_mid_step(comm, arrays, tf)


def fail_mid_step(comm, arrays, tf) -> None:
    """Rank 1 raises between its first and its second bucket, as a failing op in the backward pass would."""
    def maybe_fail(x):
        if comm.rank == 1:
            raise RuntimeError("boom: injected failure in the backward pass of rank 1")
        return x

    @tf.function
    def step(ts):
        first = ts[:5]
        later = [tf.numpy_function(maybe_fail, [t], t.dtype, stateful=True) for t in ts[5:]]
        with tf.control_dependencies(first):  # the first bucket's tensors exist before the failure
            later = [tf.identity(t) for t in later]
        return comm.allreduce_tensor_buckets(list(first) + later, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], "sum")

    step([tf.constant(a) for a in arrays])


if __name__ == "__main__":
    main()
