"""The tests' warm start: a process that has imported TensorFlow forks each rank and runs its script.

    python tests/warm/server.py SOCKET          # started by tests/warm_start.py, one per pytest worker

Importing TensorFlow costs each process 5-6 s of CPU on these machines, and most of the suite's time is
the hundreds of processes its mpirun jobs and rnn.py runs start (docs/performance.md). This server pays
that once: it imports TensorFlow (nothing else of the engine, and neither MPI nor Horovod, whose
initialisation must belong to the rank), then listens on a Unix socket. ``client.py``, which mpirun (or
a test) starts in the rank's place, sends its command line, environment, working directory, umask, CPU
affinity and standard descriptors; the server forks, and the child becomes that rank: it takes the
descriptors as 0, 1 and 2, the environment (MPI's own variables with it, so ``MPI_Init`` joins the job),
the directory, umask and affinity, the sys.argv and sys.path of ``python SCRIPT ARGS`` and fresh standard
streams, and runs the script as ``__main__``; it ends as that process would (its exit status, or the
signal that killed it). The server tells the client how the child ended, and forwards to the child the
signals the client receives; a client that dies (mpirun kills its ranks with SIGKILL) takes the child
with it.

A request whose environment differs from the server's in what TensorFlow reads on import (see
``IMPORT_TIME``) is answered "cold": the client then runs the plain command itself.
"""
from __future__ import annotations

import array
import ctypes
import io
import json
import os
import runpy
import signal
import socket
import struct
import sys
import threading

STARTUP_ENV = dict(os.environ)  # before TensorFlow's import, which sets variables of its own

import tensorflow  # noqa: E402, F401  (the point of this process)

# Environment variables read while Python starts or TensorFlow is imported: a child that needs other values
# than the server had cannot be made from it. TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS are read
# when TensorFlow creates its thread pools (at the first op), PYTHONUNBUFFERED when the child makes its
# streams, so they may differ. KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK are Intel OpenMP's, read when that
# library loads, which TensorFlow's import does not load: scikit-learn and joblib (librosa's imports) set
# them in a test's process, and from then on every rank it starts would start cold for them.
IMPORT_TIME = ("PYTHON", "TF", "CUDA", "LD_", "KERAS", "XLA", "OMP_", "KMP_", "MKL", "OPENBLAS", "TPU",
               "NVIDIA", "GRPC")
LATER = {"TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
         "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}
# mpirun puts its library folder (the venv's lib) on the ranks' LD_LIBRARY_PATH; the MPI libraries that a rank
# loads resolve to the same files without it (their RUNPATH), so a path of only that folder is no difference.
MPI_LIBRARIES = os.path.join(sys.prefix, "lib")
STANDARD_FDS = 3
PR_SET_PDEATHSIG = 1


def import_time_difference(env: dict[str, str]) -> list[str]:
    """The import-time variables whose value in ``env`` is not this server's."""
    def value(environ: dict[str, str], name: str) -> str | None:
        if name == "LD_LIBRARY_PATH" and set(environ.get(name, "").split(os.pathsep)) <= {MPI_LIBRARIES, ""}:
            return None
        return environ.get(name)

    names = {n for n in set(env) | set(STARTUP_ENV) if n.startswith(IMPORT_TIME) and n not in LATER}
    return sorted(n for n in names if value(env, n) != value(STARTUP_ENV, n))


def die_with_parent() -> None:
    """SIGKILL when the parent process ends (the pytest worker, for the server; the server, for a rank)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def receive(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        part, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(STANDARD_FDS * fds.itemsize))
        if not part:
            raise ConnectionError("the client left before its request was complete")
        for _, _, payload in ancillary:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        data += part
    return json.loads(data), list(fds)


def fresh_stream(fd: int, unbuffered: bool) -> io.TextIOWrapper:
    """What a new interpreter makes of descriptor ``fd``: stderr line-buffered, stdout so on a terminal,
    both write-through under PYTHONUNBUFFERED."""
    if fd == 0:
        return io.TextIOWrapper(open(0, "rb", closefd=False), encoding=sys.stdin.encoding)
    binary = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
    return io.TextIOWrapper(binary, encoding=sys.stdout.encoding,
                            errors="backslashreplace" if fd == 2 else None,
                            line_buffering=fd == 2 or os.isatty(fd), write_through=unbuffered)


def become(request: dict, fds: list[int], inherited: list[socket.socket]) -> None:
    """In the child: turn into ``python SCRIPT ARGS`` as the client would have started it."""
    die_with_parent()
    for sock in inherited:
        sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.sched_setaffinity(0, request["cpus"])  # mpirun binds the process it starts: the client
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it up
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin, sys.stdout, sys.stderr = (fresh_stream(fd, unbuffered) for fd in range(STANDARD_FDS))
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    import numpy

    numpy.random.seed()  # a new process draws its own entropy; the server's state is every child's


def watch(conn: socket.socket, pid: int, open_connections: set[socket.socket]) -> None:
    """Forward the client's signals to child ``pid``, kill it if the client goes, and tell the client how
    the child ended."""
    ended = threading.Event()

    def forward() -> None:
        while True:
            try:
                data = conn.recv(4)
            except OSError:
                data = b""
            if ended.is_set():
                return
            if len(data) < 4:  # the client is gone: so is its rank
                with_signal(pid, signal.SIGKILL)
                return
            with_signal(pid, struct.unpack("i", data)[0])

    threading.Thread(target=forward, daemon=True).start()
    # Wait without reaping first: until the child is reaped, its pid cannot be another process's, so a
    # signal that forward() sends meanwhile reaches the child or nobody.
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    ended.set()
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(struct.pack("i", status))
        conn.shutdown(socket.SHUT_RDWR)  # wakes forward(), which then returns
    except OSError:
        pass
    open_connections.discard(conn)
    conn.close()


def with_signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def serve(path: str) -> None:
    die_with_parent()
    os.setpgrp()  # the worker ends the server and every rank it made with one killpg
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # clients find the socket only once it accepts
    open_connections: set[socket.socket] = set()
    while True:
        conn, _ = listener.accept()
        try:
            request, fds = receive(conn)
        except (OSError, ValueError) as exc:
            print(f"warm start: a bad request: {exc}", file=sys.stderr, flush=True)
            conn.close()
            continue
        different = import_time_difference(request["env"])
        if different or len(fds) != STANDARD_FDS:
            why = f"its {', '.join(different)} differ" if different else f"{len(fds)} descriptors came"
            print(f"warm start: {request['argv'][0]} starts cold: {why}", file=sys.stderr, flush=True)
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(struct.pack("i", -1))  # cold: the client runs the command itself
            except OSError:
                pass
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            become(request, fds, [listener, conn, *open_connections])
            runpy.run_path(sys.argv[0], run_name="__main__")
            sys.exit(0)  # the interpreter ends as after the script: threads joined, atexit, flushed
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(struct.pack("i", pid))
        except OSError:
            pass  # the client is gone already: watch() sees it and kills the child
        open_connections.add(conn)
        threading.Thread(target=watch, args=(conn, pid, open_connections), daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1])
