"""The mpi backend with real mpirun jobs: exact collectives, the step protocol, the helpers, in 2 and 3
ranks (also in the newest-TensorFlow environment, where Horovod does not exist)."""
from __future__ import annotations

import pytest

from helpers import ROOT, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.tf_latest]

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "dist_collectives.py")


def assert_all_ranks_passed(result, num_ranks: int, backend: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for rank in range(num_ranks):
        assert f"rank {rank}: " in result.stdout
    assert result.stdout.count(f"checks passed ({backend} backend, {num_ranks} ranks)") == num_ranks


@pytest.mark.tf_latest_mpi
def test_mpi_backend_two_ranks_with_tensorflow():
    result = run_mpi(2, [SCRIPT, "--backend", "mpi"], timeout=240)
    assert_all_ranks_passed(result, 2, "mpi")
    assert "rank 0: 12 checks passed" in result.stdout  # incl. tf.function reductions, broadcasts, auto
    # no GPU here: "auto" is the mpi backend, whether Horovod is installed or not
    assert "using the mpi backend (distributed_backend = 'auto': training on the CPU (device = 'cpu')" \
        in result.stdout
    assert "using the mpi backend (distributed_backend = 'auto': training on the CPU (no GPU visible)" \
        in result.stdout


def test_mpi_backend_three_ranks():
    result = run_mpi(3, [SCRIPT, "--backend", "mpi", "--no-tf"], timeout=120)
    assert_all_ranks_passed(result, 3, "mpi")
