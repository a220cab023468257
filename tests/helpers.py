"""Shared helpers for tests that start real processes (``rnn.py``, tools, ``mpirun`` jobs)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def child_env(extra: dict | None = None) -> dict:
    """Environment for child processes: one TF thread each (2-core machines), quiet TF logs."""
    env = dict(os.environ)
    env.update(
        TF_NUM_INTRAOP_THREADS="1",
        TF_NUM_INTEROP_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    env.update(extra or {})
    return env


def mpirun_cmd(num_ranks: int, args: list[str]) -> list[str]:
    """An ``mpirun`` command line with the flags environment.md says these machines need."""
    return [
        str(BIN / "mpirun"), "--oversubscribe", "--bind-to", "none", "--map-by", "slot",
        "-np", str(num_ranks), *args,
    ]


def run(cmd: list[str], timeout: float = 120, env: dict | None = None,
        cwd=None) -> subprocess.CompletedProcess:
    """Run a command, capture text output, never hang past ``timeout``."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(env), cwd=cwd)


def run_mpi(num_ranks: int, args: list[str], timeout: float = 180, env: dict | None = None, cwd=None):
    """``mpirun -np N python ARGS...`` (args after the interpreter); returns the CompletedProcess."""
    return run(mpirun_cmd(num_ranks, [sys.executable, *args]), timeout=timeout, env=env, cwd=cwd)


def run_rnn(args: list[str], timeout: float = 120, env: dict | None = None, cwd=None):
    """``python rnn.py ARGS...`` in a single process."""
    return run([sys.executable, str(ROOT / "rnn.py"), *args], timeout=timeout, env=env, cwd=cwd)
