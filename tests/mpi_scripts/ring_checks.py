"""ring.ring_allreduce against numpy on every rank: sums, minima and maxima of several dtypes and sizes
(empty, fewer elements than ranks, odd splits), and the wire formats' sums; every rank must end with
the identical result. Exits non-zero with the first difference."""
import sys

import numpy as np
from mpi4py import MPI

from engine.distributed.ring import NUMPY_OPS, ring_allreduce
from engine.distributed.wire import SUM_INTO, bf16_bits_to_float32, float32_to_bf16_bits

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def values(n: int, dtype, r: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * n + r)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-1000, 1000, n).astype(dtype)


def check(name: str, got: np.ndarray, want: np.ndarray, exact: bool, tolerance: float = 1e-5) -> None:
    same = comm.allgather(got.tobytes())
    if any(s != same[0] for s in same):
        sys.exit(f"{name}: the ranks ended with different results")
    ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=tolerance, atol=tolerance)
    if not ok:
        sys.exit(f"{name}: ring result differs from numpy: {got[:5]} vs {want[:5]}")


for n in (0, 1, size - 1, size, 7, 1000, 100_003):
    for dtype in (np.float32, np.float64, np.int32, np.int64):
        mine = values(n, dtype, rank)
        every = [values(n, dtype, r) for r in range(size)]
        for op, ref in (("sum", np.sum), ("min", np.min), ("max", np.max)):
            buf = mine.copy()
            ring_allreduce(comm, buf, NUMPY_OPS[op])
            want = ref(np.stack(every), axis=0).astype(dtype) if n else mine
            # float sums: a + b is exact to compare on 2 ranks; with more the ring's order may differ
            check(f"{op} {np.dtype(dtype)} n={n}", buf, want, exact=op != "sum" or dtype not in
                  (np.float32, np.float64) or size == 2)
    for fmt, to_bits, to_float in (("fp16", lambda v: v.astype(np.float16).view(np.uint16),
                                    lambda b: b.view(np.float16).astype(np.float32)),
                                   ("bf16", float32_to_bf16_bits, bf16_bits_to_float32)):
        every = [to_bits(values(n, np.float32, r)) for r in range(size)]
        buf = every[rank].copy()
        ring_allreduce(comm, buf, SUM_INTO[fmt])
        want = every[0].copy()
        for other in every[1:]:
            SUM_INTO[fmt](other, want)  # rank 0 + rank 1 (+ ...), each sum rounded to the format
        # with 3 ranks the ring adds in another order than rank 0 + 1 + 2: a few of the format's last bits
        check(f"{fmt} n={n}", to_float(buf), to_float(want), exact=size == 2, tolerance=0.05)
if rank == 0:
    print(f"ring checks passed on {size} ranks")
