"""How many bytes this process has moved over the network: what tells a slow link from a dead one.

A reduction of 100 MB over a 5 Mbit/s link takes minutes and is not stalled; a cut link moves nothing. The
stall watchdog (``watchdog.py``) asks ``tcp_bytes_moved()`` once a look while a rank waits long, and counts
a wait as stalled only from the last look at which bytes moved. The count is the sum, over this process's
TCP sockets to other machines (loopback excluded: the connection to the local MPI daemon), of the bytes the
peer acknowledged and the bytes received (``TCP_INFO``'s ``tcpi_bytes_acked`` and ``tcpi_bytes_received``,
Linux 4.1 and later): the traffic of MPI's TCP transport, which carries the ranks' collectives, both
backends'. Transports that bypass the kernel's TCP (InfiniBand verbs, NCCL over RDMA) are not seen: there
``tcp_bytes_moved`` returns None and a wait counts from its start, as without this module.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct

# struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received, u64 each, at byte 120
_BYTES_AT = 120
_INFO_SIZE = _BYTES_AT + 16
_FD_DIR = "/proc/self/fd"


def tcp_bytes_moved() -> int | None:
    """Bytes acknowledged by peers plus bytes received, over this process's TCP sockets to other machines;
    None where that cannot be seen (no such socket, no ``/proc``, a kernel without the counters)."""
    if not hasattr(socket, "TCP_INFO"):
        return None
    try:
        fds = os.listdir(_FD_DIR)
    except OSError:
        return None
    total, seen = 0, False
    for name in fds:
        moved = _socket_bytes(int(name))
        if moved is not None:
            total, seen = total + moved, True
    return total if seen else None


def _socket_bytes(fd: int) -> int | None:
    try:
        if not os.readlink(f"{_FD_DIR}/{fd}").startswith("socket:"):
            return None
        sock = socket.socket(fileno=os.dup(fd))  # a copy: closing it leaves MPI's socket open
    except OSError:
        return None  # closed meanwhile, or not a socket Python can wrap
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return None
        peer = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
        if peer.is_loopback or getattr(peer, "ipv4_mapped", None) and peer.ipv4_mapped.is_loopback:
            return None
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_SIZE)
        if len(info) < _INFO_SIZE:
            return None  # a kernel older than the counters
        acked, received = struct.unpack_from("QQ", info, _BYTES_AT)
        return acked + received
    except (OSError, ValueError):
        return None  # not connected (a listening socket), or gone
    finally:
        sock.close()
