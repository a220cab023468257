"""tools/qsub_train.sh in a real one-host Grid Engine cell (sge_qmaster and sge_execd, a queue with
`notify`, the parallel environment `mpi`): a 2-slot training job runs both ranks from PE_HOSTFILE to the
end; a job submitted with -notify and suspended with `qmod -sj` mid-training gets SIGUSR1, saves, exits 99,
is rescheduled by Grid Engine and resumes from where the signal landed to the same parameters bit for bit
as an uninterrupted run."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT
from prerequisites import missing
from schedulers.conftest import (CONFIG, EPOCHS, TRAIN_ARGS, assert_bitwise_equal,
                                 assert_resumed_where_it_stopped, job_env, wait_for_file)
from schedulers.sge_cluster import NOTIFY_SECONDS, SgeCluster

pytestmark = [pytest.mark.scheduler, pytest.mark.mpi]
QSUB_TRAIN = str(ROOT / "tools" / "qsub_train.sh")


@pytest.fixture(scope="module")
def sge():
    cluster = SgeCluster()
    try:
        why = cluster.start()
        if why:
            missing("Grid Engine", f"no Grid Engine cell here: {why}")
        yield cluster
    finally:
        cluster.stop()


def submit(sge: SgeCluster, folder: Path) -> str:
    env = job_env(dict(sge.env, QSUB_ARGS=f"-q {sge.queue}"))
    r = subprocess.run([QSUB_TRAIN, CONFIG, "2", *TRAIN_ARGS], capture_output=True, text=True, timeout=60,
                       cwd=folder, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    match = re.search(r'Your job (\d+) \("train-12ax"\) has been submitted', r.stdout)
    assert match, r.stdout + r.stderr
    return match.group(1)


def test_qsub_train_runs_both_ranks_from_the_pe_hostfile_to_the_end(sge, tmp_path):
    job = submit(sge, tmp_path)
    assert sge.wait_job_gone(job, timeout=600), sge.command("qstat", "-j", job).stdout
    log = (tmp_path / "log" / f"train-12ax.o{job}").read_text()
    assert f"job {job} on {sge.host}: 2 ranks on {sge.host} (restarted 0)" in log, log
    assert re.search(r"make_hostfile: 1 host\(s\), 2 slot\(s\) from .*pe_hostfile", log), log
    assert "data-parallel: 2 ranks, backend mpi" in log, log
    assert f"hosts: 2 ranks on 1 host: {sge.host} ranks 0-1" in log, log
    for epoch in range(1, EPOCHS + 1):
        assert re.search(rf"^epoch {epoch} score: [\d.]+ error: [\d.]+", log, re.M), log
    assert f"saved model to out/12ax/model.{EPOCHS:03d}" in log, log
    assert (tmp_path / "out" / "12ax" / f"model.{EPOCHS:03d}").is_file()


def test_qmod_suspend_warns_with_sigusr1_the_job_exits_99_and_is_rescheduled_to_resume_bitwise(
        sge, tmp_path, reference_model):
    job = submit(sge, tmp_path)
    under_way = wait_for_file(tmp_path / "out" / "12ax", "model.002.step*", timeout=600)
    # -notify: SIGUSR1 now, SIGSTOP after the queue's notify time; the job is gone before that
    r = sge.command("qmod", "-sj", job)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sge.wait_job_gone(job, timeout=900), sge.command("qstat", "-j", job).stdout
    log = (tmp_path / "log" / f"train-12ax.o{job}").read_text()
    # where the signal landed depends on how fast SGE delivers it: wherever that was, the rescheduled job
    # continues from the checkpoint saved there
    first, second = assert_resumed_where_it_stopped(log, under_way)
    assert f"job {job} on {sge.host}: 2 ranks on {sge.host} (restarted 0)" in first, log
    assert f"job {job}: the training stopped on request after saving a checkpoint; exit status 99 makes" \
        " SGE reschedule the job" in second, log
    assert f"job {job} on {sge.host}: 2 ranks on {sge.host} (restarted 1)" in second, log
    assert f"saved model to out/12ax/model.{EPOCHS:03d}" in log, log
    assert_bitwise_equal(tmp_path / "out" / "12ax" / f"model.{EPOCHS:03d}", reference_model)
    assert NOTIFY_SECONDS >= 30  # the time the ranks have to save after the warning, on a busy machine too
