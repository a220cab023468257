"""The tf backend's port for TensorFlow's server (``engine/distributed/ports.py``): outside the kernel's
ephemeral range, so no port-0 bind or outgoing connection gets it, and reserved on the host, so that no
other process of the engine (a rank of another job, another pytest worker) takes it before TensorFlow's
server binds it. Before, a port the kernel had just handed out was let go at once and free for anyone."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

from engine.distributed import ports
from helpers import ROOT


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(ports, "reservation_folder", lambda: str(tmp_path))
    return tmp_path


def free_run(length: int) -> list[int]:
    """``length`` consecutive candidate ports, free now (a random place, so that concurrent tests differ)."""
    candidates = ports.candidate_ports()
    while True:
        start = random.randrange(candidates.start, candidates.stop - length)
        run = list(range(start, start + length))
        if all(ports._bindable(port) for port in run):
            return run


def test_the_port_lies_outside_the_ephemeral_range_and_is_reserved_until_released(folder):
    low, high = ports.ephemeral_range()
    port = ports.reserve_port()
    assert not low <= port <= high, (port, low, high)
    assert (folder / str(port)).read_text() == str(os.getpid())
    assert port != ports.reserve_port()  # this process holds the first one
    ports.release(port)
    assert not (folder / str(port)).exists()


def test_a_port_reserved_by_a_running_process_is_skipped_and_a_finished_ones_taken_over(folder):
    first, second = free_run(2)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / str(first)).write_text(str(other.pid))
        with pytest.raises(OSError, match="no free TCP port among 1 tried"):
            ports.reserve_port([first])
        assert ports.reserve_port([first, second]) == second
    finally:
        other.kill()
        other.wait()
    assert ports.reserve_port([first]) == first  # its process is gone: the reservation is taken over
    assert (folder / str(first)).read_text() == str(os.getpid())


def test_concurrent_processes_never_get_the_same_port(tmp_path):
    """Two processes take 10 ports each from the same 24 at the same time (the folder's lock makes
    looking and taking one step): 20 different ports. Each holds its ports until both have taken theirs
    (a process's reservations end with it)."""
    candidates = free_run(24)
    code = ("import sys, time\nfrom engine.distributed.ports import reserve_port\n"
            f"while time.time() < {time.time() + 2.0}: pass\n"  # both start reserving at once
            f"print(' '.join(str(reserve_port({candidates})) for _ in range(10)), flush=True)\n"
            "sys.stdin.read()\n")
    env = dict(os.environ, TMPDIR=str(tmp_path),
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    taken = [proc.stdout.readline().split() for proc in procs]
    for proc in procs:
        proc.communicate(timeout=60)
    assert all(proc.returncode == 0 for proc in procs)
    assert [len(t) for t in taken] == [10, 10] and len(set(taken[0] + taken[1])) == 20, str(taken)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"]  # released at exit
