"""Where bench_chaos.py runs its job, and the faults only a job across hosts can take.

  LocalJob            2 ranks on this machine: ``supervise -- mpirun -np 2 python rnn.py CONFIG``.
  SimulatedHostsJob   2 simulated hosts (tests/cluster/simulated_hosts.py), one rank each, started the way
                      SGE starts the job (``tools/qsub_train.sh --run`` with ``MAX_RESTARTS``, so with the
                      job scripts' launcher settings, ``mpirun_guard`` and ``supervise``). Its own faults:
                      a cut link (taken up again once the job has ended: a link that flapped) and a dead
                      host (every process of host 1, its MPI daemon included; the host is back for the
                      restart, as after a reboot).
Both run their command in a session of its own, writing to the given log.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from timing import ROOT  # the script's own directory is on sys.path

sys.path.insert(0, os.path.join(ROOT, "tests"))
from cluster.simulated_hosts import AGENT, SUBNET, SimulatedHosts  # noqa: E402

BIN = Path(sys.executable).parent
ONE_HOST_FAULTS = ("kill", "preempt", "stall", "truncate")
HOST_FAULTS = ("cut", "hostkill")
# the job's attempt has ended: supervise says what follows (a restart, giving up, the requeue)
ATTEMPT_ENDED = re.compile(rb"supervise: \S+ \S+ command (ended|stopped) ")


def job_env(extra: dict | None = None) -> dict:
    return dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
                OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
                PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(extra or {}))


class LocalJob:
    kinds = ONE_HOST_FAULTS
    where = "2 ranks on this host"

    def start(self, config: Path, log) -> subprocess.Popen:
        command = [str(BIN / "supervise"), "--backoff", "0.5", "--max-restarts", "20", "--",
                   str(BIN / "mpirun"), "--oversubscribe", "--bind-to", "none", "--map-by", "slot",
                   "-np", "2", sys.executable, os.path.join(ROOT, "rnn.py"), str(config)]
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=job_env(),
                                start_new_session=True)

    def close(self) -> None:
        pass


class SimulatedHostsJob:
    kinds = ONE_HOST_FAULTS + HOST_FAULTS
    where = "2 simulated hosts, one rank each, started as SGE's job body (tools/qsub_train.sh --run)"
    # seconds supervise waits before a restart: the cut link is up again by then (it is taken up as soon
    # as supervise logs the attempt's end)
    backoff = 2.0

    def __init__(self) -> None:
        why = SimulatedHosts.unavailable()
        if why:
            sys.exit(f"bench_chaos: 2 simulated hosts cannot be made here: {why}. Run as root, or run the "
                     f"one-host faults only: --hosts local")
        self.hosts = SimulatedHosts.create()

    def start(self, config: Path, log) -> subprocess.Popen:
        folder = config.parent
        pe_hostfile = folder / "pe_hostfile"  # what SGE would grant: one slot on each host
        pe_hostfile.write_text("".join(f"{h.address} 1 all.q@{h.hostname} UNDEFINED\n"
                                       for h in self.hosts.hosts))
        env = job_env({
            "PE_HOSTFILE": str(pe_hostfile), "JOB_ID": "chaos", "TMPDIR": str(folder),
            "PYTHON": sys.executable, "MAX_RESTARTS": "20", "RESTART_BACKOFF": str(self.backoff),
            "SIMULATED_HOSTS": self.hosts.agent_map,
            "MPIRUN_ARGS": f"--prtemca plm_ssh_agent {AGENT} --prtemca oob_tcp_if_include {SUBNET} "
                           f"--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include {SUBNET}"})
        job = [os.path.join(ROOT, "tools", "qsub_train.sh"), "--run", str(config), "2"]
        return subprocess.Popen(self.hosts.command_on(0, job), cwd=folder, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def inject(self, fault: str, side: int, log_path: Path, offset: int) -> str:
        """A cut of host ``side``'s end of the link, up again once the job's attempt has ended; or every
        process of host 1 killed (host 0 runs mpirun and supervise: its death is the scheduler's to
        handle)."""
        if fault == "hostkill":
            return f"SIGKILL to every process of simhost1 ({len(self.hosts.kill_host(1))} processes)"
        self.hosts.cut(side)
        cut_at = time.monotonic()
        try:
            ended = _wait_in_log(log_path, offset, ATTEMPT_ENDED, timeout=300)
        finally:
            self.hosts.reconnect(side)
        waited = f"up again {time.monotonic() - cut_at:.0f} s later, when the job had ended" if ended else \
            "up again after 300 s: the job had not ended"
        return f"link cut at simhost{side}, {waited}"

    def close(self) -> None:
        self.hosts.remove()


def _wait_in_log(log_path: Path, offset: int, pattern: re.Pattern, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, "rb") as f:
            f.seek(offset)
            if pattern.search(f.read()):
                return True
        time.sleep(0.1)
    return False
