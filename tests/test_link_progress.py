"""The slow-link rule counts only the collectives' own connections (engine/distributed/link_progress.py).

Between two simulated hosts (tests/cluster/simulated_hosts.py), a rank whose process keeps receiving
other TCP traffic (a stream from a server on the other host, as a remote data reader) while it waits in a
hung collective must still end the job after the stall timeout: before, every non-loopback TCP socket of
the process counted, and the stream kept the hung job alive. The same run checks that MPI's own
connections do count (a 4 MB allreduce moves at least 4 MB on them). Fails (not skips) under CI=true where
namespaces are unavailable. The refusal where the rule cannot tell is a unit test, without MPI.
"""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest

from cluster.simulated_hosts import AGENT, SUBNET, SimulatedHosts
from helpers import BIN, ROOT, child_env
from prerequisites import require

from engine.distributed.link_progress import listening_ports, mpi_link_counter

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "stall_with_background_traffic.py")
STALL_TIMEOUT = 3


def mpirun_on_two_hosts(hosts: SimulatedHosts, program: list[str]) -> list[str]:
    """One rank on each simulated host, MPI's traffic over their link."""
    mpirun = [str(BIN / "mpirun"), "-np", "2", "--host", ",".join(f"{h.address}:1" for h in hosts.hosts),
              "--bind-to", "none", "--map-by", "slot", "--prtemca", "plm_ssh_agent", str(AGENT),
              "--prtemca", "oob_tcp_if_include", SUBNET, "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
              "--mca", "btl_tcp_if_include", SUBNET, "-x", "PYTHONPATH", "-x", "PYTHONUNBUFFERED", *program]
    return hosts.command_on(0, mpirun)


@pytest.mark.mpi
@pytest.mark.slow
def test_other_tcp_traffic_of_the_process_does_not_keep_a_hung_collective_alive():
    require("network namespaces (root, ip netns)", SimulatedHosts.unavailable())
    env = child_env({"SIMULATED_HOSTS": "", "PYTHONPATH": str(ROOT)})
    with SimulatedHosts.create() as hosts:
        env["SIMULATED_HOSTS"] = hosts.agent_map
        start = time.monotonic()
        try:
            result = subprocess.run(mpirun_on_two_hosts(hosts, [sys.executable, SCRIPT, str(STALL_TIMEOUT)]),
                                    capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired as expired:
            pytest.fail(f"the hung job still ran after 60 s (stall timeout {STALL_TIMEOUT} s):\n"
                        f"{expired.stdout}\n{expired.stderr}")
        seconds = time.monotonic() - start
    output = result.stdout + result.stderr
    print(f"mpirun exit {result.returncode} after {seconds:.1f} s")  # shown by pytest -rP
    assert "FAILED" not in output, output
    assert result.returncode != 0, output
    for rank in (0, 1):
        moved = re.search(rf"rank {rank}: the 4 MB allreduce moved (\d+) bytes", output)
        assert moved and int(moved.group(1)) >= 4 << 20, output
    streamed = re.search(r"rank 0: the stream brought (\d+) bytes in 1 s", output)
    assert streamed and int(streamed.group(1)) > 1 << 20, output  # far above a look's progress threshold
    assert "rank 1 (host simhost1) did not reach collective" in output or \
        "rank 1 did not reach collective" in output, output
    assert f"within {STALL_TIMEOUT} s (distributed_stall_timeout)" in output, output


class Gather:
    """A communicator's allgather where every rank's part is given."""

    def __init__(self, rank: int, parts: list) -> None:
        self.rank, self.parts = rank, parts

    def allgather(self, mine):
        return [mine if r == self.rank else part for r, part in enumerate(self.parts)]

    def Get_rank(self) -> int:
        return self.rank


@pytest.mark.tf_latest
def test_a_rank_where_mpi_listens_on_no_tcp_port_refuses_the_rule_naming_it():
    with socket.create_server(("", 0)):  # this process, rank 0, listens
        counter, why = mpi_link_counter(Gather(0, [None, [], [1025]]))
    assert counter is None
    assert why.startswith("MPI listens on no TCP port on rank 1 (its transport between the hosts is not the "
                          "kernel's TCP"), why


@pytest.mark.tf_latest
def test_the_counter_watches_the_ports_the_ranks_listen_on():
    with socket.create_server(("", 0)) as listener:
        port = listener.getsockname()[1]
        assert port in listening_ports()
        counter, why = mpi_link_counter(Gather(1, [[1024], None, [1026, 1027]]))
    assert why == "" and port in counter.own_ports and counter.peer_ports == {1024, 1026, 1027}
    counter.add(5000, [5001])
    assert 5000 in counter.own_ports and 5001 in counter.peer_ports
