"""A failure on one rank ends the whole mpirun job, quickly, with the original error printed once."""
from __future__ import annotations

import re
import time

import pytest

from helpers import ROOT, engine_errors, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.tf_latest]

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "dist_failure.py")
BOUND_S = 30  # the bound for ending the job, start-up included on an idle machine
START_UP_S = 120  # what a busy 2-core machine may add to the start-up: not counted in BOUND_S


def assert_ends_in_time(mode: str, result, start: float) -> None:
    """Ended within ``BOUND_S`` of the moment every rank was up (a busy machine's start-up takes longer
    than the bound by itself), and within ``BOUND_S + START_UP_S`` of the launch."""
    end = time.monotonic()
    output = result.stdout + result.stderr
    up = [float(t) for t in re.findall(r"^up at (\d+\.\d+)$", result.stdout, re.M)]
    assert up, f"{mode}: no rank started:\n{output}"
    assert end - min(up) < BOUND_S, f"{mode}: the job took {end - min(up):.1f} s to end once up\n{output}"
    assert end - start < BOUND_S + START_UP_S, f"{mode}: the job took {end - start:.1f} s to end\n{output}"


def run_failing(mode: str, *extra: str):
    start = time.monotonic()
    result = run_mpi(2, [SCRIPT, mode, *extra], timeout=BOUND_S + START_UP_S + 60)
    assert_ends_in_time(mode, result, start)
    assert result.returncode != 0, f"{mode}: exit status 0\n{result.stdout}{result.stderr}"
    return result, result.stdout + result.stderr


@pytest.mark.version_independent
def test_exception_on_rank_1_prints_its_traceback_once_and_aborts():
    result, output = run_failing("exception")
    assert output.count("RuntimeError: boom: the original error of rank 1") == 1, output
    assert "[rank 1] Traceback (most recent call last):" in output
    assert "MPI_ABORT was invoked on rank 1" in output


@pytest.mark.version_independent
def test_engine_error_on_rank_1_is_one_paragraph_without_traceback():
    result, output = run_failing("engine_error")
    message = "[rank 1] dist_failure.py: error: HDF file 'corpus.hdf': dataset 'inputs' is missing"
    assert output.count(message) == 1 and "Traceback" not in output, output


@pytest.mark.version_independent
def test_exception_in_a_thread_aborts_the_job():
    result, output = run_failing("thread")
    assert output.count("RuntimeError: boom: the data loader thread of rank 1 crashed") == 1, output


@pytest.mark.version_independent
def test_below_thread_multiple_a_thread_ends_the_job_without_calling_mpi():
    """With MPI_THREAD_SERIALIZED the main thread may be inside a collective: no MPI_Abort from a thread."""
    start = time.monotonic()
    result = run_mpi(2, [SCRIPT, "thread"], timeout=BOUND_S + START_UP_S + 60,
                     env={"MPI4PY_RC_THREAD_LEVEL": "serialized"})
    output = result.stdout + result.stderr
    assert_ends_in_time("thread", result, start)
    assert result.returncode != 0, output
    assert output.count("RuntimeError: boom: the data loader thread of rank 1 crashed") == 1, output
    assert "MPI_ABORT" not in output, output


def test_sigkill_of_one_rank_ends_the_job():
    result, output = run_failing("sigkill")
    assert "exited on\nsignal 9" in output or "exited on signal 9" in output, output


@pytest.mark.version_independent
def test_stall_timeout_aborts_when_a_rank_stops_answering():
    result, output = run_failing("stall", "--stall-warning", "1", "--stall-timeout", "3")
    assert output.count("stall: rank 1 has not reached collective #2 'step signal (allreduce)' "
                        "after 1 s; rank 0 waits there") == 1, output
    assert engine_errors(output) == 1, output
    assert ("[rank 0] error: rank 1 did not reach collective #2 'step signal (allreduce)' within 3 s "
            "(distributed_stall_timeout), where rank 0 waits") in output, output


@pytest.mark.tf_latest_mpi
def test_stall_timeout_inside_tf_function():
    result, output = run_failing("stall_in_graph", "--stall-timeout", "3")
    assert engine_errors(output) == 1, output
    assert ("[rank 0] error: rank 1 did not reach collective #2 'allreduce in a tf.function' within 3 s"
            in output), output


@pytest.mark.version_independent
def test_a_stalled_rank_0_is_named_by_its_own_watchdog_thread():
    result, output = run_failing("stall", "--failing-rank", "0", "--stall-timeout", "3")
    assert engine_errors(output) == 1, output
    assert ("[rank 0] error: rank 0 did not reach collective #2 'step signal (allreduce)' within 3 s "
            "(distributed_stall_timeout), where rank 1 waits") in output, output


@pytest.mark.version_independent
def test_a_frozen_rank_0_is_caught_by_the_other_ranks_after_a_grace_period():
    result, output = run_failing("freeze", "--failing-rank", "0", "--stall-timeout", "2")
    assert engine_errors(output) == 1, output
    assert ("[rank 1] error: 'step signal (allreduce)' did not complete within 12.2 s "
            "(distributed_stall_timeout + 10.2 s), and rank 0, which names stalled ranks, did not end the job"
            in output), output
