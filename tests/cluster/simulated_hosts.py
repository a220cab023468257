"""Two hosts on one machine: network namespaces joined by a veth pair, for multi-host MPI tests.

    with SimulatedHosts.create() as hosts:          # SimulatedHosts.unavailable() says why it cannot
        hosts.run_on(0, [...])                      # a command on host 0, with host 0's hostname
        hosts.tx_bytes()                            # bytes each end of the link has sent
        hosts.limit_rate(100e6)                     # a 100 Mbit/s link in both directions (tc tbf)
        hosts.unlimit_rate()                        # back to the veth pair's own speed
        hosts.cut(1); hosts.reconnect(1)            # host 1's end of the link down, and up again
        hosts.kill_host(1)                          # SIGKILL to every process of host 1 (a dead host)

The network is closed: addresses from the reserved test range 198.18.0.0/24 (RFC 2544), the veth
pair joins only the two namespaces (nothing is bridged to the machine's interfaces, there is no
default route), and the namespaces, with every process left in them, are removed on exit, also when
the test fails. Inside the namespaces the hosts' names resolve to their addresses (``ip netns exec``
mounts /etc/netns/<namespace>/hosts over /etc/hosts), as TensorFlow's collectives need (they connect to
``hostname:port``). Namespaces of an earlier test process that was killed are removed on the next start.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SUBNET = "198.18.0.0/24"
PREFIX = "enginetest"  # namespaces are named enginetest-<pid>-<host index>
AGENT = Path(__file__).resolve().parent / "netns_agent.sh"


@dataclass(frozen=True)
class Host:
    netns: str
    address: str
    hostname: str
    interface: str


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed (exit {result.returncode}): "
                           f"{result.stderr.strip()}")
    return result


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SimulatedHosts:
    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces cannot be used here (the reason for a skip), or None when they can."""
        if shutil.which("ip") is None:
            return "the 'ip' command is missing (install it with: apt-get install -y iproute2)"
        if shutil.which("unshare") is None or shutil.which("hostname") is None:
            return "the 'unshare' or 'hostname' command is missing (util-linux, hostname packages)"
        probe = f"{PREFIX}-{os.getpid()}-probe"
        added = _ip("netns", "add", probe, check=False)
        if added.returncode != 0:
            return f"this machine forbids network namespaces: 'ip netns add' failed: {added.stderr.strip()}"
        _ip("netns", "del", probe, check=False)
        uts = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True, timeout=30)
        if uts.returncode != 0:
            return f"this machine forbids UTS namespaces: 'unshare --uts' failed: {uts.stderr.strip()}"
        return None

    @classmethod
    def create(cls, count: int = 2) -> SimulatedHosts:
        cls._remove_stale()
        pid = os.getpid()
        hosts = [Host(f"{PREFIX}-{pid}-{i}", f"198.18.0.{i + 1}", f"simhost{i}", f"veth{i}")
                 for i in range(count)]
        self = cls(hosts)
        try:
            for host in hosts:
                _ip("netns", "add", host.netns)
                _ip("-n", host.netns, "link", "set", "lo", "up")
            a, b = hosts  # two hosts, one link
            _ip("link", "add", a.interface, "netns", a.netns, "type", "veth", "peer", "name", b.interface,
                "netns", b.netns)
            for host in hosts:
                _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.interface)
                _ip("-n", host.netns, "link", "set", host.interface, "up")
            self._write_hosts_files()
        except BaseException:
            self.remove()
            raise
        return self

    def _write_hosts_files(self) -> None:
        machine = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
        names = "".join(f"{h.address} {h.hostname}\n" for h in self.hosts)
        for host in self.hosts:
            folder = Path("/etc/netns") / host.netns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(f"{machine.rstrip()}\n# simulated hosts (tests/cluster)\n{names}")

    def __enter__(self) -> SimulatedHosts:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    @property
    def agent_map(self) -> str:
        """The value of $SIMULATED_HOSTS for netns_agent.sh."""
        return " ".join(f"{h.address}={h.netns}={h.hostname}" for h in self.hosts)

    def command_on(self, index: int, command: list[str]) -> list[str]:
        """``command`` as run on host ``index``: in its network namespace, with its own hostname."""
        host = self.hosts[index]
        return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$0" && exec "$@"', host.hostname, *command]

    def tx_bytes(self) -> list[int]:
        """Bytes sent so far by each host's end of the link."""
        counts = []
        for host in self.hosts:
            shown = _ip("-n", host.netns, "-j", "-s", "link", "show", "dev", host.interface).stdout
            (link,) = json.loads(shown)
            counts.append(int(link["stats64"]["tx"]["bytes"]))
        return counts

    @staticmethod
    def tc_unavailable() -> str | None:
        """Why the link cannot be rate-limited here (no ``tc``), or None when it can."""
        if shutil.which("tc") is None:
            return "the 'tc' command is missing (install it with: apt-get install -y iproute2)"
        return None

    def limit_rate(self, rate_bits: float, burst_bytes: int | None = None, latency_ms: float = 50.0) -> None:
        """Limit the link to ``rate_bits`` bits/s in both directions: a token bucket filter (``tbf``)
        as the root qdisc of each end's veth, inside its namespace (each end shapes what it sends).
        The burst defaults to 10 ms of the rate and at least 64 KiB: a segmentation-offloaded packet
        on a veth is up to 64 KiB, and a bucket smaller than the packets keeps the link below its rate.
        ``latency_ms``: how long a packet may wait in the queue before tbf drops it."""
        burst = burst_bytes if burst_bytes is not None else max(int(rate_bits / 8 * 0.010), 65536)
        for host in self.hosts:
            self._tc(host, "qdisc", "replace", "dev", host.interface, "root", "tbf", "rate",
                     f"{int(rate_bits)}bit", "burst", str(burst), "latency", f"{latency_ms}ms")

    def unlimit_rate(self) -> None:
        """Remove the rate limits of ``limit_rate`` (the veth's default qdisc again)."""
        for host in self.hosts:
            shown = self._tc(host, "qdisc", "show", "dev", host.interface).stdout
            if " tbf " in f" {shown} ":
                self._tc(host, "qdisc", "del", "dev", host.interface, "root")

    @staticmethod
    def _tc(host: Host, *args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(["ip", "netns", "exec", host.netns, "tc", *args], capture_output=True,
                                text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"'tc {' '.join(args)}' in {host.netns} failed (exit {result.returncode}): "
                               f"{result.stderr.strip()}")
        return result

    def cut(self, index: int) -> None:
        """Take host ``index``'s end of the link down: nothing passes in either direction (the other end
        loses its carrier), as when a cable or a switch port fails."""
        host = self.hosts[index]
        _ip("-n", host.netns, "link", "set", host.interface, "down")

    def reconnect(self, index: int, timeout: float = 20.0) -> None:
        """Host ``index``'s end of the link up again; returns once both ends have their carrier. The other
        host's kernel remembers the cut host's address as unreachable (a failed neighbour entry, which
        answers "No route to host" until it expires): both hosts forget their neighbours, as a switch
        port that comes back is learned anew."""
        host = self.hosts[index]
        _ip("-n", host.netns, "link", "set", host.interface, "up")
        deadline = time.monotonic() + timeout
        while not all("LOWER_UP" in _ip("-n", h.netns, "-o", "link", "show", h.interface).stdout
                      for h in self.hosts):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the link of {host.hostname} has no carrier {timeout:.0f} s after it "
                                   "came up")
            time.sleep(0.1)
        for other in self.hosts:
            _ip("-n", other.netns, "neigh", "flush", "all", check=False)

    def pids(self, index: int) -> list[int]:
        """The processes running on host ``index`` (in its network namespace)."""
        return [int(pid) for pid in _ip("netns", "pids", self.hosts[index].netns, check=False).stdout.split()]

    def kill_host(self, index: int) -> list[int]:
        """SIGKILL every process of host ``index``, its MPI daemon included, as when the host dies; returns
        their pids. The network namespace stays, so the kernel still answers for the host: connections
        to it are refused or reset (a host that is off answers nothing: ``cut``)."""
        pids = self.pids(index)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def kill_processes(self) -> None:
        """End every process still inside the namespaces (e.g. MPI daemons after a timeout)."""
        for index in range(len(self.hosts)):
            self.kill_host(index)

    def remove(self) -> None:
        self.kill_processes()
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)  # removing one end removes the veth pair
            shutil.rmtree(Path("/etc/netns") / host.netns, ignore_errors=True)
        try:
            Path("/etc/netns").rmdir()  # when no other namespace has files there
        except OSError:
            pass

    @staticmethod
    def _remove_stale() -> None:
        """Namespaces left by a test process that no longer exists (killed before it could clean up)."""
        names = _ip("netns", "list", check=False).stdout.split("\n")
        for line in names:
            match = re.match(rf"({PREFIX}-(\d+)-\w+)", line.strip())
            if match and not _pid_alive(int(match.group(2))):
                stale = SimulatedHosts([Host(match.group(1), "", "", "")])
                stale.remove()
