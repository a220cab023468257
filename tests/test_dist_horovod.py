"""The horovod backend with a real mpirun job: exact collectives, bit-identical to the mpi backend, and the
stall checks for a reduction inside a tf.function. Needs Horovod (TensorFlow <= 2.15)."""
from __future__ import annotations

import time

import pytest

from helpers import ROOT, engine_errors, run_mpi

pytestmark = pytest.mark.mpi

SCRIPTS = ROOT / "tests" / "mpi_scripts"


def test_horovod_backend_exact_and_bitwise_equal_to_mpi():
    script = str(SCRIPTS / "dist_collectives.py")
    result = run_mpi(2, [script, "--backend", "horovod", "--compare-with", "mpi"], timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for rank in (0, 1):  # the checks of test_dist_mpi, plus byte equality with the mpi backend
        assert f"rank {rank}: 13 checks passed (horovod backend, 2 ranks)" in result.stdout, output


def test_horovod_stall_inside_tf_function_is_named_by_both_checks_and_ends_the_job_once():
    start = time.monotonic()
    result = run_mpi(2, [str(SCRIPTS / "dist_failure.py"), "stall_in_graph", "--backend", "horovod",
                         "--stall-warning", "1", "--stall-timeout", "4"], timeout=400)
    output = result.stdout + result.stderr
    assert time.monotonic() - start < 200, output  # start-up with TensorFlow's import, 4 s; not the 600 s
    assert result.returncode != 0
    # the engine's watchdog sees the arrival announced from the graph; Horovod's own check lists the tensors
    assert "stall: rank 1 has not reached collective #2 'allreduce in a tf.function'" in output, output
    assert "Missing ranks:\n1: [HorovodGroupedAllreduce" in output, output
    assert engine_errors(output) == 1 and "MPI_ABORT" in output, output
    assert "[rank 0] error: rank 1 did not reach collective #2 'allreduce in a tf.function' within 4 s" \
        in output, output
