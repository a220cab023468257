"""The ``tf`` backend: TensorFlow's own collective ops (``CollectiveReduceV2``), no Horovod build.

The only multi-rank path for tensors on TensorFlow 2.16 and newer, where Horovod does not build. The
ranks still come from the MPI launcher: mpi4py gives rank, size and local rank, and carries what is not
a reduction (object collectives, variable broadcasts, barrier, abort, the stall watchdog's side channel),
as in the ``mpi`` backend, from which this class inherits them. Reductions go through TensorFlow:

- Start-up (``start_collective_runtime``): every rank reserves a free TCP port (``ports.py``: outside
  the kernel's ephemeral range and reserved on the host until the rank exits, so that nothing takes it
  before TensorFlow's server binds it), MPI allgathers every rank's "host:port", and each rank hands
  TensorFlow a cluster of one job "worker" (task = rank) with rank 0 as the collective group leader.
  TensorFlow starts its in-process gRPC server when its context initialises (at the first TensorFlow
  op), so this must run before any op, and before ``select_device`` hides GPUs.
- A reduction: the tensors of one dtype are flattened into one fused vector, reduced by one
  ``all_reduce_v2`` (RING over gRPC between CPUs, NCCL between GPUs), and split again. Averages are a sum
  followed by one division in the dtype, as the ``mpi`` backend does, so 2-rank results are bit-identical.
- Instance keys must be the same on every rank for the same collective, and TensorFlow keeps each key's
  first shape for ever (a later launch with another shape fails). A key is therefore derived from what
  the collective is (device kind, dtype, length, op), not from a call counter: a rank that traces a
  ``tf.function`` once more than the others still uses the same keys, and the number of keys stays
  bounded. Two collectives share a key only when they cannot run at once: every collective of a device
  kind takes the same ordering token (a resource variable), so TensorFlow launches them one after the
  other in program order on every rank.
- fp16/bf16 on the wire: the float32 values are cast and summed in that dtype by TensorFlow (every
  addition rounded to it, as in the ``mpi`` backend's numpy sum); fp16's range guard exchanges its peaks
  with one more small collective (MAX) in the same graph.

Not here: overlapped ``start_allreduce`` (it reduces at once, so ``distributed_param_sync_overlap`` keeps
its semantics but hides no time). NCCL between GPUs is wired up but was never run (no GPU with
TensorFlow on the machines this was written on).
"""
from __future__ import annotations

import socket
import zlib
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from engine.distributed.backend import (Communicator, ReductionHandle, TimedAs, check_buckets,
                                        check_reduction, tensor_bytes)
from engine.distributed.fusion import group_by_dtype
from engine.distributed.mpi_backend import MPICommunicator
from engine.distributed.ports import reserve_port
from engine.distributed.watchdog import StallLimits
from engine.distributed.wire import OnWire, Wire, compress, decompress, wire_of
from engine.report import phases
from engine.runtime import log
from engine.runtime.errors import DistributedError

if TYPE_CHECKING:
    import tensorflow as tf

JOB = "worker"
LEADER = f"/job:{JOB}/replica:0/task:0"
GROUP_KEYS = {"CPU": 1, "GPU": 2}  # a group holds one device kind: CPU ring and GPU NCCL apart
MERGE_OPS = {"sum": "Add", "average": "Add", "min": "Min", "max": "Max"}
# CollectiveReduceV2 reduces float16/32/64, bfloat16, int32 and int64. Narrower integers travel widened
# (exact; the cast back wraps a sum as MPI's own sum in the narrow type does); uint64 has no wider type.
WIDENED = {np.dtype(np.int8): np.int32, np.dtype(np.int16): np.int32, np.dtype(np.uint8): np.int32,
           np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64}
UINT64 = ("allreduce: the tf backend cannot reduce uint64 (TensorFlow's collectives reduce float16/32/64, "
          "bfloat16, int32 and int64; narrower integers are widened); use int64 or "
          "distributed_backend = 'mpi'")


_started: list[str] = []  # the cluster's addresses once this process started TensorFlow's collectives


def start_collective_runtime(mpi_comm: Any, rank: int) -> list[str]:
    """Give TensorFlow a cluster of all ranks (addresses exchanged over ``mpi_comm``) and enable its
    collective ops; returns the addresses by rank. Must run before TensorFlow's first op; once started,
    a later communicator of the same process (tests, tools) shares the running cluster."""
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context

    import tensorflow as tf

    if _started:
        return list(_started)
    ctx = context.context()
    if ctx._context_handle is not None:  # noqa: SLF001  (no public way to ask)
        raise DistributedError(
            "distributed_backend = 'tf' must start TensorFlow's collective runtime before TensorFlow's first "
            "operation, but this process already ran one: create the communicator first "
            "(engine.distributed.start does).")
    port = reserve_port()  # TensorFlow's server binds it at the first op: kept from others till then
    addresses = mpi_comm.allgather(f"{socket.gethostname()}:{port}")
    # The group leader resolves every collective group; device_filters keep each task from asking the
    # others for their devices (the ranks talk only inside collectives).
    ctx.configure_collective_ops(collective_leader=LEADER, device_filters=(f"/job:{JOB}/task:{rank}",))
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=tf.train.ClusterSpec({JOB: addresses}).as_cluster_def(),
        default_session_config=ctx.config,  # carries the leader: without it the first collective hung
        job_name=JOB, task_index=rank, protocol="grpc", port=port)
    ctx.enable_collective_ops(server_def)
    _started.extend(addresses)
    return addresses


class InstanceKeys:
    """Instance keys from what a collective is: one key per signature, the same on every rank.

    A signature's key is 1 + its CRC (mod 0x7FFFFFF0), unless that key is taken already by a signature
    met before, in which case it gets the next key not taken. So keys do not depend on the order of the
    signatures met, except where two collide (or one lands on a key a collision moved): then the one met
    later gets the moved key. Every rank still gets the same keys, because the ranks meet their signatures
    in the same program order (they run the same collectives); a rank that meets one once more (a retrace)
    keeps the key it gave it first."""

    def __init__(self) -> None:
        self._keys: dict[tuple, int] = {}
        self._used: set[int] = set()

    def key(self, signature: tuple) -> int:
        if signature not in self._keys:
            key = 1 + zlib.crc32(repr(signature).encode()) % 0x7FFFFFF0
            while key in self._used:
                key += 1
            self._keys[signature] = key
            self._used.add(key)
        return self._keys[signature]


class TFCommunicator(MPICommunicator):
    name = "tf"

    def __init__(self, stall: StallLimits | None = None, *, gpu_reduction: str = "nccl") -> None:
        super().__init__(stall)  # MPI: identity, objects, broadcasts, abort, watchdog and side channel
        # TensorFlow's communication hint per device kind; "ring" on GPUs: ranks that share a GPU (NCCL
        # refuses two ranks on one device)
        self.hints = {"CPU": "ring", "GPU": gpu_reduction}
        log.info(f"tf backend: CPU tensors reduced by RING, GPU tensors by {gpu_reduction.upper()} "
                 "(distributed_tf_gpu_reduction)")
        self.addresses = start_collective_runtime(self._comm, self.rank)
        if self.link_counter is not None:  # the reductions' connections: to the gRPC servers' ports
            ports = [int(address.rsplit(":", 1)[1]) for address in self.addresses]
            self.link_counter.add(ports[self.rank], ports[:self.rank] + ports[self.rank + 1:])
        self._keys = InstanceKeys()
        self._tokens: dict[str, Any] = {}  # device kind -> ordering token, made at first use
        log.debug(f"tf backend: collective cluster {self.addresses}, leader {LEADER}")

    # ----- numpy -----
    def allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum", *,
                  wire: str | None = None) -> list[np.ndarray]:
        """Eagerly, on the CPU (the arrays are in host memory): RING over gRPC. Without a wire format the
        arrays are fused by numpy into one buffer per dtype (``fusion.FusionBuffers``), each one
        collective: eager TensorFlow ops cost far more per call than numpy's copies."""
        import tensorflow as tf

        arrays = [np.asarray(a) for a in arrays]
        check_reduction(op, [a.dtype for a in arrays])
        if not arrays:
            return []
        with self._collective("allreduce"), tf.device("/device:CPU:0"):
            if wire is not None:
                results = self._reduce_compressed([tf.constant(a) for a in arrays], op, wire, "CPU")
                return [np.array(r.numpy()) for r in results]  # own, writable copies
            buffers, results = self._fusion.pack(arrays)
            for buf in buffers:
                self._reduce_buffer(buf, op)
        return results

    def _reduce_buffer(self, buf: np.ndarray, op: str) -> None:
        """One fused numpy buffer reduced in place (narrow integers widened on the way)."""
        import tensorflow as tf

        wide = WIDENED.get(buf.dtype)
        if buf.dtype == np.uint64:
            raise ValueError(UINT64)
        flat = tf.constant(buf if wide is None else buf.astype(wide))
        reduced = self._collective_op(flat, op, "CPU", buf.size).numpy()
        buf[...] = reduced if wide is None else reduced.astype(buf.dtype)  # the cast back wraps, as MPI's sum
        if op == "average":
            buf /= self.size  # in the dtype, as the mpi backend divides

    def start_allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum", *,
                        wire: str | None = None) -> ReductionHandle:
        # no communication thread: reduced here, done at once (the base class's behaviour)
        return Communicator.start_allreduce(self, arrays, op, wire=wire)

    # ----- tensors (also inside tf.function) -----
    def allreduce_tensors(self, tensors: Sequence[tf.Tensor], op: str = "sum", *,
                          timed_as: TimedAs = None, wire: Wire = None) -> list[tf.Tensor]:
        return self.allreduce_tensor_buckets(tensors, [list(range(len(tensors)))], op, timed_as=timed_as,
                                             wire=wire)

    def allreduce_tensor_buckets(self, tensors: Sequence[tf.Tensor], buckets: Sequence[Sequence[int]],
                                 op: str = "sum", *, timed_as: TimedAs = None,
                                 wire: Wire = None) -> list[tf.Tensor]:
        """One fused collective per bucket and dtype. TensorFlow's collectives are asynchronous kernels:
        a bucket is reduced as soon as its tensors exist while the graph computes on; the ordering token
        launches the buckets in the same order on every rank."""
        import tensorflow as tf

        tensors = [tf.convert_to_tensor(t) for t in tensors]
        check_buckets(len(tensors), buckets)
        check_reduction(op, [t.dtype.as_numpy_dtype for t in tensors])
        if not tensors:
            return []
        kind = self._kind()

        def reduce(inputs: list[tf.Tensor]) -> list[tf.Tensor]:
            results: list[Any] = [None] * len(inputs)
            for bucket in buckets:
                part = [inputs[i] for i in bucket]
                reduced = self._reduce_compressed(part, op, wire_of(wire, bucket), kind)
                for i, result in zip(bucket, reduced):
                    results[i] = result
            return results

        run = reduce if self.watchdog is None else (lambda inputs: self._watched(inputs, buckets[0], reduce))
        if timed_as is None:
            return run(tensors)
        name, category = timed_as
        sizes = {"bytes": tensor_bytes(tensors, wire, op), "tensors": len(tensors), "buckets": len(buckets)}
        return phases.timed_in_graph(name, category, tensors, run, gate_inputs=len(buckets) == 1, **sizes)

    def _reduce_compressed(self, tensors: list[tf.Tensor], op: str, wire: Wire, kind: str) -> list[tf.Tensor]:
        """``op`` over the ranks, the float32 tensors that ``wire`` marks cast to fp16/bf16 on the way (an
        average of those is a wire sum divided after the cast back, as in the other backends)."""
        exchange = self._peak_exchange(kind) if self.fp16_range is not None else None
        on_wire: OnWire = compress(tensors, wire, op, as_bits=False, exchange=exchange)
        if on_wire.fmt is None:
            return self._fused(tensors, op, kind)
        reduced = self._fused(on_wire.tensors, "sum" if op == "average" else op, kind)
        out = decompress(reduced, on_wire, self.size if op == "average" else 0)
        if op != "average":
            return out
        return [r if flag else r / np.array(self.size, r.dtype.as_numpy_dtype)
                for r, flag in zip(out, on_wire.flags)]

    def _peak_exchange(self, kind: str) -> Callable[[tf.Tensor], tf.Tensor]:
        """fp16's range guard: every rank's peaks, their maximum (exact), turned into the factors."""
        import tensorflow as tf

        guard = self.fp16_range

        def exchange(peaks: tf.Tensor) -> tf.Tensor:
            top = self._fused([peaks], "max", kind)[0]
            # stateful: the guard counts the reductions it scaled down (reported at the epoch's end)
            factors = tf.numpy_function(guard.factors, [top], tf.float32, stateful=True,
                                        name="fp16_range_factors")
            factors.set_shape(peaks.shape)
            return factors

        return exchange

    def _fused(self, tensors: Sequence[tf.Tensor], op: str, kind: str) -> list[tf.Tensor]:
        """One collective per dtype over the flattened, concatenated tensors; results shaped as inputs."""
        import tensorflow as tf

        results: list[Any] = [None] * len(tensors)
        for dtype, indices in group_by_dtype(tensors).items():
            wide = WIDENED.get(np.dtype(dtype.as_numpy_dtype))
            if np.dtype(dtype.as_numpy_dtype) == np.uint64:
                raise ValueError(UINT64)
            parts = [tf.reshape(tensors[i], [-1]) for i in indices]
            if wide is not None:
                parts = [tf.cast(p, wide) for p in parts]
            lengths = [_static_length(tensors[i]) for i in indices]
            flat = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
            reduced = self._collective_op(flat, op, kind, sum(lengths))
            if op == "average":
                reduced = reduced / np.array(self.size, reduced.dtype.as_numpy_dtype)
            for i, part in zip(indices, tf.split(reduced, lengths) if len(parts) > 1 else [reduced]):
                part = tf.cast(part, dtype) if wide is not None else part
                results[i] = tf.reshape(part, tf.shape(tensors[i]))
        return results

    def _collective_op(self, flat: tf.Tensor, op: str, kind: str, length: int) -> tf.Tensor:
        from tensorflow.python.ops import collective_ops

        key = self._keys.key((kind, flat.dtype.name, length, MERGE_OPS[op]))
        return collective_ops.all_reduce_v2(
            flat, group_size=self.size, group_key=GROUP_KEYS[kind], instance_key=key,
            merge_op=MERGE_OPS[op], final_op="Id", communication_hint=self.hints[kind],
            ordering_token=self._token(kind).handle)

    def _token(self, kind: str) -> Any:
        """The ordering token of a device kind: every collective of that kind takes this resource, so
        TensorFlow's automatic control dependencies launch them one at a time, in program order."""
        import tensorflow as tf

        if kind not in self._tokens:
            with tf.init_scope(), tf.device(f"/device:{kind}:0"):
                self._tokens[kind] = tf.Variable(0.0, trainable=False, name=f"collective_order_{kind}")
        return self._tokens[kind]

    @staticmethod
    def _kind() -> str:
        """Tensors inside the train step live on the GPU when one is visible (``select_device`` leaves
        this rank's), else on the CPU."""
        import tensorflow as tf

        return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"

    # ----- the stall watchdog around in-graph reductions -----
    def _watched(self, inputs: list[tf.Tensor], first: Sequence[int],
                 reduce: Callable[[list[tf.Tensor]], list[tf.Tensor]]) -> list[tf.Tensor]:
        """``reduce`` with the graph telling the watchdog when the first bucket's inputs exist (the
        wait starts) and when every result does (it ends)."""
        import tensorflow as tf

        inputs = list(inputs)
        with tf.control_dependencies([inputs[i] for i in first]):
            entered = tf.numpy_function(self._enter_in_graph, [], tf.int8, stateful=True, name="stall_enter")
        with tf.control_dependencies([entered]):
            for i in first:
                inputs[i] = tf.identity(inputs[i])
        results = reduce(inputs)
        with tf.control_dependencies(results):
            left = tf.numpy_function(self._leave_in_graph, [], tf.int8, stateful=True, name="stall_leave")
        with tf.control_dependencies([left]):
            return [tf.identity(r) for r in results]


def _static_length(tensor: tf.Tensor) -> int:
    count = tensor.shape.num_elements()
    if count is None:
        raise ValueError(f"allreduce: the tf backend needs tensors whose shape is known while tracing "
                         f"(its instance keys depend on it), got {tensor.shape}; the gradients of "
                         "variables always have one")
    return count
