"""The single-process backend: rank 0 of 1, every collective is the identity. No MPI is imported."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

import numpy as np

from engine.distributed.backend import Communicator, TimedAs, check_reduction
from engine.distributed.wire import Wire, wire_per_tensor

if TYPE_CHECKING:
    import tensorflow as tf


class LocalCommunicator(Communicator):
    name = "local"

    def allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum") -> list[np.ndarray]:
        arrays = [np.asarray(a) for a in arrays]
        check_reduction(op, [a.dtype for a in arrays])
        return [a.copy() for a in arrays]  # callers may write into results, as with the other backends

    def allreduce_tensors(self, tensors: Sequence[tf.Tensor], op: str = "sum", *,
                          timed_as: TimedAs = None, wire: Wire = None) -> list[tf.Tensor]:
        # One rank: no collective takes place, so there is no phase to time, and no wire to compress
        # for (the values stay float32, as the one-rank strategy never reduces; the argument is checked).
        check_reduction(op, [t.dtype.as_numpy_dtype for t in tensors])
        wire_per_tensor(wire, len(tensors), op)
        return list(tensors)

    def broadcast_variables(self, variables: Sequence[tf.Variable], root: int = 0) -> None:
        _check_root(root)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        _check_root(root)
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def gather_object(self, obj: Any, root: int = 0) -> list[Any]:
        _check_root(root)
        return [obj]

    def scatter_object(self, objects: Sequence[Any] | None, root: int = 0) -> Any:
        _check_root(root)
        return objects[0]

    def barrier(self) -> None:
        pass

    def abort(self, message: str, exit_code: int = 1) -> NoReturn:
        if message:
            print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(exit_code)  # also from a watchdog thread, where sys.exit would end only that thread


def _check_root(root: int) -> None:
    if root != 0:
        raise ValueError(f"broadcast: root rank {root} does not exist in a single-process job")
