"""The warm start of the tests' TensorFlow processes (tests/warm/server.py says how it works and why).

``command([sys.executable, SCRIPT, ARGS...])`` returns the command that runs the same through this pytest
worker's warm-start server, which it starts on first use; mpirun then starts the small client in each
rank's place, which waits while the server imports TensorFlow (a few seconds). A command that is not
``python SCRIPT ...`` of a script in ``WARM_SCRIPTS`` runs as given.
ENGINE_TESTS_WARM_START=0 turns it off: every process starts cold, as a user's does.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "tests" / "warm"
# The scripts that start TensorFlow, and handle no process of their own that a test signals by its pid
# (tools/supervise.py and tools/mpirun_guard.py do).
WARM_SCRIPTS = (ROOT / "rnn.py", ROOT / "tests" / "mpi_scripts", ROOT / "demos")
_server: tuple[subprocess.Popen, str] | None = None


def enabled() -> bool:
    return os.environ.get("ENGINE_TESTS_WARM_START", "1") != "0"


def command(cmd: list[str]) -> list[str]:
    """``cmd`` through the warm start where it applies, else ``cmd``."""
    if not enabled() or len(cmd) < 2 or cmd[0] != sys.executable or not os.path.isfile(cmd[1]):
        return cmd
    script = Path(cmd[1]).resolve()
    if not any(script == warm or warm in script.parents for warm in WARM_SCRIPTS):
        return cmd
    return [sys.executable, str(FOLDER / "client.py"), _socket(), *cmd[1:]]


def _socket() -> str:
    global _server
    if _server is None or _server[0].poll() is not None:
        folder = tempfile.mkdtemp(prefix="engine-warm-")
        process, path = start_server(folder)
        _server = process, path
        atexit.register(stop_server, process, folder)
    return _server[1]


def start_server(folder: str) -> tuple[subprocess.Popen, str]:
    """A warm-start server whose socket (``FOLDER/socket``) appears once it accepts; its log and its pid
    (``server.pid``, which clients read to wait for it) beside it."""
    from helpers import child_env

    path = os.path.join(folder, "socket")
    with open(os.path.join(folder, "server.log"), "w") as log:
        process = subprocess.Popen([sys.executable, str(FOLDER / "server.py"), path], env=child_env(),
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    with open(os.path.join(folder, "server.pid.tmp"), "w") as f:  # clients wait while it imports TensorFlow
        f.write(str(process.pid))
    os.replace(os.path.join(folder, "server.pid.tmp"), os.path.join(folder, "server.pid"))
    return process, path


def stop_server(process: subprocess.Popen, folder: str) -> None:
    """The server and every rank it still runs (its process group, which exists only once the server has
    imported TensorFlow: the server itself too, by its pid), and its folder."""
    for kill in (lambda: os.killpg(process.pid, signal.SIGKILL), process.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
    process.wait()
    shutil.rmtree(folder, ignore_errors=True)
