"""tools/sbatch_train.sh on a real one-node SLURM cluster (munged, slurmctld, slurmd started for the
module): a 2-task training job runs to the end; a job warned with SIGUSR1 mid-training saves, exits 99, is
requeued by its own script and resumes from where the signal landed to the same parameters bit for bit as
an uninterrupted run; ``make sanity`` runs as a batch job."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT
from prerequisites import missing
from schedulers.conftest import (CONFIG, EPOCHS, TRAIN_ARGS, assert_bitwise_equal,
                                 assert_resumed_where_it_stopped, job_env, wait_for_file)
from schedulers.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.scheduler, pytest.mark.mpi]
SBATCH_TRAIN = str(ROOT / "tools" / "sbatch_train.sh")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        why = cluster.start()
        if why:
            missing("SLURM", f"no SLURM cluster here: {why}")
        yield cluster
    finally:
        cluster.stop()


def submit(slurm: SlurmCluster, folder: Path, cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=folder, env=job_env(slurm.env))
    assert r.returncode == 0, r.stdout + r.stderr
    match = re.search(r"Submitted batch job (\d+)", r.stdout)
    assert match, r.stdout + r.stderr
    return match.group(1)


def test_sbatch_train_runs_the_12ax_config_on_two_tasks_to_the_end(slurm, tmp_path):
    job = submit(slurm, tmp_path, [SBATCH_TRAIN, CONFIG, "2", *TRAIN_ARGS])
    info = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=600)
    log = (tmp_path / "log" / f"train-12ax.{job}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, log)
    assert f"job {job} on {slurm.host}: 2 ranks on {slurm.host} (restart 0)" in log, log
    assert "--hostfile" in log and " -np 2 " in log, log  # the mpirun line the job ran
    # every rank took part: rank 0 reports the ranks it met in the first collective
    assert "data-parallel: 2 ranks, backend mpi" in log, log
    assert f"hosts: 2 ranks on 1 host: {slurm.host} ranks 0-1" in log, log
    for epoch in range(1, EPOCHS + 1):
        assert re.search(rf"^epoch {epoch} score: [\d.]+ error: [\d.]+", log, re.M), log
    assert f"saved model to out/12ax/model.{EPOCHS:03d}" in log, log
    assert (tmp_path / "out" / "12ax" / f"model.{EPOCHS:03d}").is_file()


def test_sigusr1_mid_training_saves_exits_99_and_the_requeued_job_resumes_bitwise(slurm, tmp_path,
                                                                                  reference_model):
    job = submit(slurm, tmp_path, [SBATCH_TRAIN, CONFIG, "2", *TRAIN_ARGS])
    log_path = tmp_path / "log" / f"train-12ax.{job}.out"
    under_way = wait_for_file(tmp_path / "out" / "12ax", "model.002.step*", timeout=600)
    # what SLURM sends at --signal=B:USR1@N before the time limit, sent now: to the batch shell only
    r = slurm.command("scancel", "--signal=USR1", "--batch", job)
    assert r.returncode == 0, r.stderr
    info = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=900)
    log = log_path.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, log)
    # where the signal landed depends on how fast it is delivered: wherever that was, the requeued job
    # continues from the checkpoint saved there
    first, second = assert_resumed_where_it_stopped(log, under_way)
    assert f"job {job} on {slurm.host}: 2 ranks on {slurm.host} (restart 0)" in first, log
    assert f"job {job}: the training stopped on request after saving a checkpoint; requeueing" in second, log
    assert f"job {job} on {slurm.host}: 2 ranks on {slurm.host} (restart 1)" in second, log
    assert f"saved model to out/12ax/model.{EPOCHS:03d}" in log, log
    assert_bitwise_equal(tmp_path / "out" / "12ax" / f"model.{EPOCHS:03d}", reference_model)


def test_make_sanity_as_a_batch_job(slurm, tmp_path):
    # -o install: the environment is this test's interpreter (PYTHON, and its bin/ on PATH), not .venv
    job = submit(slurm, tmp_path, ["sbatch", "--ntasks=2", f"--output={tmp_path}/sanity.%j.out",
                                   "--wrap", f"make -C {ROOT} -o install sanity PYTHON={sys.executable}"])
    info = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=600)
    log = (tmp_path / f"sanity.{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", (info, log)
    for rank in range(2):
        assert f"[rank {rank}/2] pid " in log and f"on {slurm.host}: MPI is up" in log, log
    assert f"SLURM_JOB_ID={job}" in log, log  # the ranks see the allocation
    assert "demo-horovod-mpi: PASS: 2 ranks on 1 host(s)" in log, log
