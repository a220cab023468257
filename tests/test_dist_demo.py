"""demos/demo-horovod-mpi: passes on a working job, fails (non-zero, one FAIL verdict) when it should."""
from __future__ import annotations

import importlib.util
import shlex
import sys

import pytest

import warm_start
from helpers import ROOT, run, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.tf_latest]

DEMO = str(ROOT / "demos" / "demo-horovod-mpi.py")


def test_demo_script_passes_with_two_ranks(tmp_path):
    hostfile = tmp_path / "pe_hostfile"  # what SGE hands a parallel job
    hostfile.write_text("node17 2 all.q@node17 UNDEFINED\n")
    # the .sh's $PYTHON: the interpreter, through the warm start where it applies (tests/warm_start.py),
    # which starts cold what has a PYTHON* variable Python would not have had on import
    python = tmp_path / "python"
    interpreter = warm_start.command([sys.executable, DEMO])[:-1]
    python.write_text(f"#!/bin/sh\nunset PYTHON\nexec {shlex.join(interpreter)} \"$@\"\n")
    python.chmod(0o755)
    env = {"PYTHON": str(python), "MPIRUN_ARGS": "--oversubscribe", "PE_HOSTFILE": str(hostfile)}
    result = run(["bash", str(ROOT / "demos" / "demo-horovod-mpi.sh"), "2"], timeout=240, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    backends = "mpi, horovod" if importlib.util.find_spec("horovod") else "mpi"
    assert f"demo-horovod-mpi: PASS: 2 ranks on 1 host(s), backends {backends}:" in result.stdout, output
    for rank in (0, 1):
        assert f"[rank {rank}/2] pid " in result.stdout and f"OMPI_COMM_WORLD_RANK={rank}" in result.stdout
    assert "mpirun -np 2" in output  # the .sh shows its mpirun line
    assert "hosts: " in result.stdout and "MPI library Open MPI" in result.stdout
    assert "PE_HOSTFILE contents=node17 2 all.q@node17 UNDEFINED" in result.stdout


@pytest.mark.version_independent
def test_demo_fails_when_the_job_has_the_wrong_size():
    result = run_mpi(2, [DEMO, "--expect-size", "3", "--backends", "mpi"], timeout=120)
    assert result.returncode != 0
    assert "FAIL size (expected 3 ranks (--expect-size), MPI sees 2)" in result.stdout
    assert result.stdout.count("demo-horovod-mpi: FAIL") == 1, result.stdout


@pytest.mark.version_independent
def test_demo_fails_when_processes_do_not_find_each_other():
    """A launcher of another MPI started 2 processes: each runs alone as rank 0 of 1."""
    result = run([sys.executable, DEMO, "--backends", "mpi"], timeout=120,
                 env={"PMI_SIZE": "2", "PMI_RANK": "0"})
    assert result.returncode != 0
    assert "the launcher started 2 processes but MPI sees a job of 1" in result.stdout, \
        result.stdout + result.stderr
