"""The ``mpi`` backend: mpi4py directly. Runs wherever mpi4py does, including TensorFlow versions that
Horovod does not build against.

Tensors are reduced through ``fusion.FusionBuffers`` (one buffer per dtype, in-place ``Allreduce`` over
its segments); inside a ``tf.function`` the same numpy code runs in one ``tf.numpy_function``.
Object collectives use mpi4py's pickle-based lower-case calls.
"""
from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Sequence

import numpy as np

from engine.distributed.backend import (ABORT_GRACE, Communicator, ReductionHandle, TimedAs, check_buckets,
                                        check_reduction, exit_after, exit_without_mpi, tensor_bytes)
from engine.distributed.comm_thread import JointReduction, Reduction, ReductionThread, WatchedReduction
from engine.distributed.fusion import SEGMENT_BYTES, FusionBuffers
from engine.distributed.link_progress import LinkCounter, mpi_link_counter
from engine.distributed.ring import NUMPY_OPS, RING_SEGMENT_BYTES, ring_allreduce, ring_threshold
from engine.distributed.side_channel import SideChannel
from engine.distributed.watchdog import StallLimits
from engine.distributed.wire import (SUM_INTO, Exchange, OnWire, Wire, compress, decompress, from_wire_bits,
                                     numpy_sum, to_wire_bits, wire_of, wire_per_tensor)
from engine.distributed.wire_guard import peaks_of
from engine.report import phases
from engine.runtime import log
from engine.runtime.errors import ConfigError

if TYPE_CHECKING:
    import tensorflow as tf

# How the stall watchdog names a reduction inside a tf.function: the train step's gradients, or an average.
IN_GRAPH = "allreduce in a tf.function"
BARRIER_POLL_SECONDS = 0.002  # what a barrier adds at most to its slowest rank's arrival


def thread_level_name(mpi: Any, level: int) -> str:
    names = {mpi.THREAD_SINGLE: "MPI_THREAD_SINGLE", mpi.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
             mpi.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED", mpi.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}
    return names.get(level, f"thread level {level}")


def check_thread_level(mpi: Any, backend: str, warn: bool = True) -> bool:
    """Whether MPI allows calls from several threads at once (``MPI_THREAD_MULTIPLE``, what mpi4py asks
    for): the stall watchdog's thread and Horovod's background thread call MPI while the main thread
    waits in a collective. ``MPI_THREAD_SERIALIZED`` (an MPI built without full thread support, or
    ``mpi4py.rc.thread_level`` / ``MPI4PY_RC_THREAD_LEVEL`` set lower) is degraded, with a warning: the
    watchdog's thread stops calling MPI (False). Lower levels, and Horovod below MULTIPLE, are refused:
    the reductions inside a ``tf.function`` run on TensorFlow's threads, not the main thread, and Horovod's
    thread always runs beside the main thread's MPI calls."""
    provided = mpi.Query_thread()
    if provided >= mpi.THREAD_MULTIPLE:
        return True
    level = thread_level_name(mpi, provided)
    fix = ("Use an MPI that provides MPI_THREAD_MULTIPLE (Open MPI 5 does), and leave mpi4py's thread "
           "level at its default 'multiple' (mpi4py.rc.thread_level, MPI4PY_RC_THREAD_LEVEL).")
    if backend == "horovod":
        raise ConfigError(
            f"Config key 'distributed_backend' is 'horovod', but MPI was initialised with {level}: "
            "Horovod's background thread calls MPI while the main thread does, which needs "
            "MPI_THREAD_MULTIPLE (Horovod itself warns that it would likely crash). Set "
            f"distributed_backend = 'mpi', or: {fix}")
    if provided < mpi.THREAD_SERIALIZED:
        raise ConfigError(
            f"MPI was initialised with {level}, but the {backend} backend calls MPI from TensorFlow's "
            "threads (the reductions inside the train step's tf.function), which needs at least "
            f"MPI_THREAD_SERIALIZED. {fix}")
    if warn:
        log.warning(f"MPI was initialised with {level}, not MPI_THREAD_MULTIPLE: the stall watchdog's "
                    "thread does not call MPI while the main thread waits in one, so it only watches each "
                    "rank's own waits. Each rank warns and ends the job by itself after "
                    "distributed_stall_warning / distributed_stall_timeout, naming the collective it waits "
                    f"in but not the ranks that did not arrive. {fix}")
    return False


class MPICommunicator(Communicator):
    name = "mpi"

    def __init__(self, stall: StallLimits | None = None) -> None:
        from mpi4py import MPI  # initialises MPI (thread level MULTIPLE: the watchdog thread sends, aborts)

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self.thread_multiple = check_thread_level(MPI, self.name, warn=self.rank == 0)
        node = self._comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        local_cpus = node.allgather(affinity)
        self.local_cpus = tuple(map(frozenset, local_cpus)) if all(local_cpus) else ()
        node.Free()
        # between hosts the reductions go around a ring of our own (ring.py); on one host, MPI_Allreduce
        self.ring_from_bytes = ring_threshold(across_hosts=self.local_size < self.size)
        segment_bytes = SEGMENT_BYTES if self.ring_from_bytes is None else RING_SEGMENT_BYTES
        self._fusion = FusionBuffers(segment_bytes)
        self._ops = {"sum": MPI.SUM, "average": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}
        self._outside_graph = None  # the watchdog's state before an in-graph reduction of a subclass started
        self._wire_fusion = FusionBuffers(segment_bytes)  # uint16 wire bits, apart from genuine uint16
        self._wire_ops: dict[str, Any] = {}  # user-defined MPI ops (wire.numpy_sum), made when first used
        channel = SideChannel(self._comm, MPI, threads=self.thread_multiple) if self.size > 1 else None
        if channel is not None:
            atexit.register(channel.meet_before_finalize)  # runs after the watchdog's stop (made below)
        # between hosts, a wait on a link that still moves the collectives' bytes (a slow one) is no stall;
        # on one host the ranks talk through shared memory, and no TCP traffic is theirs
        self.link_counter: LinkCounter | None = None
        if self.local_size < self.size:
            self.link_counter, why = mpi_link_counter(self._comm)
            if why and self.rank == 0 and stall is not None and stall.enabled:
                log.warning(f"stall watchdog: slow links between the hosts cannot be told from stalls: "
                            f"{why}; a wait counts from its start (distributed_stall_timeout).")
        super().__init__(stall, channel, watchdog_calls_mpi=self.thread_multiple,
                         bytes_moved=self.link_counter)
        # overlapped reductions (start_allreduce, buckets) run in a thread on a communicator of their own
        self._reducer = ReductionThread(self._comm.Dup(), self._ops, MPI.IN_PLACE, self._collective,
                                        ring_from_bytes=self.ring_from_bytes)
        self._pending: dict[int, Reduction] = {}  # the in-graph buckets started and not yet waited for
        self._tokens = itertools.count()

    # ----- tensors -----
    def allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum") -> list[np.ndarray]:
        return self._allreduce(arrays, op, "allreduce")

    def _allreduce(self, arrays: Sequence[np.ndarray], op: str, name: str, wire: str | None = None,
                   wired: Sequence[bool] = ()) -> list[np.ndarray]:
        """``wired``: which arrays are ``wire``-format values carried as uint16 bits; those are summed by
        the wire's MPI op in their own fused buffer (the caller divides an average after decompressing)."""
        arrays = [np.asarray(a) for a in arrays]
        compressed = [i for i, w in enumerate(wired) if w] if wire is not None else []
        plain = [i for i in range(len(arrays)) if i not in set(compressed)]
        check_reduction(op, [arrays[i].dtype for i in plain])
        with self._collective(name):
            if not compressed:
                return self._fusion.run(arrays, self._segment_reduction(op))
            reduced = self._fusion.run([arrays[i] for i in plain], self._segment_reduction(op))
            summed = self._wire_fusion.run([arrays[i] for i in compressed],
                                           self._segment_reduction("sum", wire))
            results = dict(zip(plain, reduced))
            results.update(zip(compressed, summed))
        return [results[i] for i in range(len(arrays))]

    def _segment_reduction(self, op: str, wire: str | None = None) -> Callable[[np.ndarray], None]:
        """The in-place reduction of one fused segment on the main communicator: around the ring or by
        MPI_Allreduce, with ``op`` or the wire format's sum, then an average's division (not for wire
        values: they are divided after the cast back)."""
        comm, in_place = self._comm, self._mpi.IN_PLACE
        mpi_op, add = (self._wire_op(wire), SUM_INTO[wire]) if wire else (self._ops[op], NUMPY_OPS[op])
        divisor = self.size if op == "average" else 0

        def reduce_segment(segment: np.ndarray) -> None:
            if self.ring_from_bytes is not None and segment.nbytes >= self.ring_from_bytes:
                ring_allreduce(comm, segment, add)
            else:
                comm.Allreduce(in_place, segment, op=mpi_op)
            if divisor:
                segment /= divisor  # while the segment is in cache; same rounding as the horovod backend

        return reduce_segment

    def allreduce_tensors(self, tensors: Sequence[tf.Tensor], op: str = "sum", *,
                          timed_as: TimedAs = None, wire: Wire = None) -> list[tf.Tensor]:
        import tensorflow as tf

        tensors = [tf.convert_to_tensor(t) for t in tensors]
        check_reduction(op, [t.dtype.as_numpy_dtype for t in tensors])
        if not tensors:
            return []
        sizes = {"bytes": tensor_bytes(tensors, wire, op), "tensors": len(tensors)}
        on_wire = compress(tensors, wire, op, as_bits=True, exchange=self._wire_exchange(timed_as))
        tensors, wired, fmt = on_wire.tensors, on_wire.flags, on_wire.fmt
        name, category = timed_as or ("", "")

        def reduce(*arrays: np.ndarray) -> list[np.ndarray]:
            if timed_as is None:
                return self._allreduce(arrays, op, IN_GRAPH, fmt, wired)
            start = phases.now()  # the reduction runs in Python already: timed here, no markers needed
            results = self._allreduce(arrays, op, IN_GRAPH, fmt, wired)
            phases.record(name, category, start, phases.now(), **sizes)
            return results

        # One Python call for all tensors: inputs arrive as numpy views of the tensors, and the aligned
        # result views go back to TensorFlow without a copy. numpy_function is stateful, so tf.function
        # keeps these calls in program order on every rank.
        results = tf.numpy_function(reduce, tensors, [t.dtype for t in tensors], stateful=True,
                                    name="mpi_allreduce")
        if not isinstance(results, (list, tuple)):  # eager numpy_function returns one output bare
            results = [results]
        for result, tensor in zip(results, tensors):
            result.set_shape(tensor.shape)
        return decompress(results, on_wire, self.size if op == "average" else 0)

    # ----- fp16's range guard (wire_guard.py) -----
    def _wire_exchange(self, timed_as: TimedAs, via_thread: bool = False) -> Exchange | None:
        """``compress``'s exchange for fp16 (None: the guard is off): the peaks of every rank in one
        stateful ``numpy_function`` (in program order, like the reductions), timed as a phase of its own
        in ``timed_as``'s category (None: not timed). ``via_thread``: as a job of the communication
        thread (``_exchange_peaks``)."""
        guard = self.fp16_range
        if guard is None:
            return None

        def exchange(peaks: tf.Tensor) -> tf.Tensor:
            import tensorflow as tf

            def run(local: np.ndarray) -> np.ndarray:
                start = phases.now()
                factors = guard.factors(self._exchange_peaks(local, via_thread))
                if timed_as is not None:
                    phases.record(f"{timed_as[0]} (fp16 range)", timed_as[1], start, phases.now(),
                                  bytes=local.nbytes, tensors=local.size)
                return factors

            factors = tf.numpy_function(run, [peaks], tf.float32, stateful=True, name="fp16_range_exchange")
            factors.set_shape(peaks.shape)
            return factors

        return exchange

    def _exchange_peaks(self, peaks: np.ndarray, via_thread: bool = False) -> np.ndarray:
        """Each peak's largest value over the ranks (MPI_MAX: no rounding, the same bits on every rank).

        In this thread on ``COMM_WORLD``; ``via_thread`` (reductions in buckets, whose jobs the
        communication thread runs meanwhile) or below MPI_THREAD_MULTIPLE as a job of that thread, behind
        the jobs queued before it: then only that thread is inside MPI, and the stall watchdog follows
        one wait at a time."""
        peaks = np.array(peaks, np.float32)
        if via_thread or not self.thread_multiple:
            job = self._reducer.start([peaks], "max", slot="fp16 range", label="fp16 range exchange",
                                      watched_as="fp16 range exchange")
            return np.array(job.wait()[0])
        with self._collective("fp16 range exchange"):
            self._comm.Allreduce(self._mpi.IN_PLACE, peaks, op=self._mpi.MAX)
        return peaks

    def _wire_op(self, fmt: str) -> Any:
        """The user-defined MPI op that sums ``fmt`` values carried as uint16 (made once: mpi4py has a
        small fixed number of slots for Python-defined ops), freed before MPI finalises."""
        if fmt not in self._wire_ops:
            if not self._wire_ops:
                atexit.register(self._free_wire_ops)
            self._wire_ops[fmt] = self._mpi.Op.Create(numpy_sum(fmt), commute=True)
        return self._wire_ops[fmt]

    def _free_wire_ops(self) -> None:
        if not self._mpi.Is_finalized():
            for mpi_op in self._wire_ops.values():
                mpi_op.Free()
        self._wire_ops.clear()

    # ----- overlapped reductions (comm_thread.py) -----
    def start_allreduce(self, arrays: Sequence[np.ndarray], op: str = "sum", *,
                        wire: str | None = None) -> ReductionHandle:
        arrays = [np.asarray(a) for a in arrays]
        check_reduction(op, [a.dtype for a in arrays])
        fmt, marked = wire_per_tensor(wire, len(arrays), op)
        flags = [m and a.dtype == np.float32 for m, a in zip(marked, arrays)]
        if any(flags):
            divisor = self.size if op == "average" else 0
            factors = [1.0] * len(arrays)
            if fmt == "fp16" and self.fp16_range is not None:  # the range guard, as compress has it
                wired = [i for i, flag in enumerate(flags) if flag]
                peaks = self._exchange_peaks(peaks_of([arrays[i] for i in wired]))
                for i, factor in zip(wired, self.fp16_range.factors(peaks)):
                    factors[i] = float(factor)
            bits = [to_wire_bits(a, fmt, factor) if flag else a
                    for a, flag, factor in zip(arrays, flags, factors)]
            handle: ReductionHandle = JointReduction(
                self._start_parts(bits, flags, op, fmt, watched_as=None), len(arrays),
                lambda i, r: from_wire_bits(r, fmt, divisor, factors[i]) if flags[i] else r)
        else:
            handle = self._reducer.start(arrays, op, watched_as=None)
        return WatchedReduction(handle, lambda: self._collective("wait for a started allreduce"))

    def _start_parts(self, arrays: Sequence[np.ndarray], flags: Sequence[bool], op: str, fmt: str | None,
                     slot: Any = None, **names: Any) -> list[tuple[list[int], Reduction]]:
        """Queue the plain arrays with ``op`` and the wire-format ones (uint16 bits, ``flags``) with the
        format's sum, as two reductions; (indices, reduction) for each that is not empty."""
        plain = [i for i, flag in enumerate(flags) if not flag]
        wired = [i for i, flag in enumerate(flags) if flag]
        parts = []
        wire_op, wire_add = (self._wire_op(fmt), SUM_INTO[fmt]) if fmt else (None, None)
        for indices, part_op, mpi_op, add, part_slot in ((plain, op, None, None, slot),
                                                         (wired, "sum", wire_op, wire_add, (slot, fmt))):
            if indices:
                job = self._reducer.start([arrays[i] for i in indices], part_op, mpi_op=mpi_op, add=add,
                                          slot=part_slot, **names)
                parts.append((indices, job))
        return parts

    def allreduce_tensor_buckets(self, tensors: Sequence[tf.Tensor], buckets: Sequence[Sequence[int]],
                                 op: str = "sum", *, timed_as: TimedAs = None,
                                 wire: Wire = None) -> list[tf.Tensor]:
        """One stateful ``numpy_function`` per bucket queues the bucket for the communication thread and
        returns a token at once, so TensorFlow computes on while the thread reduces; one more takes all
        tokens, waits, and returns the results. Timed as ``timed_as``: the phase is the time the step
        waited (the exposed part); the span's arguments add the reduction's own time and its hidden part.
        ``wire``: as ``allreduce_tensors`` (the compressed values travel as uint16 bits)."""
        import tensorflow as tf

        check_buckets(len(tensors), buckets)
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        check_reduction(op, [t.dtype.as_numpy_dtype for t in tensors])
        if not tensors:
            return []
        wire_per_tensor(wire, len(tensors), op)  # the argument, checked once for every bucket
        sizes = {"bytes": tensor_bytes(tensors, wire, op), "tensors": len(tensors), "buckets": len(buckets)}
        label = timed_as[0] if timed_as else "allreduce"
        tokens, on_wire = [], []
        for slot, bucket in enumerate(buckets):
            # each bucket compressed on its own, so that its range exchange needs only its own tensors
            compressed = compress([tensors[i] for i in bucket], wire_of(wire, bucket), op, as_bits=True,
                                  exchange=self._wire_exchange(timed_as, via_thread=True))
            on_wire.append(compressed)

            def start(*arrays: np.ndarray, slot: int = slot, compressed: OnWire = compressed) -> np.int64:
                token = next(self._tokens)
                parts = self._start_parts(arrays, compressed.flags, op, compressed.fmt, slot=(label, slot),
                                          label=f"{label} (bucket {slot + 1} of {len(buckets)})",
                                          watched_as=IN_GRAPH)
                self._pending[token] = JointReduction(parts, len(arrays))
                return np.int64(token)

            tokens.append(tf.numpy_function(start, compressed.tensors, tf.int64, stateful=True,
                                            name="mpi_allreduce_start"))
        sent = [t for compressed in on_wire for t in compressed.tensors]  # bucket after bucket

        def finish(*token_values: np.ndarray) -> list[np.ndarray]:
            jobs = [self._pending.pop(int(t)) for t in token_values]
            start = phases.now()
            reduced = [result for job in jobs for result in job.wait()]
            if timed_as is not None:  # the phase is the exposed wait; its arguments tell the rest
                hidden = sum(job.hidden_seconds(start) for job in jobs)
                total = sum(job.reduce_seconds for job in jobs)
                phases.record(timed_as[0], timed_as[1], start, phases.now(), **sizes,
                              reduce_s=round(total, 6), hidden_s=round(hidden, 6))
            return reduced

        results = tf.numpy_function(finish, tokens, [t.dtype for t in sent], stateful=True,
                                    name="mpi_allreduce_wait")
        if not isinstance(results, (list, tuple)):  # eager numpy_function returns one output bare
            results = [results]
        for result, tensor in zip(results, sent):
            result.set_shape(tensor.shape)
        out: list[tf.Tensor] = [None] * len(tensors)  # type: ignore[list-item]
        divisor = self.size if op == "average" else 0
        at = 0
        for bucket, compressed in zip(buckets, on_wire):
            reduced = decompress(results[at:at + len(bucket)], compressed, divisor)
            at += len(bucket)
            for i, result in zip(bucket, reduced):
                out[i] = result
        return out

    def broadcast_variables(self, variables: Sequence[tf.Variable], root: int = 0) -> None:
        self._check_root(root)
        values = [v.numpy() for v in variables]
        with self._collective("broadcast_variables"):
            results = self._fusion.run(values, lambda segment: self._comm.Bcast(segment, root=root))
        for variable, value in zip(variables, results):
            variable.assign(value)

    # ----- objects and control -----
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        self._check_root(root)
        with self._collective("broadcast_object"):
            return self._comm.bcast(obj, root=root)

    def allgather_object(self, obj: Any) -> list[Any]:
        with self._collective("allgather_object"):
            return self._comm.allgather(obj)

    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        self._check_root(root)
        with self._collective("gather_object"):
            return self._comm.gather(obj, root=root)

    def scatter_object(self, objects: Sequence[Any] | None, root: int = 0) -> Any:
        self._check_root(root)
        with self._collective("scatter_object"):
            return self._comm.scatter(list(objects) if self.rank == root else None, root=root)

    def barrier(self) -> None:
        # Polled with sleeps: a barrier waits for the slowest rank (rank 0 writing a checkpoint, for one),
        # and inside MPI_Barrier Open MPI would spin a core for all that time.
        with self._collective("barrier"):
            request = self._comm.Ibarrier()
            while not request.Test():
                time.sleep(BARRIER_POLL_SECONDS)

    def abort(self, message: str, exit_code: int = 1) -> NoReturn:
        if not self.thread_multiple and threading.current_thread() is not threading.main_thread():
            exit_without_mpi(message, exit_code)  # the main thread may be inside an MPI call
        if message:
            print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
        exit_after(ABORT_GRACE, exit_code, self.rank)
        self._comm.Abort(exit_code)
        os._exit(exit_code)  # not reached: MPI_Abort does not return

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast: root rank {root} does not exist in a job of {self.size} ranks")

    # The stall watchdog around a reduction that runs inside TensorFlow's graph (horovod and tf backends,
    # called through tf.numpy_function): no Python of ours runs while the graph waits.

    def _enter_in_graph(self) -> np.int8:
        self._outside_graph = self.watchdog.enter(IN_GRAPH)
        return np.int8(0)

    def _leave_in_graph(self) -> np.int8:
        self.watchdog.leave(self._outside_graph)
        return np.int8(0)
