"""The ``mpi`` backend: mpi4py directly. Runs wherever mpi4py does, including TensorFlow versions that
Horovod does not build against.

Tensors are reduced through ``fusion.FusionBuffers`` (one buffer per dtype, in-place ``Allreduce`` over
its segments); inside a ``tf.function`` the same numpy code runs in one ``tf.numpy_function``.
Object collectives use mpi4py's pickle-based lower-case calls.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

import numpy as np

from engine import phases
from engine.distributed.backend import Communicator, TimedAs, check_reduction, tensor_bytes
from engine.distributed.fusion import FusionBuffers

if TYPE_CHECKING:
    import tensorflow as tf


class MPICommunicator(Communicator):
    name = "mpi"

    def __init__(self, stall_timeout: float | None = None) -> None:
        from mpi4py import MPI  # initialises MPI (thread level MULTIPLE: the watchdog thread may abort)

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        node = self._comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self._fusion = FusionBuffers()
        self._ops = {"sum": MPI.SUM, "average": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}
        super().__init__(stall_timeout)

    # ----- tensors -----
    def allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum") -> list[np.ndarray]:
        arrays = [np.asarray(a) for a in arrays]
        check_reduction(op, [a.dtype for a in arrays])
        comm, in_place, mpi_op = self._comm, self._mpi.IN_PLACE, self._ops[op]
        divisor = self.size if op == "average" else 0

        def reduce_segment(segment: np.ndarray) -> None:
            comm.Allreduce(in_place, segment, op=mpi_op)
            if divisor:
                segment /= divisor  # while the segment is in cache; same rounding as the horovod backend

        with self.stall_guard("allreduce"):
            return self._fusion.run(arrays, reduce_segment)

    def allreduce_tensors(self, tensors: Sequence[tf.Tensor], op: str = "sum", *,
                          timed_as: TimedAs = None) -> list[tf.Tensor]:
        import tensorflow as tf

        tensors = [tf.convert_to_tensor(t) for t in tensors]
        check_reduction(op, [t.dtype.as_numpy_dtype for t in tensors])
        if not tensors:
            return []
        name, category = timed_as or ("", "")
        sizes = {"bytes": tensor_bytes(tensors), "tensors": len(tensors)}

        def reduce(*arrays: np.ndarray) -> list[np.ndarray]:
            if timed_as is None:
                return self.allreduce(arrays, op)
            start = phases.now()  # the reduction runs in Python already: timed here, no markers needed
            results = self.allreduce(arrays, op)
            phases.record(name, category, start, phases.now(), **sizes)
            return results

        # One Python call for all tensors: inputs arrive as numpy views of the tensors, and the aligned
        # result views go back to TensorFlow without a copy. numpy_function is stateful, so tf.function
        # keeps these calls in program order on every rank.
        results = tf.numpy_function(reduce, tensors, [t.dtype for t in tensors], stateful=True,
                                    name="mpi_allreduce")
        for result, tensor in zip(results, tensors):
            result.set_shape(tensor.shape)
        return list(results)

    def broadcast_variables(self, variables: Sequence[tf.Variable], root: int = 0) -> None:
        self._check_root(root)
        values = [v.numpy() for v in variables]
        with self.stall_guard("broadcast_variables"):
            results = self._fusion.run(values, lambda segment: self._comm.Bcast(segment, root=root))
        for variable, value in zip(variables, results):
            variable.assign(value)

    # ----- objects and control -----
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        self._check_root(root)
        with self.stall_guard("broadcast_object"):
            return self._comm.bcast(obj, root=root)

    def allgather_object(self, obj: Any) -> list[Any]:
        with self.stall_guard("allgather_object"):
            return self._comm.allgather(obj)

    def barrier(self) -> None:
        with self.stall_guard("barrier"):
            self._comm.Barrier()

    def abort(self, message: str, exit_code: int = 1) -> NoReturn:
        if message:
            print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
        self._comm.Abort(exit_code)
        os._exit(exit_code)  # not reached: MPI_Abort does not return

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast: root rank {root} does not exist in a job of {self.size} ranks")
