"""How many bytes the job's collectives have moved over the network: what tells a slow link from a dead one.

A reduction of 100 MB over a 5 Mbit/s link takes minutes and is not stalled; a cut link moves nothing. The
stall watchdog (``watchdog.py``) calls a ``LinkCounter`` once a look while a rank waits long, and counts
a wait as stalled only from the last look at which bytes moved. The count is the sum, over the TCP
connections that carry the collectives, of the bytes the peer acknowledged and the bytes received
(``TCP_INFO``'s ``tcpi_bytes_acked`` and ``tcpi_bytes_received``, Linux 4.1 and later).

Only the collectives' own connections count, never the process's other TCP traffic (a remote data reader,
a metrics exporter, a download in the user's code): that traffic would restart the clock of a hung
collective for as long as it flows. A connection is the collectives' when one of its ends is a listening
port of theirs: MPI's TCP transport (Open MPI's TCP BTL) listens on a port per rank from ``MPI_Init`` on,
and a connection between two ranks is made to one of those ports, so it has that port as its remote end
on the rank that connected and as its local end on the rank that accepted. ``mpi_link_counter`` takes the
listening TCP ports this process has once MPI is initialised (so a port some other code of the process
listened on before would count too) and exchanges them between the ranks; the tf backend adds its gRPC
server's ports (``LinkCounter.add``), whose connections carry its reductions. Loopback connections never
count (the local MPI daemon's).

Where it cannot tell, the rule is refused with one line, and a wait counts from its start: a rank without
such a listening port (MPI's transport between the hosts bypasses the kernel's TCP: InfiniBand verbs, UCX,
libfabric; or the TCP BTL is excluded), a system without ``/proc`` or ``TCP_INFO``.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
from typing import Any, Iterable, Iterator

# struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received, u64 each, at byte 120
_BYTES_AT = 120
_INFO_SIZE = _BYTES_AT + 16
_FD_DIR = "/proc/self/fd"


class LinkCounter:
    """Bytes moved over this process's TCP connections whose local end is one of ``own_ports`` (accepted
    by this rank) or whose remote end is one of ``peer_ports`` (made to another rank)."""

    def __init__(self, own_ports: Iterable[int], peer_ports: Iterable[int]) -> None:
        self.own_ports, self.peer_ports = set(own_ports), set(peer_ports)

    def add(self, own_port: int, peer_ports: Iterable[int]) -> None:
        """Another transport of the collectives: this rank listens on ``own_port``, the others on
        ``peer_ports``."""
        self.own_ports.add(own_port)
        self.peer_ports.update(peer_ports)

    def __call__(self) -> int | None:
        """The bytes moved so far; None where that cannot be seen (no such connection, no ``/proc``, a
        kernel without the counters)."""
        if not hasattr(socket, "TCP_INFO"):
            return None
        total, seen = 0, False
        for sock in _tcp_sockets():
            moved = self._bytes(sock)
            if moved is not None:
                total, seen = total + moved, True
        return total if seen else None

    def _bytes(self, sock: socket.socket) -> int | None:
        try:
            peer_address, peer_port = sock.getpeername()[:2]
            local_port = sock.getsockname()[1]
            if local_port not in self.own_ports and peer_port not in self.peer_ports:
                return None  # not the collectives' connection
            peer = ipaddress.ip_address(peer_address.split("%")[0])
            if peer.is_loopback or getattr(peer, "ipv4_mapped", None) and peer.ipv4_mapped.is_loopback:
                return None
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_SIZE)
            if len(info) < _INFO_SIZE:
                return None  # a kernel older than the counters
            acked, received = struct.unpack_from("QQ", info, _BYTES_AT)
            return acked + received
        except (OSError, ValueError):
            return None  # not connected (a listening socket), or gone


def listening_ports() -> set[int]:
    """The ports of this process's listening TCP sockets (IPv4 and IPv6)."""
    ports = set()
    for sock in _tcp_sockets():
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                ports.add(sock.getsockname()[1])
        except OSError:
            pass
    return ports


def mpi_link_counter(comm: Any) -> tuple[LinkCounter | None, str]:
    """A counter of the connections of MPI's TCP transport, and "" (every rank); or None and why the rule
    cannot tell them apart here. Collective over ``comm`` (mpi4py): call it on every rank, after
    ``MPI_Init``, before the process listens on other ports."""
    if not hasattr(socket, "TCP_INFO") or not os.path.isdir(_FD_DIR):
        own: set[int] | None = None
    else:
        own = listening_ports()
    everyone = comm.allgather(sorted(own) if own is not None else None)
    blind = [rank for rank, ports in enumerate(everyone) if ports is None]
    if blind:
        return None, (f"{_ranks(blind)} cannot see their TCP connections' counters (no /proc/self/fd or "
                      "TCP_INFO)")
    without = [rank for rank, ports in enumerate(everyone) if not ports]
    if without:
        return None, (f"MPI listens on no TCP port on {_ranks(without)} (its transport between the hosts is "
                      "not the kernel's TCP, e.g. InfiniBand or UCX, or Open MPI's TCP BTL is excluded)")
    rank = comm.Get_rank()
    peers = {port for r, ports in enumerate(everyone) if r != rank for port in ports}
    return LinkCounter(own, peers), ""


def _tcp_sockets() -> Iterator[socket.socket]:
    """Copies of this process's TCP sockets, each closed after its turn (closing a copy leaves the
    process's own socket open)."""
    try:
        fds = os.listdir(_FD_DIR)
    except OSError:
        return
    for name in fds:
        try:
            if not os.readlink(f"{_FD_DIR}/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue  # closed meanwhile, or not a socket Python can wrap
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                yield sock
        finally:
            sock.close()


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
