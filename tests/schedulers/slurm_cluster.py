"""A one-node SLURM cluster for tests: its own munged, slurmctld and slurmd, with their sockets, ports,
state and logs in one folder, so that it disturbs nothing else on the machine and leaves nothing behind.

No cgroups (``proctrack/linuxproc``, ``task/none``): containers and CI machines rarely delegate them.
Timers are short so that a requeued job starts again within seconds (``cred_expire`` is also how long
a requeued job waits; the main scheduler pass, which starts it then, runs every ``sched_interval``
seconds, 60 by default) and a node that stopped answering is noticed quickly."""
from __future__ import annotations

import os
import pwd
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from engine.distributed.ports import reserve_port  # the daemons bind them later: kept from others
from schedulers import packages
from schedulers.packages import wait_until

CONF = """\
ClusterName=enginetest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.sock,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
KillWait=5
InactiveLimit=0
MinJobAge=600
JobRequeue=1
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """``start()`` returns None when the node is idle, else why it could not start; ``stop()`` always."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.host = socket.gethostname().split(".")[0]
        self.conf = folder / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    def start(self) -> str | None:
        why = packages.ensure(["munged", "slurmctld", "slurmd", "sbatch"], ["slurm-wlm", "munge"])
        if why:
            return why
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(CONF.format(host=self.host, folder=self.folder, ctld_port=reserve_port(),
                                         slurmd_port=reserve_port()))
        f = self.folder
        self._spawn(["munged", "-F", "--force", f"--key-file={key}", f"--socket={f}/munge.sock",
                     f"--pid-file={f}/munged.pid", f"--log-file={f}/munged.log",
                     f"--seed-file={f}/munge.seed"])
        if not wait_until(lambda: (f / "munge.sock").exists(), 60):
            return f"munged did not start: {self.tail('munged.log')}"
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)])
        self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", self.host])
        if not wait_until(lambda: self.node_state() == "idle", 180):
            return (f"the SLURM node did not become idle (state {self.node_state()!r}): "
                    f"slurmctld: {self.tail('slurmctld.log')} slurmd: {self.tail('slurmd.log')}")
        return None

    def _spawn(self, cmd: list[str]) -> None:
        log = open(self.folder / f"{cmd[0]}.out", "ab")
        self.daemons.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             env=dict(os.environ, **self.env), start_new_session=True))

    def tail(self, name: str, lines: int = 3) -> str:
        path = self.folder / name
        text = path.read_text(errors="replace").strip().splitlines() if path.exists() else ["(no log)"]
        return " | ".join(text[-lines:])

    def command(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **self.env))

    def node_state(self) -> str:
        r = self.command("sinfo", "-h", "-n", self.host, "-o", "%T", timeout=15)
        return r.stdout.strip() if r.returncode == 0 else ""

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        r = self.command("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def wait_job(self, job_id: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info = self.job(job_id)
        while info.get("JobState") not in states and time.monotonic() < deadline:
            time.sleep(1)
            info = self.job(job_id)
        return info

    def stop(self) -> None:
        if self.daemons:
            self.command("scancel", "--full", "-u", pwd.getpwuid(os.getuid()).pw_name)
            wait_until(lambda: not self.command("squeue", "-h").stdout.strip(), 20)
        for proc in reversed(self.daemons):  # slurmd, slurmctld, then munged
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.daemons = []
