"""tools/mpirun_guard.py: mpirun's output passes through unchanged, its status too, except the 0 that Open
MPI 5 returns after losing a host's daemon, which becomes 1 with a message naming the host and its ranks.
A non-zero status after a lost daemon passes through with the same message."""
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


# what mpirun prints when it notices first that the command which started a daemon ended (host 1 killed)
NOT_REPORTED = """hosts: 2 ranks on 2 hosts: simhost0 rank 0; simhost1 rank 1
------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to prterun:

  Local host:    simhost0
  Remote host:   simhost1
  Daemon exit status: 137
"""


def test_a_daemon_that_failed_to_report_back_is_named_with_its_ranks_and_the_status_passes_through():
    done = subprocess.run(GUARD + fake_mpirun(NOT_REPORTED, 137), capture_output=True, text=True, timeout=30)
    assert done.returncode == 137
    assert done.stdout == NOT_REPORTED
    assert "mpirun lost its daemon on simhost1 (rank 1) and ended the job (exit status 137)" in done.stderr
    assert "simhost0" not in done.stderr  # the local host is not the lost one


def test_other_statuses_pass_through():
    assert subprocess.run(GUARD + fake_mpirun(LOST, 137), capture_output=True, timeout=30).returncode == 137
    ok = subprocess.run(GUARD + fake_mpirun("hosts: 2 ranks on 1 host: a ranks 0-1\n", 0),
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and ok.stderr == "to-stderr\n"
