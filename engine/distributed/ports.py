"""A TCP port for a server that binds it later (TensorFlow's collective server), which nothing else on the
host takes in between.

The tf backend tells every rank's TensorFlow the cluster's "host:port" list before TensorFlow starts its
gRPC server, which binds its port only when TensorFlow's context initialises (at the first op, seconds
later) and refuses a port that another socket holds (it does not set SO_REUSEPORT), so the port cannot
simply be held open until then. The old way, asking the kernel for a free port (bind to port 0) and
closing the probe, left it free for anyone until the server bound it: two rank processes of concurrent
jobs (two pytest workers) could be handed the same port. Now two rules close that window:

- The port lies below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``): the
  kernel hands out only ports of that range, to a bind to port 0 and to an outgoing connection, so no
  other program gets this port unless it names it.
- Processes of this engine on the host reserve the port they take: a file named after it in a folder per
  user in the temp directory, holding the process id, looked at and written under the folder's lock. A
  port reserved by a process that still runs is skipped; a reservation whose process is gone is taken
  over. A process's reservations are removed when it exits.

A candidate must also be free now (a probe binds it and lets go), so a port that another program named
is skipped too.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
import random
import socket
import tempfile
from typing import Sequence

LOWEST = 20000  # below the kernel's ephemeral range, above the ports of common services
ATTEMPTS = 500

_mine: list[str] = []  # the reservation files of this process


def reservation_folder() -> str:
    return os.path.join(tempfile.gettempdir(), f"rnn-engine-ports-{os.getuid()}")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for port-0 binds and outgoing connections (Linux' default if unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def candidate_ports() -> range:
    """Ports outside the ephemeral range: below it, or above it where it starts too low."""
    low, high = ephemeral_range()
    return range(LOWEST, low) if low - LOWEST >= 1000 else range(high + 1, 65536)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process that runs
        return True
    return True


def _reserve(port: int, folder: str) -> bool:
    """Make the port's reservation file this process's, unless a running process holds it (the folder's
    lock makes looking and taking one step for all processes of the host)."""
    path = os.path.join(folder, str(port))
    with open(os.path.join(folder, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            with open(path) as f:
                owner = int(f.read().strip() or 0)
        except FileNotFoundError:
            owner = 0
        except (OSError, ValueError):
            return False  # unreadable: not ours to take
        if owner and (owner == os.getpid() or _process_alive(owner)):  # held: by this process, or another
            return False
        temp = f"{path}.{os.getpid()}.tmp"
        with open(temp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(temp, path)
    _mine.append(path)
    return True


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def reserve_port(candidates: Sequence[int] | None = None) -> int:
    """A port of ``candidates`` [``candidate_ports()``], free now and reserved for this process until it
    exits; tried in random order."""
    candidates = candidate_ports() if candidates is None else candidates
    folder = reservation_folder()
    os.makedirs(folder, exist_ok=True)
    ports = list(candidates)
    random.shuffle(ports)
    for port in ports[:ATTEMPTS]:
        if not _reserve(port, folder):
            continue
        if _bindable(port):
            return port
        release(port)
    raise OSError(errno.EADDRNOTAVAIL, f"no free TCP port among {min(len(ports), ATTEMPTS)} tried of "
                                       f"{candidates} (reservations in {folder})")


def release(port: int) -> None:
    """Remove this process's reservation of ``port``."""
    path = os.path.join(reservation_folder(), str(port))
    if path in _mine:
        _mine.remove(path)
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


@atexit.register
def _release_all() -> None:
    for path in list(_mine):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    _mine.clear()
