"""Helpers for users' own config code: who am I, run something once, share a value.

They use the job's communicator (``engine.runtime.process``) once the engine has created it; before that, or
in a plain ``python rnn.py`` run, they behave as rank 0 of 1 and never import MPI.

    from engine.distributed import helpers as dist
    vocab = dist.run_on_main(build_vocab)          # rank 0 builds it, every rank gets it
    dist.once_per_node(copy_corpus_to_local_disk)  # one copy per machine
"""
from __future__ import annotations

import functools
import pickle
import socket
from typing import Any, Callable, TypeVar

import numpy as np

from engine.distributed.backend import Communicator
from engine.distributed.local_backend import LocalCommunicator
from engine.runtime import process
from engine.runtime.errors import DistributedError

F = TypeVar("F", bound=Callable[..., Any])
_SINGLE_PROCESS = LocalCommunicator()


def global_communicator() -> Communicator:
    """The job's communicator, or a single-process one before the engine created it."""
    return process.communicator() or _SINGLE_PROCESS


def rank() -> int:
    return global_communicator().rank


def size() -> int:
    return global_communicator().size


def local_rank() -> int:
    return global_communicator().local_rank


def is_main_process() -> bool:
    return rank() == 0


def barrier() -> None:
    global_communicator().barrier()


def broadcast_object(obj: Any, root: int = 0) -> Any:
    return global_communicator().broadcast_object(obj, root)


def all_reduce(value: Any, op: str = "sum") -> Any:
    """``op`` ("sum", "average", "min", "max") of a number or numpy array over all ranks; a number
    comes back as a Python number, an array as an array. Integers are averaged as float64."""
    array = np.asarray(value)
    if op == "average" and array.dtype.kind != "f":
        array = array.astype(np.float64)
    (result,) = global_communicator().allreduce([array], op)
    return result if isinstance(value, np.ndarray) else result.item() if result.ndim == 0 else result


def rank_prefixed_message(message: str) -> str:
    """``[rank 1] message`` (each line) in a multi-rank job; the message unchanged in one process."""
    return process.prefix_lines(message)


def main_process_only(func: F) -> F:
    """Decorator: the function runs on rank 0 only; other ranks get None. No synchronisation."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs) if is_main_process() else None

    return wrapper  # type: ignore[return-value]


def run_on_main(func: Callable[..., Any], post_func: Callable[..., Any] | None = None, args: tuple = (),
                kwargs: dict | None = None, run_post_on_main: bool = False) -> Any:
    """Rank 0 runs ``func(*args, **kwargs)`` while the others wait; its (picklable) result is returned on
    every rank. Then ``post_func()`` runs on the other ranks (and on rank 0 with ``run_post_on_main``),
    e.g. to load what rank 0 prepared. If ``func`` fails, every rank raises (rank 0 its own error)."""
    comm = global_communicator()
    if comm.rank == 0:
        try:
            result = func(*args, **(kwargs or {}))
            payload = ("ok", pickle.dumps(result) if comm.size > 1 else b"")
        except Exception as exc:
            comm.broadcast_object(("error", f"{type(exc).__name__}: {exc}"))
            _mark_agreed(exc)
            raise
        comm.broadcast_object(payload)
    else:
        status, data = comm.broadcast_object(None)
        if status == "error":
            _raise_reported_elsewhere(f"run_on_main: {_name(func)} failed on rank 0 ({data}).")
        result = pickle.loads(data)
    if post_func is not None and (comm.rank != 0 or run_post_on_main):
        post_func()
    return result


def once_per_node(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Local rank 0 of every machine runs ``func(*args, **kwargs)``; every rank waits for all machines
    and gets its machine's (picklable) result. If it fails anywhere, every rank raises."""
    comm = global_communicator()
    outcome: tuple[str, Any] | None = None
    error: Exception | None = None
    if comm.local_rank == 0:
        try:
            outcome = ("ok", func(*args, **kwargs))
        except Exception as exc:
            if comm.size == 1:
                raise
            outcome, error = ("error", f"{type(exc).__name__}: {exc}"), exc
    host = socket.gethostname()
    everyone = comm.allgather_object((host, comm.rank, outcome))
    failures = [(h, r, o[1]) for h, r, o in everyone if o is not None and o[0] == "error"]
    if error is not None:
        _mark_agreed(error)
        raise error
    if failures:
        h, r, text = failures[0]
        _raise_reported_elsewhere(f"once_per_node: {_name(func)} failed on {h} (rank {r}): {text}.")
    return next(o[1] for h, r, o in everyone if h == host and o is not None)


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", repr(func))


def _mark_agreed(exc: BaseException) -> None:
    """Every rank learns of this failure through the collective, so no rank needs to abort the job."""
    try:
        exc.agreed = True  # type: ignore[attr-defined]
    except AttributeError:
        pass


def _raise_reported_elsewhere(message: str) -> None:
    error = DistributedError(message)
    error.agreed = True
    error.quiet = True  # the failing rank prints the real error
    raise error
