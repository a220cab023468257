"""``mpirun-guard`` (``tools/mpirun_guard.py``): run mpirun with the options that let it end when a host
stops answering, pass its exit status on, but never a success for a job that Open MPI ended because it
lost a host.

    python tools/mpirun_guard.py [--no-keepalive] MPIRUN [mpirun args ...]

First it asks ``MPIRUN --version`` which launcher it is and puts that launcher's keepalive options right
after MPIRUN (engine/tools/mpi_launcher.py: Open MPI 5 and 4 get ssh's and the daemons' keepalive, where
they are not set already; MPICH's Hydra and srun none), one line on stderr saying what it added or kept;
``--no-keepalive`` adds nothing.

Open MPI 5.0.11's mpirun exits 0 when its daemon on another host dies (the host crashed, or every process
there was killed): it prints "PRTE has lost communication with a remote daemon ... Remote daemon: [...]
on node HOST", kills the ranks on the hosts left, and reports success (measured on two simulated hosts,
tests/test_cluster_faults.py). A job script or ``supervise`` would take that unfinished training for a
finished one. This wrapper copies mpirun's output through unchanged, notes that report, and then exits 1
with one message naming the host and, from the engine's ``hosts:`` line, its ranks. When mpirun instead
notices first that the command which started the daemon there ended ("A daemon failed to report back
... Remote host: HOST ... Daemon exit status: 137"; a race with the report above), it exits non-zero by
itself: the wrapper passes that status on, with the same one-line message naming the host and ranks.
A lost daemon is a failure also when no host name can be read from the report (a truncated report, or
Open MPI's "N more processes have sent help message ... node-died" summary).
Stop signals it receives (SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP) go on to mpirun, as the job scripts
rely on.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from typing import BinaryIO

from engine.tools import mpi_launcher

# Open MPI 5 (PRRTE) and Open MPI 4 (ORTE) word it alike; the summary line stands in for repeats of it
LOST = re.compile(rb"(PRTE|ORTE) has lost communication with a remote daemon"
                  rb"|help-errmgr-base.txt / node-died")
REMOTE = re.compile(rb"Remote daemon: \S+ on node (\S+)")
NOT_REPORTED = b"A daemon failed to report back"
NOT_REPORTED_HOST = re.compile(rb"^\s*Remote host:\s+(\S+)")
HOST_MAP = re.compile(rb"hosts: \d+ ranks? on \d+ hosts?: (.*)")
DRAIN_SECONDS = 2.0
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Report:
    """What mpirun's output said about lost hosts and where the ranks run."""

    def __init__(self) -> None:
        self.lost = False  # "lost communication": Open MPI 5's mpirun then exits 0
        self.not_reported = False  # "failed to report back": mpirun then exits non-zero
        self.hosts: list[str] = []
        self.ranks: dict[str, str] = {}  # host -> "rank 1" / "ranks 2-3", from the engine's hosts line

    def note(self, line: bytes) -> None:
        if LOST.search(line):
            self.lost = True
        if NOT_REPORTED in line:
            self.not_reported = True
        named = (self.lost and REMOTE.search(line)) or (self.not_reported and NOT_REPORTED_HOST.search(line))
        if named and named.group(1).decode(errors="replace") not in self.hosts:
            self.hosts.append(named.group(1).decode(errors="replace"))
        host_map = HOST_MAP.search(line)
        if host_map:
            for part in host_map.group(1).decode(errors="replace").strip().split("; "):
                host, _, ranks = part.partition(" ")
                self.ranks[host] = ranks

    def message(self, status: int) -> str:
        """The one line naming the lost host(s) and their ranks, for mpirun's exit ``status``."""
        named = ", ".join(f"{host} ({self.ranks[host]})" if host in self.ranks else host
                          for host in self.hosts) or "a host it did not name"
        if status == 0:
            return (f"mpirun_guard: error: mpirun lost its daemon on {named} and ended the job, but exited "
                    "with status 0 (Open MPI 5 does so); exiting 1 instead: the training did not finish. The "
                    "host died, was cut off, or its processes were killed; the newest checkpoint resumes it.")
        return (f"mpirun_guard: error: mpirun lost its daemon on {named} and ended the job (exit status "
                f"{status}): the host died, was cut off, its processes were killed, or the daemon could not "
                "start there; the newest checkpoint resumes the training.")


def copy(source: BinaryIO, sink: BinaryIO, report: Report) -> None:
    for line in iter(source.readline, b""):
        sink.write(line)
        sink.flush()
        report.note(line)


USAGE = ("usage: mpirun_guard.py [--no-keepalive] MPIRUN [ARGS ...]\n\nRuns MPIRUN with ARGS and, unless "
         "--no-keepalive, the keepalive options of that launcher (from MPIRUN --version; settings of the "
         "site are kept), copies its output and passes its exit status on; after mpirun lost a host's "
         "daemon a 0 becomes 1, with a message naming the host.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    keepalive = argv[0] != "--no-keepalive"
    argv = argv if keepalive else argv[1:]
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if keepalive:
            launcher = mpi_launcher.ask(argv[0])
            plan = mpi_launcher.keepalive_plan(launcher, argv[0], argv[1:], os.environ)
            for note in plan.notes:
                print(f"mpirun_guard: {note}", file=sys.stderr, flush=True)
            argv = [argv[0], *plan.options, *argv[1:]]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except (OSError, mpi_launcher.LauncherError) as error:
        print(f"mpirun_guard: error: cannot start '{argv[0]}': {error}", file=sys.stderr)
        return 127
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, frame: proc.send_signal(signum))
    report = Report()
    # Daemon threads, and no waiting for the pipes' end: a daemon that mpirun left behind on a cut-off
    # host holds them open (it inherited them), and would keep this wrapper running after mpirun exited.
    copiers = [threading.Thread(target=copy, args=(proc.stdout, sys.stdout.buffer, report), daemon=True),
               threading.Thread(target=copy, args=(proc.stderr, sys.stderr.buffer, report), daemon=True)]
    for copier in copiers:
        copier.start()
    status = proc.wait()
    for copier in copiers:
        copier.join(timeout=DRAIN_SECONDS)  # what mpirun wrote last
    status = status if status >= 0 else 128 - status  # killed by a signal: the shell's 128 + N
    if report.lost or report.not_reported:  # a lost daemon ended the job: never a success
        print(report.message(status), file=sys.stderr, flush=True)
        return status or 1
    return status
