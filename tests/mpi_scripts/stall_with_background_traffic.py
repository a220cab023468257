"""A hung collective between two hosts while other TCP traffic of the same process keeps flowing: run by
tests/test_link_progress.py with one rank on each simulated host (``python stall_with_background_traffic.py
STALL_TIMEOUT``).

Both ranks first reduce 4 MB (MPI's own connections must count: each rank's ``link_counter`` rises by at
least that). Then rank 1 serves a stream of bytes on a port of its own, which rank 0 reads without pause
(as a remote data reader would): that stream must not count. Rank 1 then hangs outside any collective,
and rank 0 waits for it in a barrier: its stall watchdog must end the job after STALL_TIMEOUT seconds,
although rank 0's process keeps receiving the stream. Prints "rank R: ..." lines of what it saw.
"""
from __future__ import annotations

import socket
import sys
import threading
import time

import numpy as np

from engine.distributed.mpi_backend import MPICommunicator
from engine.distributed.watchdog import StallLimits

CHUNK = 1 << 16


def serve_stream(listener: socket.socket) -> None:
    """Rank 1: send bytes to whoever connects, about 2 MB/s, until the process ends."""
    conn, _ = listener.accept()
    chunk = b"x" * CHUNK
    try:
        while True:
            conn.sendall(chunk)
            time.sleep(0.03)
    except OSError:
        return  # rank 0 ended


def read_stream(conn: socket.socket, counted: list[int]) -> None:
    """Rank 0: read the stream without pause, counting the bytes."""
    while True:
        data = conn.recv(CHUNK)
        if not data:
            return
        counted[0] += len(data)


def main() -> None:
    timeout = float(sys.argv[1])
    comm = MPICommunicator(StallLimits(warning=None, timeout=timeout))
    counter = comm.link_counter
    assert counter is not None and comm.local_size < comm.size, "the ranks are not on two hosts"
    before = counter() or 0
    comm.allreduce([np.ones(1 << 20, np.float32)])  # 4 MB over MPI's connections
    moved = (counter() or 0) - before
    print(f"rank {comm.rank}: the 4 MB allreduce moved {moved} bytes on MPI's connections", flush=True)
    assert moved >= 4 << 20, moved

    listener = socket.create_server(("", 0)) if comm.rank == 1 else None
    port = comm.broadcast_object(listener.getsockname()[1] if listener else None, root=1)
    host = comm.broadcast_object(socket.gethostname(), root=1)
    if comm.rank == 1:
        threading.Thread(target=serve_stream, args=(listener,), daemon=True).start()
    comm.barrier()
    if comm.rank == 1:
        print("rank 1: hangs outside any collective", flush=True)
        time.sleep(10 * timeout)
        print("rank 1: FAILED: the job was not ended", flush=True)
        sys.exit(1)
    counted = [0]
    stream = socket.create_connection((host, port))
    threading.Thread(target=read_stream, args=(stream, counted), daemon=True).start()
    start, at_start = counter() or 0, time.monotonic()
    time.sleep(1.0)
    print(f"rank 0: the stream brought {counted[0]} bytes in 1 s, MPI's connections moved "
          f"{(counter() or 0) - start}", flush=True)
    print("rank 0: waits for rank 1 in a barrier", flush=True)
    comm.barrier()
    print(f"rank 0: FAILED: the barrier returned after {time.monotonic() - at_start:.0f} s", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
