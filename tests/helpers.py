"""Shared helpers for tests that start real processes (``rnn.py``, tools, ``mpirun`` jobs)."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import warm_start

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Every mpirun a test starts goes through this shim, which counts it for the suite's summary (conftest.py).
MPIRUN_SHIM = ROOT / "tests" / "mpirun_shim"


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
        PATH=f"{MPIRUN_SHIM}{os.pathsep}{BIN}{os.pathsep}{env.get('PATH', '')}",
        ENGINE_TESTS_REAL_MPIRUN=str(BIN / "mpirun"),
    )
    env.update(extra or {})
    return env


def mpirun_cmd(num_ranks: int, args: list[str], warm: bool = True) -> list[str]:
    """An ``mpirun`` command line with the flags environment.md says these machines need; ``python
    SCRIPT ...`` ranks start warm (tests/warm_start.py) unless ``warm`` is False.

    ``make test-quick`` runs no ``mpirun`` (ENGINE_TESTS_NO_MPIRUN=1): a test that starts one there lacks
    its ``mpi`` mark, which is what keeps it out of the quick run."""
    if os.environ.get("ENGINE_TESTS_NO_MPIRUN") == "1":
        raise AssertionError("this test starts mpirun but is not marked @pytest.mark.mpi")
    return [
        str(MPIRUN_SHIM / "mpirun"), "--oversubscribe", "--bind-to", "none", "--map-by", "slot",
        "-np", str(num_ranks), *(warm_start.command(args) if warm else args),
    ]


def run(cmd: list[str], timeout: float = 120, env: dict | None = None,
        cwd=None) -> subprocess.CompletedProcess:
    """Run a command, capture text output, never hang past ``timeout``. ``python SCRIPT ...`` starts warm
    (tests/warm_start.py).

    An ``mpirun`` whose launcher could not start (``LAUNCHER_FLAKE``: no rank ran) is run once more."""
    cmd = warm_start.command(cmd)
    launcher = "mpirun" in os.path.basename(cmd[0])
    for _ in range(2):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(env), cwd=cwd)
        if not (launcher and r.returncode != 0 and LAUNCHER_FLAKE in r.stdout + r.stderr):
            break
    return r


# Open MPI's launcher (prterun) failing before it starts any process, seen once in a few hundred launches
# on a shared machine; a launch that fails for a reason of ours never prints it.
LAUNCHER_FLAKE = "The PMIx server's listener thread failed to start"


# The engine's error lines: "error: ...", "[rank 1] error: ...", "rnn.py: error: ...". Not TensorFlow's own
# log lines, which a CUDA build prints on a machine without a GPU ("... CUDA error: Failed call to cuInit").
ENGINE_ERROR = re.compile(r"(?m)(?:^|\[rank \d+\] |rnn\.py: )error:")


def engine_errors(output: str) -> int:
    """How many error messages of the engine ``output`` holds."""
    return len(ENGINE_ERROR.findall(output))


def run_mpi(num_ranks: int, args: list[str], timeout: float = 180, env: dict | None = None, cwd=None):
    """``mpirun -np N python ARGS...`` (args after the interpreter); returns the CompletedProcess."""
    return run(mpirun_cmd(num_ranks, [sys.executable, *args]), timeout=timeout, env=env, cwd=cwd)


def run_rnn(args: list[str], timeout: float = 120, env: dict | None = None, cwd=None):
    """``python rnn.py ARGS...`` in a single process."""
    return run([sys.executable, str(ROOT / "rnn.py"), *args], timeout=timeout, env=env, cwd=cwd)


def run_on_terminal(cmd: list[str], timeout: float = 120, env: dict | None = None, columns: int = 100,
                    rows: int = 24, stderr_too: bool = False) -> tuple[int, str, str]:
    """Run ``cmd`` with stdout (and stderr with ``stderr_too``) on a pseudo-terminal of ``columns`` x
    ``rows``; returns (exit status, everything written to the terminal, stderr when it was a pipe)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave if stderr_too else subprocess.PIPE,
                            env=child_env(env))
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal closed: every writer has ended
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
        proc.wait(timeout=30)
    finally:
        os.close(master)
    stderr = ""
    if proc.stderr is not None:
        stderr = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
    return proc.returncode, b"".join(chunks).decode(errors="replace"), stderr


def screen(raw: str) -> list[str]:
    """What a terminal shows for ``raw``: carriage returns move back to column 0 and overwrite; the
    non-empty rows."""
    lines = []
    for text in raw.replace("\r\n", "\n").split("\n"):
        row: list[str] = []
        for segment in text.split("\r"):
            row[:len(segment)] = segment
        lines.append("".join(row).rstrip())
    return [line for line in lines if line]
