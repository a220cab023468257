"""Faults between two simulated hosts (tests/cluster/simulated_hosts.py) during a 2-rank training started
by the SGE job body, or by the README's multi-host line: the link cut in either direction, and a host
whose every process dies. Each must end the job: mpirun returns non-zero within distributed_stall_timeout
+ 60 s of the fault, and no rank is left running on either host. Without the launcher's keepalive options
(which mpirun-guard adds), mpirun never returned after a cut: it waited for its daemon behind the link.
Once the link is up again (or the host back), the same command resumes from the newest checkpoint and
finishes (checked after the mpi runs). Two runs start the daemon on host 1 by the real ssh client and
an sshd there (tests/cluster/ssh_logins.py) with the launch options as they are: the job script's cut
and the README line's; the others use the shell stand-in for ssh (tests/cluster/netns_agent.sh) with a
3 s keepalive, to keep the suite short. Fails (not skips) under CI=true where namespaces or OpenSSH are
unavailable."""
from __future__ import annotations

import re

import pytest

from cluster.fault_run import FaultRun
from cluster.simulated_hosts import SimulatedHosts
from cluster.ssh_logins import SshLogins
from prerequisites import require, require_module

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

STALL_TIMEOUT = 5
BOUND = STALL_TIMEOUT + 60  # the promise: mpirun returns within the stall timeout plus a minute
# ssh's keepalive as mpirun-guard sets it, 3 s apart instead of 10, for the runs with the stand-in for ssh
# (the real settings and ssh: the "ssh" and "documented" runs; the options: tests/test_mpi_launcher.py)
QUICK_SSH_ALIVE = {"PRTE_MCA_plm_ssh_args": "-o ServerAliveInterval=3 -o ServerAliveCountMax=3"}

CONFIG = """
task = "train"
# 200 steps an epoch: the fault lands mid-epoch, not in the epoch's checkpoint window (output lags the
# steps; with 100 steps of 5 ms, a loaded machine once saw epoch 2 end before the fault took effect)
train = {"class": "Task12AXDataset", "num_seqs": 8000, "fixed_random_seed": 1}
batch_size = 2000
max_seqs = 20
network = {"lstm": {"class": "rec", "unit": "NativeLstm2", "n_out": 32},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
optimizer = {"class": "adam"}
learning_rate = 0.01
# the fault lands in epoch 2 (the collectives then wait for the link); the rerun resumes from epoch 1's
# checkpoint and trains epochs 2 and 3 (from epoch 2's where the output lagged past the epoch's end)
num_epochs = 3
log_verbosity = 5
"""


def run_fault(tmp_path, backend: str, fault: str, host: int, resume: bool, launch: str = "agent") -> FaultRun:
    """The fault and the checks that it ended the job; with ``resume``, then the same command again, which
    must resume from the newest checkpoint the failed run left (epoch 1's, rarely 2's) and finish (the
    resume does not depend on the backend: the mpi runs check it, to keep the suite's time). ``launch``:
    "agent", the job script with the shell stand-in for ssh and a short keepalive; "ssh", the job script as
    it is, its daemons started by the real ssh client; "documented", the README's ``mpirun-guard mpirun
    --hostfile ...`` line, by the real ssh."""
    require("network namespaces (root, ip netns)", SimulatedHosts.unavailable())
    if launch != "agent":
        require("an OpenSSH client and server", SshLogins.unavailable())
    if backend == "horovod":
        require_module("horovod.tensorflow", "Horovod")
    overrides = ["++distributed_backend", backend, "++distributed_stall_timeout", str(STALL_TIMEOUT),
                 "++distributed_stall_warning", "2", "++checkpoint_interval", "500"]
    env = QUICK_SSH_ALIVE if launch == "agent" else {}
    with SimulatedHosts.create() as hosts:
        if launch != "agent":
            SshLogins.start(hosts, tmp_path / "ssh")
        run = FaultRun(hosts, tmp_path, CONFIG, overrides, env, ssh=launch != "agent")
        inject = {"cut": hosts.cut, "kill": hosts.kill_host}[fault]
        run.inject_when(r"train epoch 2, step 5,", lambda: inject(host))
        run.start(documented_line=launch == "documented")
        code = run.wait(timeout=120 + BOUND)
        # a rank behind the cut ends by its stall watchdog (or, waiting in a checkpoint window, by its
        # daemon's keepalive: up to a minute; docs/multi-node.md)
        left = run.ranks_left_after(BOUND)
        assert run.injected_at is not None, f"the run never reached the fault's step:\n{run.output}"
        print(f"{fault} host {host}, {backend}: mpirun exit {code} after {run.seconds_to_exit:.1f} s, "
              f"no rank left after {run.ranks_gone_after} s")  # the measurement, shown by pytest -rP
        assert code is not None, \
            f"mpirun still ran {run.seconds_to_exit:.0f} s after the fault:\n{run.output}"
        assert code != 0, run.output
        took = run.seconds_to_exit
        assert took <= BOUND, f"mpirun returned {took:.0f} s after the fault:\n{run.output}"
        assert not left, f"ranks still running {BOUND} s after the fault: {left}\n{run.output}"
        if not resume:
            return run
        # the newest checkpoint the failed run left: epoch 1's, or epoch 2's where the output lagged the
        # steps so far that the epoch ended before the fault took effect (seen on a loaded machine)
        saved = sorted(int(p.name[4:]) for p in tmp_path.glob("net.[0-9][0-9][0-9]"))
        assert saved and saved[-1] in (1, 2), f"checkpoints after the fault: {saved}\n{run.output}"
        if fault == "cut":
            hosts.reconnect(host)
        # a killed host is back
        again = FaultRun(hosts, tmp_path, CONFIG, overrides, env, ssh=launch != "agent")
        again.start(documented_line=launch == "documented")
        assert again.wait(timeout=180) == 0, again.output
    newest = tmp_path / f"net.{saved[-1]:03d}"
    assert f"resuming after epoch {saved[-1]} from {newest}" in again.output, again.output
    assert "finished training after epoch 3" in again.output, again.output
    return run


# the tf backend also on the newest TensorFlow, where it is what replaces Horovod: its collectives go
# through TensorFlow's gRPC, whose behaviour behind a cut link is TensorFlow's own
# the mpi run is the job script's own launch line, unchanged: its keepalive options, the real ssh client
@pytest.mark.parametrize("backend, host, launch", [
    ("mpi", 1, "ssh"), ("horovod", 0, "agent"),
    pytest.param("tf", 1, "agent", marks=[pytest.mark.tf_latest, pytest.mark.tf_latest_mpi])])
def test_a_cut_link_ends_the_job(tmp_path, backend, host, launch):
    run = run_fault(tmp_path, backend, "cut", host, resume=backend == "mpi", launch=launch)
    # rank 0's watchdog names the rank behind the cut (unless ssh's keepalive ended the job first)
    assert ("rank 1 (host simhost1) did not reach collective" in run.output
            or "Remote host:   simhost1" in run.output), run.output


def test_a_cut_link_ends_the_documented_mpirun_line(tmp_path):
    """The README's multi-host line, not the job scripts: mpirun-guard gives mpirun ssh's keepalive, the
    real ssh client gives up on the cut host, and mpirun ends (a plain mpirun line waited for ever)."""
    run = run_fault(tmp_path, "mpi", "cut", 1, resume=False, launch="documented")
    assert "mpirun_guard: Open MPI 5" in run.output and "adding plm_ssh_args" in run.output, run.output


def test_a_dead_host_ends_the_job(tmp_path):
    run = run_fault(tmp_path, "mpi", "kill", 1, resume=True)
    # mpirun ends it at once, and would exit 0: the job script's mpirun_guard.py names the host and exits 1
    assert "mpirun lost its daemon on simhost1 (rank 1) and ended the job" in run.output, run.output
    assert run.seconds_to_exit < 5, run.output


SLOW_CONFIG = """
task = "train"
train = {"class": "Task12AXDataset", "num_seqs": 40, "fixed_random_seed": 1}
batch_size = 2000
max_seqs = 20
# 1.07 M parameters: 4.3 MB of gradients, about 10 s a step over 4 Mbit/s, longer than the stall timeout
network = {"lstm": {"class": "rec", "unit": "NativeLstm2", "n_out": 512},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
optimizer = {"class": "adam"}
learning_rate = 0.01
num_epochs = 1
log_verbosity = 5
"""


def test_a_slow_link_that_carries_a_large_reduction_is_not_a_stall(tmp_path):
    require("network namespaces (root, ip netns)", SimulatedHosts.unavailable())
    require("tc (iproute2)", SimulatedHosts.tc_unavailable())
    timeout = 6  # with 4 s, a trace of the train step under load outlasted it once
    with SimulatedHosts.create() as hosts:
        hosts.limit_rate(4e6)
        run = FaultRun(hosts, tmp_path, SLOW_CONFIG, [
            "++distributed_stall_timeout", str(timeout), "++distributed_stall_warning", "2"])
        run.start()
        code = run.wait(timeout=150)
    assert code == 0, run.output
    assert "finished training after epoch 1" in run.output, run.output
    seconds = [float(s) for s in re.findall(r"train epoch 1, step \d+, .*?, ([\d.]+) sec/step", run.output)]
    assert seconds and min(seconds) > 1.4 * timeout, f"steps of {seconds} s, stall timeout {timeout} s"
