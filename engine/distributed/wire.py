"""Wire compression of reductions (config key ``distributed_wire_format``): float32 tensors travel and
are summed as fp16 or bf16.

The semantics are Horovod's ``Compression.fp16``: each rank casts its float32 values to the wire dtype
(round to nearest even), the ranks' values are SUMMED IN THE WIRE DTYPE (every addition rounded to it),
the sum is cast back to float32, and an average divides after that cast. Only float32 tensors are
compressed; every other dtype travels as it is. Half the bytes cross the link; the price is the wire
dtype's rounding (fp16: 11 significant bits, range up to 65504; bf16: 8 bits, float32's range).

MPI has no fp16 or bf16 sum, so the ``mpi`` backend carries the wire values as uint16 bit patterns
(numpy has no bfloat16) and reduces them with a user-defined MPI operation (``numpy_sum``). Each
addition widens both operands to float32, adds, and rounds once to the wire dtype. That is the correctly
rounded fp16/bf16 sum: float32 holds the exact sum of two such values, or rounds it only far below the
wire dtype's last bit (where it cannot create or break a tie), and it is what Horovod's own float16 sum
does. fp16 uses numpy's float16 add (which does exactly that, element by element; the same in numpy
steps, cast to float32, add, cast back, gives the same bits and measured no faster, since numpy's
float16 casts are as slow as its add); bf16 goes in blocks that keep its temporaries in cache. Their
throughput against the link's rate: ``benchmarks/bench_wire_sum.py``, figures in docs/performance.md
("Wire compression").

fp16's range (65504) is guarded: the backends pass ``compress`` an ``exchange`` that scales each
tensor by a power of two chosen from every rank's values, so nothing overflows (``wire_guard.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

from engine.distributed.wire_guard import peaks_in_graph

if TYPE_CHECKING:
    import tensorflow as tf

WIRE_FORMATS = ("fp16", "bf16")
# ``allreduce_tensors(..., wire=)``: one format for every float32 tensor, or one entry per tensor (None:
# that tensor travels uncompressed, e.g. the score sums next to the gradients)
Wire = Union[None, str, Sequence[Optional[str]]]
WIRE_OPS = ("sum", "average")


def wire_per_tensor(wire: Wire, count: int, op: str) -> tuple[str | None, list[bool]]:
    """(the one wire format or None, per tensor whether it is compressed, before the dtype check).

    Raises ValueError for an unknown format, more than one format in one call, a per-tensor list of the
    wrong length, or an op other than sum and average (a min or max in fp16 saves nothing worth its
    rounding)."""
    if wire is None:
        return None, [False] * count
    entries = [wire] * count if isinstance(wire, str) else list(wire)
    if len(entries) != count:
        raise ValueError(f"allreduce: wire has {len(entries)} entries for {count} tensors")
    formats = {w for w in entries if w is not None}
    for w in formats:
        if w not in WIRE_FORMATS:
            raise ValueError(f"allreduce: unknown wire format {w!r}; expected None or one of "
                             f"{', '.join(map(repr, WIRE_FORMATS))}")
    if len(formats) > 1:
        raise ValueError(f"allreduce: one wire format per call, got {sorted(formats)}")
    if not formats:
        return None, [False] * count
    if op not in WIRE_OPS:
        raise ValueError(f"allreduce: wire compression applies to 'sum' and 'average', not {op!r}")
    return formats.pop(), [w is not None for w in entries]


def wire_of(wire: Wire, indices: Sequence[int]) -> Wire:
    """The ``wire`` argument for the tensors at ``indices`` of a call (a bucket's)."""
    return wire if wire is None or isinstance(wire, str) else [wire[i] for i in indices]


@dataclass
class OnWire:
    """What ``compress`` made of a reduction's tensors, and what ``decompress`` needs to undo it."""

    tensors: list  # what to reduce
    flags: list[bool]  # which of them are compressed
    fmt: str | None  # the wire format, None: nothing compressed
    factors: Any = None  # fp16 with a range guard: a float32 scalar tensor per compressed one (wire_guard.py)


# ``compress(..., exchange=)``: this rank's peaks of the fp16 tensors -> the factors (the peaks exchanged
# over the ranks, ``wire_guard.RangeGuard.factors``), inside the graph
Exchange = Callable[["tf.Tensor"], "tf.Tensor"]


def compress(tensors: Sequence[tf.Tensor], wire: Wire, op: str, *, as_bits: bool,
             exchange: Exchange | None = None) -> OnWire:
    """Float32 tensors marked for the wire cast to fp16/bf16 (``as_bits``: then bit-cast to uint16, for
    numpy); others unchanged. With fp16 and ``exchange`` (the range guard, ``wire_guard.py``) each is
    first multiplied by its factor, a power of two from the peaks of all ranks."""
    import tensorflow as tf

    fmt, marked = wire_per_tensor(wire, len(tensors), op)
    flags = [m and t.dtype == tf.float32 for m, t in zip(marked, tensors)]
    if fmt is None or not any(flags):
        return OnWire(list(tensors), flags, None)
    factors = None
    if fmt == "fp16" and exchange is not None:
        factors = tf.unstack(exchange(peaks_in_graph([t for t, flag in zip(tensors, flags) if flag])),
                             num=sum(flags))
    dtype = tf.float16 if fmt == "fp16" else tf.bfloat16
    out, k = [], 0
    for tensor, flag in zip(tensors, flags):
        if flag:
            if factors is not None:
                tensor, k = tensor * factors[k], k + 1
            tensor = tf.cast(tensor, dtype)
            if as_bits:
                tensor = tf.bitcast(tensor, tf.uint16)
        out.append(tensor)
    return OnWire(out, flags, fmt, factors)


def decompress(reduced: Sequence[tf.Tensor], on_wire: OnWire, divisor: int = 0) -> list[tf.Tensor]:
    """The compressed sums cast back to float32, divided by their factors, and by ``divisor`` when not 0
    (an average); the other tensors unchanged."""
    import tensorflow as tf

    if on_wire.fmt is None:
        return list(reduced)
    dtype = tf.float16 if on_wire.fmt == "fp16" else tf.bfloat16
    out, k = [], 0
    for tensor, flag in zip(reduced, on_wire.flags):
        if flag:
            if tensor.dtype == tf.uint16:
                tensor = tf.bitcast(tensor, dtype)
            tensor = tf.cast(tensor, tf.float32)
            # one division by factor * divisor (exact: a power of two times the ranks) rounds as dividing
            # by the factor (exact) and then by the divisor does, in one pass over the values
            if on_wire.factors is not None:
                tensor = tensor / (on_wire.factors[k] * np.float32(divisor or 1))
                k += 1
            elif divisor:
                tensor = tensor / np.float32(divisor)
        out.append(tensor)
    return out


# ----- numpy: arrays to and from the wire, the wire dtypes' sums over uint16 bit patterns -----
def to_wire_bits(values: np.ndarray, fmt: str, factor: float = 1.0) -> np.ndarray:
    """float32 values times ``factor`` (the range guard's power of two), rounded to ``fmt`` (nearest,
    ties to even), as uint16 bit patterns (``compress`` for numpy arrays, e.g. ``start_allreduce``'s)."""
    values = np.asarray(values, np.float32)
    if factor != 1.0:
        values = values * np.float32(factor)
    if fmt == "fp16":
        with np.errstate(over="ignore"):  # past fp16's range is inf, as in TensorFlow's cast (no warning)
            return values.astype(np.float16).view(np.uint16)
    return float32_to_bf16_bits(values)


def from_wire_bits(bits: np.ndarray, fmt: str, divisor: int = 0, factor: float = 1.0) -> np.ndarray:
    """The float32 values of ``fmt`` bit patterns, divided by ``factor`` (exact: a power of two) and by
    ``divisor`` when not 0 (``decompress``)."""
    values = bits.view(np.float16).astype(np.float32) if fmt == "fp16" else bf16_bits_to_float32(bits)
    if factor != 1.0 or divisor:  # one division, as decompress divides
        values = values / (np.float32(factor) * np.float32(divisor or 1))
    return values


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return np.left_shift(bits, 16, dtype=np.uint32).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even), as uint16 bit patterns. inf stays inf, a
    finite value past bf16's largest rounds to inf, NaN becomes the quiet NaN of its sign."""
    shape = np.shape(values)
    flat = np.ascontiguousarray(values, np.float32).reshape(-1)
    bits = flat.view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))  # carries into the exponent
    result = np.right_shift(rounded, 16).astype(np.uint16)
    nan = np.isnan(flat)
    if nan.any():  # the rounding add may carry a NaN's payload into the sign bit
        result[nan] = np.where(bits[nan] >> 31, np.uint16(0xFFC0), np.uint16(0x7FC0))
    if out is None:
        return result.reshape(shape)
    out[...] = result.reshape(shape)
    return out


def fp16_sum_into(a: np.ndarray, b: np.ndarray) -> None:
    """b += a, fp16 values as uint16 bits, each sum rounded to fp16 (numpy widens to float32, adds and
    rounds once)."""
    np.add(a.view(np.float16), b.view(np.float16), out=b.view(np.float16))


# bf16's sum goes in blocks of this many elements: its float32 and uint32 temporaries (a dozen bytes per
# element) then stay in the CPU cache; over a whole 16 MiB ring chunk at once they doubled its time
# (benchmarks/bench_wire_sum.py, docs/performance.md)
SUM_BLOCK = 1 << 16


def bf16_sum_into(a: np.ndarray, b: np.ndarray) -> None:
    """b += a, bf16 values as uint16 bits, each sum rounded to bf16."""
    for start in range(0, a.size, SUM_BLOCK):
        x, y = a[start:start + SUM_BLOCK], b[start:start + SUM_BLOCK]
        total = bf16_bits_to_float32(x)
        total += bf16_bits_to_float32(y)
        float32_to_bf16_bits(total, out=y)


SUM_INTO: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {"fp16": fp16_sum_into, "bf16": bf16_sum_into}


def numpy_sum(fmt: str) -> Callable[[Any, Any, Any], None]:
    """The function of a user-defined MPI operation (``MPI.Op.Create(fn, commute=True)``) adding
    uint16-carried ``fmt`` values: ``inout += in``."""
    add = SUM_INTO[fmt]

    def op(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        # inf and NaN are results here, as in Horovod (a sum past fp16's range is inf); the fused
        # buffer's alignment gaps hold arbitrary bits too. No warnings for them.
        with np.errstate(over="ignore", invalid="ignore"):
            add(np.frombuffer(inbuf, np.uint16), np.frombuffer(inoutbuf, np.uint16))

    return op
