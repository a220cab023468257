"""The rate limit of the simulated hosts' link (``SimulatedHosts.limit_rate``, a tc tbf qdisc on each
end): a TCP transfer between the namespaces (``benchmarks/bench_multihost.py``'s sender and receiver)
reaches at least 85% of the limit and never more than it, in each direction; ``unlimit_rate`` lifts it.
Skipped, with the reason, where the machine forbids namespaces or has no ``tc``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ROOT
from prerequisites import require
from cluster.simulated_hosts import SimulatedHosts

pytestmark = pytest.mark.slow

BENCH = str(ROOT / "benchmarks" / "bench_multihost.py")


def tcp_rate(hosts: SimulatedHosts, sender: int, count: int, port: int) -> float:
    """bits/s of ``count`` bytes sent from host ``sender`` to the other host."""
    receive = [sys.executable, BENCH, "--tcp-receive", str(port)]
    receiver = subprocess.Popen(hosts.command_on(1 - sender, receive), stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "listening"
        address = hosts.hosts[1 - sender].address
        send = [sys.executable, BENCH, "--tcp-send", address, str(port), str(count)]
        sent = subprocess.run(hosts.command_on(sender, send), capture_output=True, text=True, timeout=120)
        assert sent.returncode == 0, sent.stderr
        result = json.loads(sent.stdout)
    finally:
        receiver.wait(timeout=60)
    assert result["bytes"] == count
    return result["bits_per_s"]


def test_rate_limit_holds_the_link_near_its_rate_in_both_directions():
    require("network namespaces and tc", SimulatedHosts.unavailable() or SimulatedHosts.tc_unavailable())
    with SimulatedHosts.create() as hosts:
        hosts.limit_rate(100e6)
        for sender in (0, 1):
            rate = tcp_rate(hosts, sender, 12_500_000, 5301 + sender)  # about one second
            assert 85e6 <= rate <= 100e6, f"host {sender}: {rate / 1e6:.1f} Mbit/s on a 100 Mbit/s link"
        hosts.unlimit_rate()
        rate = tcp_rate(hosts, 0, 50_000_000, 5303)
        assert rate > 300e6, f"{rate / 1e6:.1f} Mbit/s after unlimit_rate"
