"""A one-host Grid Engine cell for tests, on Debian's packages (gridengine-master, -exec, -client 8.1.9):
installed non-interactively (debconf answers; the package's postinst runs init_cluster), then qmaster and
execd started, and configured with qconf for this host: root may run jobs, the scheduler runs every
second, a queue `test.q` of 2 slots with a 60 s `notify` time (between the warning and the suspension:
the job saves and ends within it also on a busy machine) and no load thresholds (a busy shared
machine must not put it in alarm state), and a parallel environment `mpi` with `control_slaves TRUE` and
`$fill_up`. Unlike the SLURM cluster this cell is the system's one (/var/lib/gridengine): ``stop()``
deletes this user's jobs and stops the daemons it started. Meant for a test machine: it changes the
cell's configuration (`min_uid`, the scheduler's interval), so do not run it where a real cell serves
users."""
from __future__ import annotations

import os
import pwd
import re
import socket
import subprocess
import tempfile
from pathlib import Path

from schedulers import packages
from schedulers.packages import wait_until

SGE_ROOT = "/var/lib/gridengine"
ENV = {"SGE_ROOT": SGE_ROOT, "SGE_CELL": "default"}
QUEUE = "test.q"
NOTIFY_SECONDS = 60

PE = """\
pe_name            mpi
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    /bin/true
stop_proc_args     /bin/true
allocation_rule    $fill_up
control_slaves     TRUE
job_is_first_task  FALSE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
"""
EXEC_HOST = """\
hostname              {host}
load_scaling          NONE
complex_values        NONE
user_lists            NONE
xuser_lists           NONE
projects              NONE
xprojects             NONE
usage_scaling         NONE
report_variables      NONE
"""
QUEUE_CONF = """\
qname                 {queue}
hostlist              {host}
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               mpi
rerun                 FALSE
slots                 2
tmpdir                /tmp
shell                 /bin/bash
prolog                NONE
epilog                NONE
shell_start_mode      posix_compliant
starter_method        NONE
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                {notify}
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
s_rt                  INFINITY
h_rt                  INFINITY
s_cpu                 INFINITY
h_cpu                 INFINITY
s_fsize               INFINITY
h_fsize               INFINITY
s_data                INFINITY
h_data                INFINITY
s_stack               INFINITY
h_stack               INFINITY
s_core                INFINITY
h_core                INFINITY
s_rss                 INFINITY
h_rss                 INFINITY
s_vmem                INFINITY
h_vmem                INFINITY
"""


def hms(seconds: int) -> str:
    """Grid Engine's time format, HH:MM:SS."""
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def one_line(text: str) -> str:
    """A command's output for a skip reason, which is one line."""
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def debconf_answers(host: str) -> str:
    """What the gridengine packages ask on install: the master host, the cell, and whether to configure."""
    lines = []
    for package in ("gridengine-common", "gridengine-master", "gridengine-client", "gridengine-exec"):
        lines += [f"{package} shared/gridenginemaster string {host}",
                  f"{package} shared/gridenginecell string default",
                  f"{package} shared/gridengineconfig boolean true"]
    return "\n".join(lines) + "\n"


class SgeCluster:
    """``start()`` returns None when the queue takes jobs, else why it could not start; ``stop()`` always."""

    def __init__(self) -> None:
        self.host = socket.gethostname().split(".")[0]
        self.env = dict(ENV)
        self.queue = QUEUE
        self.started: list[str] = []

    def start(self) -> str | None:
        if not os.path.exists("/usr/sbin/sge_qmaster") and os.geteuid() == 0:
            subprocess.run(["debconf-set-selections"], input=debconf_answers(self.host), text=True,
                           capture_output=True)
        why = packages.ensure(["/usr/sbin/sge_qmaster", "/usr/sbin/sge_execd", "qsub", "qconf"],
                              ["gridengine-master", "gridengine-exec", "gridengine-client"])
        if why:
            return why
        if not os.path.exists(f"{SGE_ROOT}/default/common/act_qmaster"):
            return (f"{SGE_ROOT}/default/common/act_qmaster missing: the gridengine-master package did not "
                    "set up the cell")
        self._alias_localhost()
        if self.qconf("-sh").returncode != 0:
            self._daemon("/usr/sbin/sge_qmaster")
            if not wait_until(lambda: self.qconf("-sh").returncode == 0, 120):
                return f"sge_qmaster does not answer: {one_line(self.qconf('-sh').stderr)}"
        for why in (self._configure(), self._start_execd()):
            if why:
                return why
        return None

    def _alias_localhost(self) -> None:
        """Where the host name resolves to 127.0.0.1, whose name is `localhost`, qmaster refuses its own
        clients ("client IP resolved to host name localhost. This is not identical to clients host
        name"): SGE's host_aliases makes the two one host."""
        try:
            address = socket.gethostbyname(self.host)
            name = socket.gethostbyaddr(address)[0].split(".")[0]
        except OSError:
            return
        if name != self.host:
            Path(f"{SGE_ROOT}/default/common/host_aliases").write_text(f"{self.host} {name}\n")

    def _daemon(self, path: str) -> None:
        subprocess.run([path], env=dict(os.environ, **self.env), capture_output=True, timeout=60)
        self.started.append(path)

    def command(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **self.env))

    def qconf(self, *args: str) -> subprocess.CompletedProcess:
        return self.command("qconf", *args)

    def _load(self, flag: str, text: str) -> str | None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "global"  # -Mconf takes the configuration's name from the file's
            path.write_text(text)
            r = self.qconf(flag, str(path))
        return None if r.returncode == 0 else f"qconf {flag}: {one_line(r.stdout + r.stderr)}"

    @staticmethod
    def _edit(conf: str, values: dict[str, str]) -> str:
        for key, value in values.items():
            conf = re.sub(rf"^{key}\s+.*$", f"{key} {value}", conf, flags=re.M)
        return conf

    def _configure(self) -> str | None:
        glob = self._edit(self.qconf("-sconf").stdout, {"min_uid": "0", "min_gid": "0",
                                                        "load_report_time": "00:00:05"})
        sched = self._edit(self.qconf("-ssconf").stdout, {"schedule_interval": "0:0:1",
                                                          "flush_submit_sec": "1", "flush_finish_sec": "1"})
        steps = [("-Mconf", glob), ("-Msconf", sched)]
        have = lambda flag, name: name in self.qconf(flag).stdout.split()  # noqa: E731
        steps.append(("-Me" if have("-sel", self.host) else "-Ae", EXEC_HOST.format(host=self.host)))
        steps.append(("-Mp" if have("-spl", "mpi") else "-Ap", PE))
        steps.append(("-Mq" if have("-sql", QUEUE) else "-Aq",
                      QUEUE_CONF.format(queue=QUEUE, host=self.host, notify=hms(NOTIFY_SECONDS))))
        if not have("-ss", self.host):
            steps.append(("-as", None))
        for flag, text in steps:
            if text is None:
                r = self.qconf(flag, self.host)
                why = None if r.returncode == 0 else f"qconf {flag}: {one_line(r.stdout + r.stderr)}"
            else:
                why = self._load(flag, text)
            if why:
                return why
        return None

    def _start_execd(self) -> str | None:
        if not self.queue_ready():
            self._daemon("/usr/sbin/sge_execd")
        if not wait_until(self.queue_ready, 180):
            state = " | ".join(self.command("qstat", "-f").stdout.strip().splitlines())
            return f"the queue {QUEUE}@{self.host} does not take jobs: {state}"
        return None

    def queue_ready(self) -> bool:
        """The queue instance reports load and has no error/alarm/unknown/disabled state."""
        r = self.command("qstat", "-f", "-q", QUEUE)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith(f"{QUEUE}@")), "")
        fields = line.split()
        bad_state = len(fields) > 5 and re.search("[uEaADsSc]", fields[5])
        return len(fields) >= 5 and fields[3] != "-NA-" and not bad_state

    def job_state(self, job_id: str) -> str | None:
        """qstat's state of the job (qw, r, Rr, t, ...), None once it has left the system."""
        r = self.command("qstat")
        for line in r.stdout.splitlines():
            fields = line.split()
            if fields and fields[0] == job_id:
                return fields[4]
        return None

    def wait_job_gone(self, job_id: str, timeout: float) -> bool:
        return wait_until(lambda: self.job_state(job_id) is None, timeout)

    def stop(self) -> None:
        self.command("qdel", "-f", "-u", pwd.getpwuid(os.getuid()).pw_name)  # this user's jobs only
        if "/usr/sbin/sge_execd" in self.started:
            self.qconf("-ke", self.host)
        if "/usr/sbin/sge_qmaster" in self.started:
            self.qconf("-km")
        self.started = []
