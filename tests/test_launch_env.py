"""engine.runtime.launch: who started this process. A plain `python` in an sbatch batch script (SLURM_NTASKS
set, no srun step) is one process; a task that srun started is one of SLURM_STEP_NUM_TASKS ranks."""
from __future__ import annotations

import sys

import pytest

from engine.runtime import launch
from helpers import mpirun_cmd, run_mpi, run_on_terminal, run_rnn, screen
from test_engine_tasks import tiny_config

pytestmark = pytest.mark.tf_latest

# What SLURM puts into the environment of an `sbatch --ntasks=4` batch script (sbatch(1), OUTPUT
# ENVIRONMENT VARIABLES), and what srun adds for each task of a 4-task step (srun(1)).
BATCH_SCRIPT = {"SLURM_JOB_ID": "4712", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_PROCID": "0",
                "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "4",
                "SLURM_JOB_NODELIST": "node1"}
SRUN_TASK_2 = {**BATCH_SCRIPT, "SLURM_PROCID": "2", "SLURM_LOCALID": "2", "SLURM_STEP_ID": "0",
               "SLURM_STEPID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "1",
               "SLURM_STEP_NODELIST": "node1", "SLURM_STEP_TASKS_PER_NODE": "4"}
LAUNCH_VARS = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK")


def set_env(monkeypatch, env: dict) -> None:
    for name in LAUNCH_VARS + tuple(SRUN_TASK_2):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("env, rank, size", [
    ({}, 0, 1),
    (BATCH_SCRIPT, 0, 1),
    (SRUN_TASK_2, 2, 4),
    # mpirun inside an allocation: Open MPI's variables win over the step of its daemons
    ({**SRUN_TASK_2, "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"}, 5, 8),
])
def test_rank_and_size_from_the_launcher(monkeypatch, env, rank, size):
    set_env(monkeypatch, env)
    assert (launch.env_rank(), launch.env_size()) == (rank, size)


def test_plain_python_in_a_batch_script_trains_as_one_process(tmp_path):
    r = run_rnn([tiny_config(tmp_path), "++num_epochs", "1"], env=BATCH_SCRIPT)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "net.001").exists()


def test_srun_task_without_use_horovod_is_refused(tmp_path):
    srun_task_0 = {**SRUN_TASK_2, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}  # rank 0 prints the error
    r = run_rnn([tiny_config(tmp_path), "++num_epochs", "1"], env=srun_task_0)
    assert r.returncode == 2 and "one of 4 ranks started by mpirun/srun" in r.stderr, r.stderr


ASK_TERMINAL = "import sys; from engine.runtime.launch import launcher_output_is_terminal; " \
               "print(sys.stdout.isatty(), launcher_output_is_terminal(1))"


@pytest.mark.mpi
@pytest.mark.version_independent
def test_a_rank_knows_whether_mpirun_writes_to_a_terminal():
    """Open MPI gives each rank a pseudo-terminal as stdout also when mpirun's output is a pipe."""
    piped = run_mpi(2, ["-c", ASK_TERMINAL])
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.split("\n") == ["True False", "True False", ""]
    returncode, shown, stderr = run_on_terminal(mpirun_cmd(2, [sys.executable, "-c", ASK_TERMINAL]))
    assert returncode == 0, stderr
    assert screen(shown) == ["True True", "True True"]


def test_without_a_launcher_the_terminal_is_the_process_own(monkeypatch):
    set_env(monkeypatch, {})
    assert launch.launcher_output_is_terminal(1)
