"""tools/mpirun_guard.py: mpirun's output passes through unchanged, its status too, except the 0 that Open
MPI 5 returns after losing a host's daemon, which becomes 1 with a message naming the host and its ranks."""
from __future__ import annotations

import subprocess
import sys

from helpers import ROOT

GUARD = [sys.executable, str(ROOT / "tools" / "mpirun_guard.py")]
LOST = """hosts: 3 ranks on 2 hosts: node01 ranks 0-1; node02 rank 2
PRTE has lost communication with a remote daemon.
  HNP daemon   : [prterun-node01-8261@0,0] on node node01
  Remote daemon: [prterun-node01-8261@0,1] on node node02
"""


def fake_mpirun(text: str, status: int) -> list[str]:
    return ["/bin/sh", "-c", f"printf '%s' '{text}'; echo to-stderr >&2; exit {status}"]


def test_a_lost_daemon_turns_success_into_failure_naming_host_and_ranks():
    done = subprocess.run(GUARD + fake_mpirun(LOST, 0), capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert done.stdout == LOST and done.stderr.startswith("to-stderr\n")
    assert "mpirun lost its daemon on node02 (rank 2) and ended the job, but exited with status 0" \
        in done.stderr


def test_other_statuses_pass_through():
    assert subprocess.run(GUARD + fake_mpirun(LOST, 137), capture_output=True, timeout=30).returncode == 137
    ok = subprocess.run(GUARD + fake_mpirun("hosts: 2 ranks on 1 host: a ranks 0-1\n", 0),
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and ok.stderr == "to-stderr\n"
