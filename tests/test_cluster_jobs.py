"""The job scripts tools/qsub_train.sh and tools/sbatch_train.sh, run with stand-ins for qsub, sbatch,
srun, scontrol and mpirun (tests/cluster/standin.py): the scheduler options, the hostfile and the mpirun
line, the scheduler's warning signal passed on to mpirun, requeueing on exit status 99, restarts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.tf_latest

STANDIN = ROOT / "tests" / "cluster" / "standin.py"
CONFIG = "configs/12ax.py"


class Cluster:
    """A fake scheduler in ``tmp_path``: stand-in commands first on PATH, their calls recorded."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for command in ("qsub", "sbatch", "srun", "scontrol", "mpirun"):
            self._script(command, f'exec "{sys.executable}" "{STANDIN}" {command} "$@"')
        # The interpreter the job uses; the job takes the mpirun beside it, as beside a venv's python.
        self._script("python", f'exec "{sys.executable}" "$@"')
        self.record = tmp_path / "record.jsonl"
        self.spool = tmp_path / "spool"
        # No scheduler variables of a job the tests might run in, nor the scripts' settings.
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "PE_", "OMPI_", "ENGINE_", "MPIRUN", "RANK_ENV"))}
        self.env.update(PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}", FAKE_RECORD=str(self.record),
                        FAKE_SPOOL=str(self.spool), PYTHON=str(self.bin / "python"))

    def _script(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def submit(self, script: str, args: list[str], **env: str) -> subprocess.CompletedProcess:
        """Run ``tools/<script> ARGS`` from the repository root, as a user on the login node."""
        return subprocess.run([str(ROOT / "tools" / script), *args], cwd=ROOT, capture_output=True, text=True,
                              env={**self.env, "LOG_DIR": str(self.tmp / "log"), **env}, timeout=60)

    def calls(self, command: str) -> list[dict]:
        if not self.record.exists():
            return []
        entries = [json.loads(line) for line in self.record.read_text().splitlines()]
        return [e for e in entries if e["command"] == command]

    def job_status(self) -> int:
        return int((self.spool / "job_status").read_text())

    def job_output(self) -> str:
        return "".join(p.read_text() for p in (self.tmp / "log").iterdir())


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def expected_mpirun_tail(cluster: Cluster, extra: list[str]) -> list[str]:
    return [str(cluster.bin / "python"), str(ROOT / "rnn.py"), CONFIG, "++use_horovod", "1", *extra]


def check_mpirun(cluster: Cluster, num_ranks: int, extra: list[str]) -> dict:
    (call,) = cluster.calls("mpirun")
    args = call["args"][call["args"].index("--hostfile"):]  # after the launcher's keepalive options
    assert args[:8] == ["--hostfile", args[1], "-np", str(num_ranks), "--bind-to", "none", "--map-by", "slot"]
    # the hostfile lies in a fresh private directory (mktemp -d), removed at the end of the job
    hostfile_dir = Path(args[1]).parent
    assert hostfile_dir.name.startswith("engine-hosts.") and call["hostfile_dir_mode"] == 0o700
    assert not hostfile_dir.exists()
    tail = expected_mpirun_tail(cluster, extra)
    assert args[-len(tail):] == tail
    assert ["-x", "PATH"] in [args[i:i + 2] for i in range(len(args) - 1)]
    assert call["cwd"] == str(ROOT)  # the job runs where it was submitted
    return call


def test_qsub_script_submits_to_the_mpi_pe_and_runs_mpirun_on_the_granted_hosts(cluster, tmp_path):
    prologue = tmp_path / "prologue.sh"
    prologue.write_text("export MY_CORPUS_DIR=/data/corpus\n")
    pe_hostfile = ("node01.cluster 2 all.q@node01.cluster UNDEFINED\n"
                   "node02.cluster 1 all.q@node02.cluster UNDEFINED\n"
                   "node02.cluster 1 long.q@node02.cluster UNDEFINED\n")
    result = cluster.submit("qsub_train.sh", [CONFIG, "4", "++num_epochs", "3"], FAKE_PE_HOSTFILE=pe_hostfile,
                            ENGINE_PROLOGUE=str(prologue), RANK_ENV="MY_CORPUS_DIR",
                            QSUB_ARGS="-l h_rt=1:00:00")
    assert result.returncode == 0, result.stderr
    assert "Your job 4711" in result.stdout
    assert cluster.job_status() == 0, cluster.job_output()

    (qsub,) = cluster.calls("qsub")
    args = qsub["args"]
    assert args[args.index("-pe") + 1:args.index("-pe") + 3] == ["mpi", "4"]
    assert {"-V", "-cwd", "-notify"} <= set(args) and args[args.index("-S") + 1] == "/bin/bash"
    assert args[args.index("-l") + 1] == "h_rt=1:00:00"
    assert args[-6:] == [str(ROOT / "tools" / "qsub_train.sh"), "--run", CONFIG, "4", "++num_epochs", "3"]

    call = check_mpirun(cluster, 4, ["++num_epochs", "3"])
    assert call["hostfile"] == "node01.cluster slots=2\nnode02.cluster slots=2\n"
    assert "-x MY_CORPUS_DIR" in " ".join(call["args"]) and call["env"]["MY_CORPUS_DIR"] == "/data/corpus"
    assert "on node01.cluster node02.cluster" in cluster.job_output()
    # ssh starts the daemons here (no SGE_ROOT): ssh's keepalive lets mpirun end when a host is cut off
    alive = "-o ServerAliveInterval=10 -o ServerAliveCountMax=3"
    assert f"--prtemca|plm_ssh_args|{alive}" in "|".join(call["args"])
    assert "--prtemca|oob_tcp_keepalive_time|30" in "|".join(call["args"])


def test_qsub_job_with_too_few_slots_fails_before_mpirun(cluster):
    result = cluster.submit("qsub_train.sh", [CONFIG, "4"], SGE_PE="mpi_fill",
                            FAKE_PE_HOSTFILE="node01 2 all.q@node01 UNDEFINED\n")
    assert result.returncode == 0
    assert cluster.job_status() != 0
    assert "4 ranks were asked for, but PE_HOSTFILE" in cluster.job_output()
    assert "grants only 2 slots on 1 host(s) (node01:2)" in cluster.job_output()
    assert cluster.calls("mpirun") == []
    assert cluster.calls("qsub")[0]["args"][2:5] == ["-pe", "mpi_fill", "4"]


def test_sbatch_script_with_mpirun_converts_the_slurm_node_list(cluster):
    result = cluster.submit("sbatch_train.sh", [CONFIG, "5", "++learning_rate", "0.001"],
                            FAKE_SLURM_NODELIST="gpu[07-08],cpu3", FAKE_SLURM_TASKS_PER_NODE="2(x2),1",
                            NODES="3", GPUS_PER_TASK="1", SBATCH_ARGS="--time=2:00:00")
    assert result.returncode == 0, result.stderr
    assert cluster.job_status() == 0, cluster.job_output()
    (sbatch,) = cluster.calls("sbatch")
    assert sbatch["args"] == ["--job-name=train-12ax", "--ntasks=5", f"--output={cluster.tmp}/log/%x.%j.out",
                              "--open-mode=append", "--signal=B:USR1@300", "--requeue",
                              "--nodes=3", "--gpus-per-task=1", "--time=2:00:00",
                              str(ROOT / "tools" / "sbatch_train.sh"), "--run", CONFIG, "5",
                              "++learning_rate", "0.001"]
    call = check_mpirun(cluster, 5, ["++learning_rate", "0.001"])
    assert call["hostfile"] == "gpu07 slots=2\ngpu08 slots=2\ncpu3 slots=1\n"
    # under SLURM Open MPI starts its daemons with srun: no ssh options, the daemons' keepalive only
    assert "plm_ssh_args" not in call["args"] and "oob_tcp_keepalive_time" in call["args"]
    assert cluster.calls("srun") == []


def test_sbatch_script_with_srun_launcher(cluster):
    result = cluster.submit("sbatch_train.sh", [CONFIG, "4"], FAKE_SLURM_NODELIST="node[1-2]",
                            FAKE_SLURM_TASKS_PER_NODE="2(x2)", LAUNCHER="srun", TASKS_PER_NODE="2")
    assert result.returncode == 0, result.stderr
    assert cluster.job_status() == 0, cluster.job_output()
    assert "--ntasks-per-node=2" in cluster.calls("sbatch")[0]["args"]
    (srun,) = cluster.calls("srun")
    assert srun["args"] == ["--mpi=pmix", "--ntasks=4", *expected_mpirun_tail(cluster, [])]
    assert cluster.calls("mpirun") == []


@pytest.mark.parametrize("script", ["qsub_train.sh", "sbatch_train.sh"])
@pytest.mark.parametrize("args, message", [
    (["configs/missing.py", "2"], "config file 'configs/missing.py' not found"),
    ([CONFIG, "two"], "NUM_RANKS is 'two'; expected a positive integer"),
    ([CONFIG], "expected CONFIG NUM_RANKS"),
])
def test_job_scripts_reject_bad_arguments_before_submitting(cluster, script, args, message):
    result = cluster.submit(script, args)
    assert result.returncode == 2
    assert message in result.stderr
    assert cluster.calls("qsub") == [] and cluster.calls("sbatch") == []


@pytest.mark.parametrize("script, variable", [("qsub_train.sh", "$PE_HOSTFILE"),
                                              ("sbatch_train.sh", "$SLURM_JOB_NODELIST")])
def test_run_outside_an_allocation_says_how_to_submit(cluster, script, variable):
    result = cluster.submit(script, ["--run", CONFIG, "2"])
    assert result.returncode == 2
    assert f"{variable} is not set" in result.stderr and f"tools/{script} CONFIG NUM_RANKS" in result.stderr


# ----- stop signals, requeueing, restarts -----

ONE_HOST_PE = "node01 2 all.q@node01 UNDEFINED\n"


def test_sbatch_warning_signal_reaches_mpirun_and_the_job_is_requeued(cluster):
    """SLURM signals only the job's shell (--signal=B:...); the shell passes it on to mpirun, whose ranks
    save a checkpoint and exit 99; the job then requeues itself."""
    result = cluster.submit("sbatch_train.sh", [CONFIG, "2"], FAKE_SLURM_NODELIST="node1",
                            FAKE_SLURM_TASKS_PER_NODE="2", SIGNAL_SECONDS="600",
                            FAKE_SIGNAL_JOB="warning", FAKE_MPIRUN_OUTCOMES="wait-signal")
    assert result.returncode == 0, result.stderr
    assert "--signal=B:USR1@600" in cluster.calls("sbatch")[0]["args"]
    (signals,) = cluster.calls("mpirun-signals")
    assert signals["received"] == ["SIGUSR1"], cluster.job_output()
    assert cluster.job_status() == 99
    (requeue,) = cluster.calls("scontrol")
    assert requeue["args"] == ["requeue", "4712"]
    assert "requeueing the job, it resumes when it runs again" in cluster.job_output()


def test_sigterm_to_the_job_shell_reaches_mpirun_as_sigusr2(cluster):
    """mpirun would kill the ranks within half a second of a SIGTERM: the shell asks them with SIGUSR2."""
    result = cluster.submit("sbatch_train.sh", [CONFIG, "2"], FAKE_SLURM_NODELIST="node1",
                            FAKE_SLURM_TASKS_PER_NODE="2", FAKE_SIGNAL_JOB="SIGTERM",
                            FAKE_MPIRUN_OUTCOMES="wait-signal")
    assert result.returncode == 0, result.stderr
    assert cluster.calls("mpirun-signals")[0]["received"] == ["SIGUSR2"], cluster.job_output()
    assert cluster.job_status() == 99 and len(cluster.calls("scontrol")) == 1


def test_qsub_notify_warning_is_survived_and_the_job_exits_99_to_be_rescheduled(cluster):
    """SGE's -notify sends SIGUSR2 to the whole job: the shell must not die of it (its default action),
    and ends with the ranks' 99, which makes SGE reschedule the job."""
    result = cluster.submit("qsub_train.sh", [CONFIG, "2"], FAKE_PE_HOSTFILE=ONE_HOST_PE,
                            FAKE_SIGNAL_JOB="warning", FAKE_MPIRUN_OUTCOMES="wait-signal")
    assert result.returncode == 0, result.stderr
    assert "-notify" in cluster.calls("qsub")[0]["args"]
    received = cluster.calls("mpirun-signals")[0]["received"]
    assert received and set(received) == {"SIGUSR2"}, cluster.job_output()  # directly, and passed on
    assert cluster.job_status() == 99, cluster.job_output()
    assert "exit status 99 makes SGE reschedule the job" in cluster.job_output()


def test_warning_and_requeue_can_be_turned_off(cluster):
    result = cluster.submit("sbatch_train.sh", [CONFIG, "2"], FAKE_SLURM_NODELIST="node1",
                            FAKE_SLURM_TASKS_PER_NODE="2", SIGNAL_SECONDS="0", REQUEUE="0",
                            FAKE_MPIRUN_OUTCOMES="99")
    assert result.returncode == 0, result.stderr
    args = cluster.calls("sbatch")[0]["args"]
    assert not [a for a in args if a.startswith(("--signal", "--requeue"))]
    assert cluster.job_status() == 99 and cluster.calls("scontrol") == []
    result = cluster.submit("qsub_train.sh", [CONFIG, "2"], FAKE_PE_HOSTFILE=ONE_HOST_PE,
                            SGE_NOTIFY="0")
    assert result.returncode == 0 and "-notify" not in cluster.calls("qsub")[0]["args"], result.stderr


@pytest.mark.parametrize("script, env", [
    ("qsub_train.sh", {"FAKE_PE_HOSTFILE": ONE_HOST_PE}),
    ("sbatch_train.sh", {"FAKE_SLURM_NODELIST": "node1", "FAKE_SLURM_TASKS_PER_NODE": "2"}),
])
def test_max_restarts_reruns_mpirun_under_the_supervisor(cluster, script, env):
    result = cluster.submit(script, [CONFIG, "2"], MAX_RESTARTS="2", RESTART_BACKOFF="0",
                            FAKE_MPIRUN_OUTCOMES="137,0", **env)
    assert result.returncode == 0, result.stderr
    assert cluster.job_status() == 0, cluster.job_output()
    assert len(cluster.calls("mpirun")) == 2
    output = cluster.job_output()
    assert ("tools/supervise.py --max-restarts 2 --backoff 0 -- " in output
            and f"tools/mpirun_guard.py {cluster.bin / 'mpirun'}" in output), output
    assert "exit code 137 (128 + SIGKILL) (attempt 1 of 3); restart 1 of 2 in 0 s." in output


@pytest.mark.parametrize("setting, message", [
    ({"MAX_RESTARTS": "many"}, "MAX_RESTARTS is 'many'; expected a number"),
])
def test_bad_restart_setting_is_refused_in_the_job(cluster, setting, message):
    result = cluster.submit("sbatch_train.sh", [CONFIG, "2"], FAKE_SLURM_NODELIST="node1",
                            FAKE_SLURM_TASKS_PER_NODE="2", **setting)
    assert result.returncode == 0
    assert cluster.job_status() == 2 and message in cluster.job_output()
    assert cluster.calls("mpirun") == []


@pytest.mark.parametrize("setting, message", [
    ({"SIGNAL_SECONDS": "5m"}, "SIGNAL_SECONDS is '5m'; expected seconds"),
    ({"REQUEUE": "yes"}, "REQUEUE is 'yes'; expected 1 or 0"),
])
def test_bad_signal_settings_are_refused_before_submitting(cluster, setting, message):
    result = cluster.submit("sbatch_train.sh", [CONFIG, "2"], **setting)
    assert result.returncode == 2 and message in result.stderr
    assert cluster.calls("sbatch") == []


@pytest.mark.parametrize("env, ssh_args", [
    ({"SGE_ROOT": "/opt/sge", "ARC": "lx-amd64"}, False),  # qrsh starts the daemons: no ssh options
    ({"SGE_ROOT": "/opt/sge", "ARC": "lx-amd64", "MPIRUN_ARGS": "--prtemca plm_ssh_disable_qrsh 1"}, True),
    ({"PRTE_MCA_plm_ssh_args": "-o ServerAliveInterval=3"}, False),  # the user's own ssh options win
])
def test_ssh_keepalive_options_only_where_ssh_starts_the_daemons(cluster, env, ssh_args):
    result = cluster.submit("qsub_train.sh", [CONFIG, "2"], FAKE_PE_HOSTFILE=ONE_HOST_PE, **env)
    assert result.returncode == 0 and cluster.job_status() == 0, cluster.job_output()
    (call,) = cluster.calls("mpirun")
    assert ("plm_ssh_args" in call["args"]) == ssh_args, call["args"]
    assert "oob_tcp_keepalive_time" in call["args"]


OPEN_MPI_4 = "mpirun (Open MPI) 4.1.5\n\nReport bugs to http://www.open-mpi.org/community/help/"
HYDRA = "HYDRA build details:\n    Version:                                 4.1.2\n"


@pytest.mark.parametrize("version, options, note", [
    (OPEN_MPI_4, ["--mca", "plm_rsh_args", "-o ServerAliveInterval=10 -o ServerAliveCountMax=3", "--mca",
                  "oob_tcp_keepalive_time", "30", "--mca", "oob_tcp_keepalive_intvl", "10", "--mca",
                  "oob_tcp_keepalive_probes", "3"], "Open MPI 4.1.5 (ORTE): adding plm_rsh_args"),
    (HYDRA, [], "MPICH Hydra 4.1.2: no keepalive options"),
])
def test_each_launcher_gets_its_own_keepalive_options(cluster, version, options, note):
    """Open MPI 4's mpirun would reject PRRTE's --prtemca, MPICH's any of them."""
    result = cluster.submit("qsub_train.sh", [CONFIG, "2"], FAKE_PE_HOSTFILE=ONE_HOST_PE,
                            FAKE_MPIRUN_VERSION=version)
    assert result.returncode == 0 and cluster.job_status() == 0, cluster.job_output()
    (call,) = cluster.calls("mpirun")
    assert call["args"][:call["args"].index("--hostfile")] == options
    assert f"mpirun_guard: {note}" in cluster.job_output()


def test_a_site_s_mca_parameter_file_setting_is_kept_and_reported(cluster, tmp_path):
    home = tmp_path / "home"
    (home / ".prte").mkdir(parents=True)
    (home / ".prte" / "mca-params.conf").write_text("plm_ssh_args = -o ServerAliveInterval=20\n")
    result = cluster.submit("qsub_train.sh", [CONFIG, "2"], FAKE_PE_HOSTFILE=ONE_HOST_PE, HOME=str(home))
    assert result.returncode == 0 and cluster.job_status() == 0, cluster.job_output()
    (call,) = cluster.calls("mpirun")
    assert "plm_ssh_args" not in call["args"] and "oob_tcp_keepalive_time" in call["args"]
    assert (f"mpirun_guard: plm_ssh_args is set in {home / '.prte' / 'mca-params.conf'} "
            "('-o ServerAliveInterval=20'): kept") in cluster.job_output()
