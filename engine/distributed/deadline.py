"""Ending this process from outside after a deadline, when nothing inside it may be able to.

    watcher = kill_after(seconds, message)   # ...; watcher.stdin.close() to call it off

A small watcher process waits ``seconds`` on a pipe from this process; if the pipe is still open then, it
writes ``message`` to stderr and SIGKILLs this process. The pipe closes when this process calls it off or
dies, so the watcher never outlives it nor hits a reused pid. Needed where this process may hang holding
Python's lock, so that no thread of its own could act: in MPI's start (``startup.joining_deadline``) and in
MPI_Abort, whose way out goes through ``mpirun`` (``backend.exit_after``).
"""
from __future__ import annotations

import os
import subprocess
import sys

_WATCHER = """
import os, select, signal, sys
pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if not select.select([0], [], [], seconds)[0]:
    os.write(2, message.encode())
    os.kill(pid, signal.SIGKILL)
"""


def kill_after(seconds: float, message: str) -> subprocess.Popen:
    """Start the watcher; close its ``stdin`` to call it off (then ``wait()`` for it)."""
    return subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), str(seconds), message],
                            stdin=subprocess.PIPE)
