"""tools/mpirun_guard.py: mpirun's output passes through unchanged, its status too, except the 0 that Open
MPI 5 returns after losing a host's daemon, which becomes 1 with a message naming the host and its ranks
(or saying that mpirun named none). A non-zero status after a lost daemon passes through with the same
message. The reports are the texts Open MPI prints (Open MPI 5.0.11 measured on two simulated hosts; Open
MPI 4's from its help file's wording). Before running mpirun the guard adds the launcher's keepalive
options (tests/test_mpi_launcher.py tests which); here a fake mpirun answers --version and records them."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ROOT

# the reports' tests: no --version question to the fake mpirun (a shell)
GUARD = [sys.executable, str(ROOT / "tools" / "mpirun_guard.py"), "--no-keepalive"]
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


# a daemon lost, but mpirun's output was cut before the line that names its host (or only the help
# aggregation's summary line of a repeated report came through): still no success
UNNAMED = [
    "PRTE has lost communication with a remote daemon.\n",
    "hosts: 2 ranks on 2 hosts: simhost0 rank 0; simhost1 rank 1\n"
    "[prterun-simhost0-8261@0,0] 1 more process has sent help message help-errmgr-base.txt / node-died\n",
    "------------------------------------------------------------\nA daemon failed to report back after being"
    " spawned. This could\nbe due to several factors, including inability to find the\n",
]


@pytest.mark.parametrize("text", UNNAMED)
def test_a_lost_daemon_without_a_host_name_is_still_a_failure(text):
    done = subprocess.run(GUARD + fake_mpirun(text, 0), capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done.stderr
    assert done.stdout == text
    assert "mpirun lost its daemon on a host it did not name and ended the job, but exited with status 0" \
        in done.stderr


# Open MPI 4's mpirun (ORTE) says the same with its own name, and exits non-zero by itself
ORTE_LOST = """hosts: 2 ranks on 2 hosts: node01 rank 0; node02 rank 1
ORTE has lost communication with a remote daemon.

  HNP daemon   : [[45001,0],0] on node node01
  Remote daemon: [[45001,0],1] on node node02

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
"""


@pytest.mark.parametrize("status", [0, 1])
def test_open_mpi_4_s_lost_daemon_is_named(status):
    done = subprocess.run(GUARD + fake_mpirun(ORTE_LOST, status), capture_output=True, text=True, timeout=30)
    assert done.returncode == (status or 1)
    assert "mpirun lost its daemon on node02 (rank 1) and ended the job" in done.stderr


def fake_launcher(tmp_path, version: str) -> str:
    """An executable that answers --version with ``version`` and otherwise prints its arguments."""
    path = tmp_path / "mpirun"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then printf '%s\\n' '{version}'; exit 0; fi\n"
                    "for a in \"$@\"; do printf '[%s]' \"$a\"; done\n")
    path.chmod(0o755)
    return str(path)


def test_the_launcher_s_keepalive_options_go_right_after_mpirun_with_a_note(tmp_path):
    mpirun = fake_launcher(tmp_path, "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/")
    site = ("PRTE_MCA_", "OMPI_MCA_", "SLURM_", "SGE_")  # no site settings of this machine's user
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(site)}, "HOME": str(tmp_path)}
    done = subprocess.run([*GUARD[:2], mpirun, "-np", "2", "prog"], capture_output=True, text=True,
                          timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("[--prtemca][plm_ssh_args][-o ServerAliveInterval=10 -o ServerAliveCountMax=3]"
                           "[--prtemca][oob_tcp_keepalive_time][30][--prtemca][oob_tcp_keepalive_intvl][10]"
                           "[--prtemca][oob_tcp_keepalive_probes][3][-np][2][prog]")
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("mpirun_guard: Open MPI 5.0.11 (PRRTE): adding")
    # --no-keepalive: as given
    done = subprocess.run([*GUARD, mpirun, "-np", "2", "prog"], capture_output=True, text=True, timeout=30,
                          env=env)
    assert done.stdout == "[-np][2][prog]" and done.stderr == ""


def test_a_launcher_that_cannot_run_is_a_clear_error(tmp_path):
    done = subprocess.run([*GUARD[:2], str(tmp_path / "no-mpirun"), "-np", "2"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 127
    assert done.stderr.startswith(f"mpirun_guard: error: cannot start '{tmp_path / 'no-mpirun'}': ")
