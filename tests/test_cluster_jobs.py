"""The job scripts tools/qsub_train.sh and tools/sbatch_train.sh, run with stand-ins for qsub, sbatch,
srun and mpirun (tests/cluster/standin.py): the scheduler options, the hostfile and the mpirun line."""
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
        for command in ("qsub", "sbatch", "srun", "mpirun"):
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
    args = call["args"]
    assert args[:8] == ["--hostfile", args[1], "-np", str(num_ranks), "--bind-to", "none", "--map-by", "slot"]
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
    assert {"-V", "-cwd"} <= set(args) and args[args.index("-S") + 1] == "/bin/bash"
    assert args[args.index("-l") + 1] == "h_rt=1:00:00"
    assert args[-6:] == [str(ROOT / "tools" / "qsub_train.sh"), "--run", CONFIG, "4", "++num_epochs", "3"]

    call = check_mpirun(cluster, 4, ["++num_epochs", "3"])
    assert call["hostfile"] == "node01.cluster slots=2\nnode02.cluster slots=2\n"
    assert "-x MY_CORPUS_DIR" in " ".join(call["args"]) and call["env"]["MY_CORPUS_DIR"] == "/data/corpus"
    assert "on node01.cluster node02.cluster" in cluster.job_output()


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
                              "--nodes=3", "--gpus-per-task=1", "--time=2:00:00",
                              str(ROOT / "tools" / "sbatch_train.sh"), "--run", CONFIG, "5",
                              "++learning_rate", "0.001"]
    call = check_mpirun(cluster, 5, ["++learning_rate", "0.001"])
    assert call["hostfile"] == "gpu07 slots=2\ngpu08 slots=2\ncpu3 slots=1\n"
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
