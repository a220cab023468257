"""The ring allreduce the ``mpi`` backend uses between hosts: a reduce-scatter and an allgather around the
ring of ranks, each step one ``Sendrecv`` of a 1/n share of the buffer with the neighbours.

Why not ``MPI_Allreduce``: between two simulated hosts on a rate-limited TCP link, Open MPI's allreduce
of 85 MB reached 54-64 % of the link's rate, in 1 MiB segments or in one call (the same with
``Iallreduce`` windows), while this ring with large messages reached 95 % (docs/performance.md, "Slow
links between hosts"). Each rank sends 2 (n - 1) / n of the buffer, the least any allreduce can send,
and sends and receives at once, so both directions of every link carry data all the time. On one host
the shared-memory ``MPI_Allreduce`` in 1 MiB segments stays faster (``fusion.py``), so the backend takes
the ring only when the job spans hosts.

The ranks' values of a chunk are added in ring order, so with 3 or more ranks a float sum may differ in
its last bit from ``MPI_Allreduce``'s; every rank ends with the identical result (the allgather copies
it). With 2 ranks each element is a + b, as with any allreduce.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from engine.runtime.errors import ConfigError

# ``add(incoming, into)``: into += incoming (numpy's add, or a wire format's sum over uint16 bits)
Add = Callable[[np.ndarray, np.ndarray], None]
# Open MPI's TCP transport moves a large message in fragments with only a few in flight, which a link whose
# queue holds tens of milliseconds of data limits to about 60 % of its rate; larger fragments and a deeper
# pipeline let one Sendrecv fill the link (set before MPI starts; a value the user set wins). Two TCP
# connections per pair of ranks (btl_tcp_links): with one, the ring's share of a link changed from run to
# run and bucketed reductions on a slow link lost time between messages; with two it stayed high
# (docs/performance.md, "Slow links between hosts", issue 27).
OPEN_MPI_TCP_DEFAULTS = {
    "OMPI_MCA_btl_tcp_max_send_size": str(1 << 20),
    "OMPI_MCA_pml_ob1_send_pipeline_depth": "16",
    "OMPI_MCA_pml_ob1_recv_pipeline_depth": "16",
    "OMPI_MCA_btl_tcp_links": "2",
}


def numpy_add(incoming: np.ndarray, into: np.ndarray) -> None:
    np.add(into, incoming, out=into)


def numpy_min(incoming: np.ndarray, into: np.ndarray) -> None:
    np.minimum(into, incoming, out=into)


def numpy_max(incoming: np.ndarray, into: np.ndarray) -> None:
    np.maximum(into, incoming, out=into)


NUMPY_OPS: dict[str, Add] = {"sum": numpy_add, "average": numpy_add, "min": numpy_min, "max": numpy_max}
# A fused buffer goes around the ring in pieces of this size: large messages fill the link, and the next
# piece's copy into the buffer is still small next to its transfer. Pieces below RING_MIN_BYTES (small
# models, overlap buckets) take MPI_Allreduce: a ring's 2 (n - 1) handshakes cost more than they gain
# there (0.9 MB at 100 Mbit/s: the ring 73% of the link, MPI_Allreduce 100%).
RING_SEGMENT_BYTES = 64 << 20
RING_MIN_BYTES = 8 << 20
ALLREDUCE_ENV = "ENGINE_ALLREDUCE"  # auto (ring across hosts) | ring | mpi


def ring_threshold(across_hosts: bool, environ: dict | None = None) -> int | None:
    """From how many bytes a fused segment goes around the ring (None: never, MPI_Allreduce always):
    ``RING_MIN_BYTES`` across hosts, never on one host; ``ENGINE_ALLREDUCE`` = "ring" (every segment, also
    on one host) or "mpi" (never) decides for every job, e.g. to compare them."""
    choice = (environ if environ is not None else os.environ).get(ALLREDUCE_ENV, "auto")
    if choice not in ("auto", "ring", "mpi"):
        raise ConfigError(f"The environment variable {ALLREDUCE_ENV} is {choice!r}; expected 'auto' (a ring "
                          "of our own across hosts, MPI_Allreduce on one host), 'ring' or 'mpi'.")
    if choice == "ring":
        return 0
    return RING_MIN_BYTES if choice == "auto" and across_hosts else None


def ring_allreduce(comm: Any, buf: np.ndarray, add: Add = numpy_add) -> None:
    """Sum ``buf`` (1-d, contiguous) over the ranks of the mpi4py communicator ``comm``, in place."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1 or buf.size == 0:
        return
    bounds = np.linspace(0, buf.size, size + 1).astype(np.int64)
    chunks = [buf[bounds[i]:bounds[i + 1]] for i in range(size)]
    incoming = np.empty(max(c.size for c in chunks), buf.dtype)
    right, left = (rank + 1) % size, (rank - 1) % size
    # reduce-scatter: after step s, chunk (rank - s - 1) holds the sum of s + 2 ranks' values
    for step in range(size - 1):
        send, receive = chunks[(rank - step) % size], chunks[(rank - step - 1) % size]
        comm.Sendrecv(send, dest=right, recvbuf=incoming[:receive.size], source=left)
        add(incoming[:receive.size], receive)
    # allgather: chunk (rank + 1) is complete here; pass the complete chunks around
    for step in range(size - 1):
        send, receive = chunks[(rank - step + 1) % size], chunks[(rank - step) % size]
        comm.Sendrecv(send, dest=right, recvbuf=receive, source=left)
