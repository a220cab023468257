"""The horovod backend with a real mpirun job: exact collectives, bit-identical to the mpi backend, and
Horovod's stall shutdown for a reduction inside a tf.function. Needs Horovod (TensorFlow <= 2.15)."""
from __future__ import annotations

import time

import pytest

from helpers import ROOT, run_mpi

pytestmark = pytest.mark.mpi

SCRIPTS = ROOT / "tests" / "mpi_scripts"


def test_horovod_backend_exact_and_bitwise_equal_to_mpi():
    script = str(SCRIPTS / "dist_collectives.py")
    result = run_mpi(2, [script, "--backend", "horovod", "--compare-with", "mpi"], timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for rank in (0, 1):  # the checks of test_dist_mpi, plus byte equality with the mpi backend
        assert f"rank {rank}: 13 checks passed (horovod backend, 2 ranks)" in result.stdout, output


def test_horovod_stall_inside_tf_function_ends_the_job():
    start = time.monotonic()
    result = run_mpi(2, [str(SCRIPTS / "dist_failure.py"), "stall_in_graph", "--backend", "horovod",
                         "--stall-timeout", "3"], timeout=120)
    assert time.monotonic() - start < 30
    assert result.returncode != 0
    assert "Horovod has been shut down" in result.stderr and "MPI_ABORT" in result.stderr
