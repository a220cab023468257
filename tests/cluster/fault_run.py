"""A 2-host training started the way the SGE job script starts it (``tools/qsub_train.sh --run``, so
through ``mpirun-guard`` and the launcher settings it adds), or by the multi-host line the README and
docs/multi-node.md show (``mpirun-guard mpirun --hostfile ...``), with a fault injected when a line of its
output appears:

    run = FaultRun(hosts, tmp_path, config, ["++distributed_stall_timeout", "5"])
    run.start(); run.inject_when("train epoch 2, step", lambda: hosts.cut(1)); run.wait(120)
    run.seconds_to_exit, run.ranks_left_after(30)

mpirun starts its daemon on host 1 with the real ssh client against the host's sshd when ``ssh=True``
(tests/cluster/ssh_logins.py must be running), else with tests/cluster/netns_agent.sh, a shell stand-in
that acts out ssh's ServerAlive options. Times are taken from the moment the fault was injected.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from cluster.simulated_hosts import AGENT, SUBNET, SimulatedHosts
from helpers import BIN, ROOT, child_env


class FaultRun:
    def __init__(self, hosts: SimulatedHosts, workdir: Path, config: str, overrides: list[str],
                 env: dict[str, str] | None = None, ssh: bool = False) -> None:
        """``env``: more environment for the job (e.g. ``PRTE_MCA_plm_ssh_args``); ``ssh``: real ssh."""
        self.hosts = hosts
        self.env = env or {}
        self.ssh = ssh
        self.workdir = workdir
        self.config = workdir / "faults.py"
        self.config.write_text(config)
        self.overrides = overrides
        self.lines: list[str] = []
        self.injected_at: float | None = None
        self.exited_at: float | None = None
        self.ranks_gone_after: float | None = None  # seconds from the fault until no rank was left
        self.proc: subprocess.Popen | None = None
        self._trigger: tuple[re.Pattern, Callable[[], object]] | None = None
        self._reader: threading.Thread | None = None

    def inject_when(self, pattern: str, fault: Callable[[], object]) -> None:
        """Call ``fault`` as soon as an output line matches ``pattern`` (once)."""
        self._trigger = (re.compile(pattern), fault)

    def start(self, documented_line: bool = False) -> None:
        """Start the job script's body, or with ``documented_line`` the README's mpirun line."""
        pe_hostfile = self.workdir / "pe_hostfile"  # what SGE would grant: one slot on each host
        pe_hostfile.write_text("".join(f"{h.address} 1 all.q@{h.hostname} UNDEFINED\n"
                                       for h in self.hosts.hosts))
        # the test network's interfaces (docs/multi-node.md, section 9), and how to reach host 1
        network = ([] if self.ssh else ["--prtemca", "plm_ssh_agent", str(AGENT)]) + [
            "--prtemca", "oob_tcp_if_include", SUBNET, "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
            "--mca", "btl_tcp_if_include", SUBNET]
        env = child_env({
            "PE_HOSTFILE": str(pe_hostfile), "JOB_ID": "faults", "TMPDIR": str(self.workdir),
            "PYTHON": sys.executable, "SIMULATED_HOSTS": self.hosts.agent_map,
            "MPIRUN_ARGS": " ".join(network), **self.env,
        })
        train = [str(self.config), "++model", str(self.workdir / "net"), *self.overrides]
        if documented_line:
            hostfile = self.workdir / "hosts"
            hostfile.write_text("".join(f"{h.address} slots=1\n" for h in self.hosts.hosts))
            # README / docs/multi-node.md: mpirun-guard mpirun --hostfile hosts -np 2 --bind-to none
            # --map-by slot -x PATH ... python rnn.py CONFIG ++use_horovod 1 (.venv/bin/mpirun-guard is
            # tools/mpirun_guard.py; the -x of the test's thread settings keep the 2-core machine usable)
            job = [sys.executable, str(ROOT / "tools" / "mpirun_guard.py"), str(BIN / "mpirun"),
                   "--hostfile", str(hostfile), "-np", "2", "--bind-to", "none", "--map-by", "slot",
                   "-x", "PATH", "-x", "TF_NUM_INTRAOP_THREADS", "-x", "TF_NUM_INTEROP_THREADS", *network,
                   sys.executable, str(ROOT / "rnn.py"), train[0], "++use_horovod", "1", *train[1:]]
        else:
            job = [str(ROOT / "tools" / "qsub_train.sh"), "--run", train[0], "2", *train[1:]]
        self.proc = subprocess.Popen(self.hosts.command_on(0, job), cwd=self.workdir, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     errors="replace")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.replace("\0", ""))
            if self._trigger is not None and self.injected_at is None and self._trigger[0].search(line):
                self._trigger[1]()
                self.injected_at = time.monotonic()

    def wait(self, timeout: float) -> int | None:
        """mpirun's exit code, or None when it still ran after ``timeout`` seconds (then it is killed)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            code = None
        self.exited_at = time.monotonic()
        self._reader.join(timeout=10)
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def seconds_to_exit(self) -> float:
        assert self.injected_at is not None, f"the fault was never injected:\n{self.output}"
        return self.exited_at - self.injected_at

    def ranks_left_after(self, seconds: float) -> list[str]:
        """The ranks (rnn.py processes) still running on either host once ``seconds`` have passed since
        the fault, as 'host: pid'; waits no longer than that."""
        deadline = (self.injected_at or time.monotonic()) + seconds
        while True:
            left = [f"{self.hosts.hosts[i].hostname}: {pid}" for i in range(len(self.hosts.hosts))
                    for pid in self.hosts.pids(i) if _is_rank(pid)]
            if not left or time.monotonic() >= deadline:
                if not left:
                    self.ranks_gone_after = time.monotonic() - (self.injected_at or time.monotonic())
                return left
            time.sleep(0.5)


def _is_rank(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline") as f:
            return "rnn.py" in f.read()
    except OSError:
        return False
