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

from engine.distributed.backend import TimedAs, check_buckets, check_reduction, tensor_bytes
from engine.distributed.fusion import group_by_dtype
from engine.distributed.mpi_backend import MPICommunicator, check_thread_level
from engine.distributed.watchdog import StallLimits
from engine.distributed.wire import OnWire, Wire, compress, decompress, wire_of, wire_per_tensor
from engine.report import phases
from engine.runtime.errors import DistributedError

if TYPE_CHECKING:
    import tensorflow as tf


class HorovodCommunicator(MPICommunicator):
    name = "horovod"

    def __init__(self, stall: StallLimits | None = None) -> None:
        from mpi4py import MPI  # MPI must be initialised by mpi4py before Horovod

        check_thread_level(MPI, "horovod")  # refused below MULTIPLE, before hvd.init could crash on it
        _set_horovod_stall_check(stall or StallLimits())
        import horovod.tensorflow as hvd

        hvd.init(comm=MPI.COMM_WORLD)
        super().__init__(stall)
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
        with self._collective("allreduce"):
            results = self._grouped_allreduce([tf.convert_to_tensor(a) for a in arrays], op)
        return [t.numpy() for t in results]

    def allreduce_tensors(self, tensors: Sequence[tf.Tensor], op: str = "sum", *,
                          timed_as: TimedAs = None, wire: Wire = None) -> list[tf.Tensor]:
        import tensorflow as tf

        tensors = [tf.convert_to_tensor(t) for t in tensors]
        check_reduction(op, [t.dtype.as_numpy_dtype for t in tensors])
        if not tensors:
            return []
        if wire_per_tensor(wire, len(tensors), op)[0] == "bf16":
            # Horovod 0.28's allreduce op accepts no bfloat16 (its TensorFlow op lists uint8, int8, int32,
            # int64, half, float, double): bf16 goes through the mpi backend's reduction, on mpi4py's
            # communicator beside Horovod's, with the same result as distributed_backend = 'mpi'.
            return super().allreduce_tensors(tensors, op, timed_as=timed_as, wire=wire)
        # fp16: Horovod sums float16 itself (its MPI float16 op adds in float32, rounds each sum to fp16);
        # the range guard's exchange goes over mpi4py's communicator, in program order with the graph's
        # other numpy_functions (Horovod's ops are not stateful, so they do not wait for it). It is not
        # timed on its own: timed_in_graph's span around run holds it.
        reduce = self._grouped_allreduce if self.watchdog is None else self._watched_allreduce
        sent = []  # run's OnWire (no annotation: autograph rejects annotated nonlocals)

        def run(ts: list[tf.Tensor]) -> list[tf.Tensor]:
            on_wire = compress(ts, wire, op, as_bits=False, exchange=self._wire_exchange(None))
            sent.append(on_wire)
            return reduce(on_wire.tensors, _reduce_op(on_wire, op))

        if timed_as is None:
            results = run(tensors)
        else:  # Horovod reduces in its own thread, out of Python's sight: markers in the graph time it.
            name, category = timed_as
            results = phases.timed_in_graph(name, category, tensors, run,
                                            bytes=tensor_bytes(tensors, wire, op), tensors=len(tensors))
        return self._decompressed(results, sent[0], op)

    def _decompressed(self, results: list[tf.Tensor], on_wire: OnWire, op: str) -> list[tf.Tensor]:
        """The fp16 sums cast back to float32 and unscaled; for an average, every result divided (the
        compressed ones after the cast back, the others as _grouped_allreduce divides)."""
        if on_wire.fmt is None or op != "average":
            return decompress(results, on_wire)
        return [r / np.array(self.size, r.dtype.as_numpy_dtype) if not w else r
                for r, w in zip(decompress(results, on_wire, self.size), on_wire.flags)]

    def allreduce_tensor_buckets(self, tensors: Sequence[tf.Tensor], buckets: Sequence[Sequence[int]],
                                 op: str = "sum", *, timed_as: TimedAs = None,
                                 wire: Wire = None) -> list[tf.Tensor]:
        """One grouped allreduce per bucket: Horovod's ops are asynchronous kernels, so TensorFlow goes on
        computing while Horovod's thread reduces a bucket (fused up to HOROVOD_FUSION_THRESHOLD, which
        ``buckets.set_horovod_fusion_threshold`` sets from distributed_bucket_mb). ``timed_as`` times the
        exposed part: from the moment every tensor exists to the moment every result does. ``wire``: as
        ``allreduce_tensors`` (fp16 through Horovod's float16 sum, each bucket with its own range
        exchange; bf16 through the mpi backend's)."""
        import tensorflow as tf

        check_buckets(len(tensors), buckets)
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        check_reduction(op, [t.dtype.as_numpy_dtype for t in tensors])
        if not tensors:
            return []
        if wire_per_tensor(wire, len(tensors), op)[0] == "bf16":  # no bfloat16 in Horovod 0.28
            return super().allreduce_tensor_buckets(tensors, buckets, op, timed_as=timed_as, wire=wire)
        sent = []  # each bucket's OnWire (no annotation: autograph rejects annotated nonlocals)

        def reduce(inputs: list[tf.Tensor]) -> list[tf.Tensor]:
            inputs = list(inputs)
            if self.watchdog is not None:  # watched from the first bucket's start to the last result
                first = [inputs[i] for i in buckets[0]]
                with tf.control_dependencies(first):
                    entered = tf.numpy_function(self._enter_in_graph, [], tf.int8, stateful=True,
                                                name="stall_enter")
                with tf.control_dependencies([entered]):
                    for i in buckets[0]:
                        inputs[i] = tf.identity(inputs[i])
            results: list[tf.Tensor] = [None] * len(inputs)  # type: ignore[list-item]
            for bucket in buckets:
                on_wire = compress([inputs[i] for i in bucket], wire_of(wire, bucket), op, as_bits=False,
                                   exchange=self._wire_exchange(None))  # timed as part of reduce
                sent.append(on_wire)
                reduced = self._grouped_allreduce(on_wire.tensors, _reduce_op(on_wire, op))
                for i, result in zip(bucket, reduced):
                    results[i] = result
            if self.watchdog is None:
                return results
            with tf.control_dependencies(results):
                left = tf.numpy_function(self._leave_in_graph, [], tf.int8, stateful=True, name="stall_leave")
            with tf.control_dependencies([left]):
                return [tf.identity(r) for r in results]

        if timed_as is None:
            results = reduce(tensors)
        else:
            name, category = timed_as
            sizes = {"bytes": tensor_bytes(tensors, wire, op), "tensors": len(tensors),
                     "buckets": len(buckets)}
            results = phases.timed_in_graph(name, category, tensors, reduce, gate_inputs=False, **sizes)
        out: list[tf.Tensor] = [None] * len(tensors)  # type: ignore[list-item]
        for bucket, on_wire in zip(buckets, sent):
            for i, result in zip(bucket, self._decompressed([results[i] for i in bucket], on_wire, op)):
                out[i] = result
        return out

    def _watched_allreduce(self, tensors: list[tf.Tensor], op: str) -> list[tf.Tensor]:
        """The reduction, with the graph telling the stall watchdog when it starts and ends waiting in
        Horovod's thread."""
        import tensorflow as tf

        entered = tf.numpy_function(self._enter_in_graph, [], tf.int8, stateful=True, name="stall_enter")
        with tf.control_dependencies([entered]):
            results = self._grouped_allreduce([tf.identity(t) for t in tensors], op)
        with tf.control_dependencies(results):
            left = tf.numpy_function(self._leave_in_graph, [], tf.int8, stateful=True, name="stall_leave")
        with tf.control_dependencies([left]):
            return [tf.identity(r) for r in results]

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
        with self._collective("broadcast_variables"):
            self._hvd.broadcast_variables(list(variables), root_rank=root)


def _set_horovod_stall_check(stall: StallLimits) -> None:
    """Horovod's own stall check from the same limits (an explicit HOROVOD_STALL_* variable wins).

    Its warning lists the missing ranks and the tensors they owe. Its shutdown comes after the watchdog's
    ends of the job (rank 0's at ``timeout``, the others' at ``timeout + grace``), which name the ranks in
    one message, so it is only a last resort. Horovod reads these variables in ``hvd.init``."""
    shutdown = max(1, round(stall.timeout + 2 * stall.grace)) if stall.timeout else None
    warning = max(1, round(stall.warning)) if stall.warning else shutdown
    if warning is None:
        os.environ.setdefault("HOROVOD_STALL_CHECK_DISABLE", "1")
        return
    # Horovod never shuts down when the shutdown time is below the warning time
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(min(warning, shutdown or warning)))
    if shutdown:
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(shutdown))


def _reduce_op(on_wire: OnWire, op: str) -> str:
    """Horovod's op for the compressed tensors: an average of wire values is a sum, divided after the cast
    back (``_decompressed``)."""
    return "sum" if on_wire.fmt is not None and op == "average" else op
