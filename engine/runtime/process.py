"""Who this process is in the job: rank, size, local rank, and the communicator once one exists.

Logging, failure handling and the helpers for config code all ask here, so they always agree. Before the
communicator exists, the launcher's environment answers (``launch.py``): that is enough for per-rank log
file names and for printing a start-up error once instead of once per rank. ``set_communicator`` makes
the communicator the answer from then on. Importing this module imports neither MPI nor TensorFlow.
"""
from __future__ import annotations

from typing import NoReturn, Protocol

from engine.runtime.launch import env_rank, env_size


class CommunicatorView(Protocol):
    """What runtime asks of the job's communicator: who this rank is, the ranks on its host and their
    CPUs, and ending the job. ``engine.distributed.backend.Communicator`` is one; runtime, the lowest
    stage, names only this."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    local_cpus: tuple[frozenset[int], ...]  # the CPU affinity of each rank on this host (empty: unknown)

    def abort(self, message: str, exit_code: int = 1) -> NoReturn: ...


class _Process:
    comm: CommunicatorView | None = None


_process = _Process()


def set_communicator(comm: CommunicatorView | None) -> None:
    """Called once the communicator exists (None: back to the launcher's view, for tests)."""
    _process.comm = comm


def communicator() -> CommunicatorView | None:
    return _process.comm


def has_communicator() -> bool:
    """Whether the job's communicator exists: from then on a failure may need to end every rank."""
    return _process.comm is not None


def rank() -> int:
    return _process.comm.rank if _process.comm is not None else env_rank()


def size() -> int:
    return _process.comm.size if _process.comm is not None else env_size()


def local_rank() -> int:
    return _process.comm.local_rank if _process.comm is not None else 0


def is_main() -> bool:
    return rank() == 0


def rank_prefix() -> str:
    """``[rank 3] `` in a multi-rank job, empty in a single process: the one prefix every message uses."""
    return f"[rank {rank()}] " if size() > 1 else ""


def prefix_lines(message: str) -> str:
    """``message`` with the rank prefix on every line."""
    prefix = rank_prefix()
    if not prefix:
        return message
    return "\n".join(prefix + line for line in message.splitlines() or [""])
