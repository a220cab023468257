"""The ``horovod`` backend: Horovod's grouped allreduce and variable broadcast for tensors.

Horovod shares MPI with mpi4py (mpi4py initialises MPI first, then ``hvd.init(comm=COMM_WORLD)``), so
object collectives, barrier and abort are the ``mpi`` backend's: Horovod has no job abort.
Averages are computed as a Horovod sum followed by one division, exactly as the ``mpi`` backend does
(Horovod's own Average multiplies by 1/size instead), so with 2 ranks both backends give bit-identical
results. With 3 or more ranks, float sums may differ in the last bit between the backends: MPI adds
the ranks' values in an order that depends on an element's position in the fused buffer, and the two
backends lay out their buffers differently. Exactly representable sums (integers, small floats) agree.

Measured on 2 cores (``benchmarks/bench_allreduce.py``): Horovod's background thread polls MPI all the
time (a non-coordinator rank burns ~90% of a core while idle), which slows every other MPI call of
the process as well: the ``mpi`` backend's reductions were about 2-6x faster than Horovod's there.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from engine import phases
from engine.distributed.backend import TimedAs, check_reduction, tensor_bytes
from engine.distributed.fusion import group_by_dtype
from engine.distributed.mpi_backend import MPICommunicator
from engine.errors import DistributedError

if TYPE_CHECKING:
    import tensorflow as tf


class HorovodCommunicator(MPICommunicator):
    name = "horovod"

    def __init__(self, stall_timeout: float | None = None) -> None:
        from mpi4py import MPI  # noqa: F401  (MPI must be initialised by mpi4py before Horovod)

        if stall_timeout:
            # Horovod's coordinator shuts down ops waiting for a rank that never submits its tensor;
            # that covers reductions inside a tf.function, where no Python watchdog can look.
            os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, int(stall_timeout) // 2)))
            os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(max(1, int(stall_timeout))))
        import horovod.tensorflow as hvd

        hvd.init(comm=MPI.COMM_WORLD)
        super().__init__(stall_timeout)
        if (hvd.rank(), hvd.size()) != (self.rank, self.size):
            raise DistributedError(
                f"Horovod sees rank {hvd.rank()} of {hvd.size()}, MPI sees rank {self.rank} of {self.size}: "
                "Horovod was built against a different MPI library than mpi4py uses. Rebuild Horovod in "
                "this environment (tools/install_env.sh) or set distributed_backend = 'mpi'.")
        self._hvd = hvd
        self._hvd_ops = {"sum": hvd.Sum, "average": hvd.Sum, "min": hvd.Min, "max": hvd.Max}

    def allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum") -> list[np.ndarray]:
        import tensorflow as tf

        arrays = [np.asarray(a) for a in arrays]
        check_reduction(op, [a.dtype for a in arrays])
        with self.stall_guard("allreduce"):
            results = self._grouped_allreduce([tf.convert_to_tensor(a) for a in arrays], op)
        return [t.numpy() for t in results]

    def allreduce_tensors(self, tensors: Sequence[tf.Tensor], op: str = "sum", *,
                          timed_as: TimedAs = None) -> list[tf.Tensor]:
        import tensorflow as tf

        tensors = [tf.convert_to_tensor(t) for t in tensors]
        check_reduction(op, [t.dtype.as_numpy_dtype for t in tensors])
        if timed_as is None or not tensors:
            return self._grouped_allreduce(tensors, op)
        # Horovod reduces in its own thread, out of Python's sight: markers in the graph time it.
        name, category = timed_as
        return phases.timed_in_graph(name, category, tensors, lambda ts: self._grouped_allreduce(ts, op),
                                     bytes=tensor_bytes(tensors), tensors=len(tensors))

    def _grouped_allreduce(self, tensors: list[tf.Tensor], op: str) -> list[tf.Tensor]:
        """One Horovod grouped allreduce per dtype (a group must share its dtype; Horovod fuses it)."""
        results: list[tf.Tensor] = [None] * len(tensors)  # type: ignore[list-item]
        for indices in group_by_dtype(tensors).values():
            group = self._hvd.grouped_allreduce([tensors[i] for i in indices], op=self._hvd_ops[op])
            for i, result in zip(indices, group):
                if op == "average":
                    result = result / np.array(self.size, result.dtype.as_numpy_dtype)
                results[i] = result
        return results

    def broadcast_variables(self, variables: Sequence[tf.Variable], root: int = 0) -> None:
        self._check_root(root)
        with self.stall_guard("broadcast_variables"):
            self._hvd.broadcast_variables(list(variables), root_rank=root)
