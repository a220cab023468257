"""The ring allreduce the mpi backend uses across hosts (engine/distributed/ring.py), with real mpirun:
exact against numpy on 2 ranks and identical on every rank with 3; and the backend's own reductions,
overlapped buckets and training forced onto the ring (ENGINE_ALLREDUCE=ring) give the exact results the
same checks demand of MPI_Allreduce."""
import pytest

from engine.distributed.ring import RING_MIN_BYTES, ring_threshold
from engine.runtime.errors import ConfigError
from helpers import ROOT, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.tf_latest]
SCRIPTS = ROOT / "tests" / "mpi_scripts"
RING = {"ENGINE_ALLREDUCE": "ring"}


def test_the_ring_is_taken_across_hosts_for_large_segments_unless_the_environment_says_otherwise():
    assert ring_threshold(across_hosts=True, environ={}) == RING_MIN_BYTES
    assert ring_threshold(across_hosts=False, environ={}) is None
    assert ring_threshold(across_hosts=False, environ={"ENGINE_ALLREDUCE": "ring"}) == 0
    assert ring_threshold(across_hosts=True, environ={"ENGINE_ALLREDUCE": "mpi"}) is None
    with pytest.raises(ConfigError, match="ENGINE_ALLREDUCE is 'tree'"):
        ring_threshold(across_hosts=True, environ={"ENGINE_ALLREDUCE": "tree"})


@pytest.mark.parametrize("ranks", [2, 3])
def test_ring_allreduce_equals_numpy_on_every_rank(ranks):
    r = run_mpi(ranks, [str(SCRIPTS / "ring_checks.py")], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ring checks passed on {ranks} ranks" in r.stdout


def test_the_backends_exact_reductions_hold_on_the_ring():
    r = run_mpi(2, [str(SCRIPTS / "wire_reduce.py"), "--backend", "mpi"], timeout=240, env=RING)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_mpi(2, [str(SCRIPTS / "overlap_checks.py"), "--backend", "mpi"], timeout=240, env=RING)
    assert r.returncode == 0, r.stdout + r.stderr
