"""The collectives of the data-parallel step protocol (``docs/distributed-protocol.md``).

Per step: ``step_signal`` (one small integer allreduce: who has data, who failed, who wants a parameter
sync), then the fused gradient reduction or, at sync steps, the fused parameter averaging
(``comm.allreduce_tensors``), then ``reduce_scores``. At start-up: ``check_config_consistency`` and
``broadcast_initial``.

Time-based parameter sync (``horovod_param_sync_time_diff``) needs all ranks to decide at the same
step. When the step signal runs every step, each rank puts its own clock's vote into it and all ranks
sync when any rank voted, so the decision is identical everywhere. In param + random_seed_offset mode
there is no per-step signal: each rank calls the signal and the averaging when its own clock says so,
and that collective pair is the meeting point (faster ranks wait there). Such a rank that runs out of
data also calls the signal (have_more_data=False) followed by the final averaging, so every rank makes
the same sequence of collective calls.
"""
from __future__ import annotations

import hashlib
import re
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from engine.distributed.backend import Communicator
from engine.distributed.context import HorovodContext
from engine.errors import ConfigError, DistributedError

# Step signal vector: [ranks out of data, ranks voting for a parameter sync, error flag of each rank...]
_NO_DATA, _SYNC_VOTE, _ERRORS = 0, 1, 2


@dataclass(frozen=True)
class StepSignal:
    all_have_data: bool
    any_error: bool
    failed_ranks: tuple[int, ...]
    param_sync: bool = False  # some rank voted for a (time-based) parameter sync at this step


def step_signal(comm: Communicator, have_more_data: bool, had_error: bool,
                want_param_sync: bool = False) -> StepSignal:
    """Exchange (have_more_data, had_error, want_param_sync) of every rank in one int32 allreduce."""
    vector = np.zeros(_ERRORS + comm.size, np.int32)
    vector[_NO_DATA] = not have_more_data
    vector[_SYNC_VOTE] = want_param_sync
    vector[_ERRORS + comm.rank] = had_error
    with comm.stall_guard("step signal"):
        (total,) = comm.allreduce([vector], "sum")
    failed = tuple(int(r) for r in np.flatnonzero(total[_ERRORS:]))
    return StepSignal(all_have_data=bool(total[_NO_DATA] == 0), any_error=bool(failed), failed_ranks=failed,
                      param_sync=bool(total[_SYNC_VOTE] > 0))


def reduce_scores(comm: Communicator, scores: dict[str, float]) -> dict[str, float]:
    """Sums of each score (loss sums, error sums, frame counts) over all ranks, in one float64 allreduce.

    All ranks must pass the same keys; a checksum of the key names travels along and a mismatch raises
    DistributedError on every rank instead of silently adding unrelated numbers.
    """
    keys = sorted(scores)
    key_sum = zlib.crc32("\0".join(keys).encode())
    vector = np.array([float(scores[k]) for k in keys] + [key_sum], np.float64)
    with comm.stall_guard("score reduction"):
        (total,) = comm.allreduce([vector], "sum")
    if total[-1] != key_sum * comm.size:
        error = DistributedError(f"reduce_scores: the ranks reported different score names; rank {comm.rank} "
                                 f"has {keys}. Every rank must report the same scores.")
        error.agreed = True
        raise error
    return {k: float(v) for k, v in zip(keys, total[:-1])}


def broadcast_initial(comm: Communicator, variables: Sequence[Any]) -> None:
    """Rank 0's initial (or loaded) parameters to every rank, before step 1."""
    with comm.stall_guard("initial parameter broadcast"):
        comm.broadcast_variables(list(variables), root=0)


def check_config_consistency(comm: Communicator, config_items: dict[str, Any]) -> None:
    """Raise ConfigError on every rank when the ranks' configs differ, listing the differing keys."""
    mine = {key: _fingerprint(value) for key, value in config_items.items()}
    digests = {key: hashlib.sha1(fp.encode()).hexdigest()[:16] for key, fp in mine.items()}
    with comm.stall_guard("config consistency check"):
        everyone = comm.allgather_object({key: (digests[key], _preview(fp)) for key, fp in mine.items()})
    all_keys = sorted(set().union(*everyone))
    differing = [k for k in all_keys if len({ranks.get(k, (None,))[0] for ranks in everyone}) > 1]
    if not differing:
        return
    lines = []
    for key in differing[:20]:
        by_value: dict[str, list[int]] = {}
        for rank, ranks in enumerate(everyone):
            by_value.setdefault(ranks[key][1] if key in ranks else "(not set)", []).append(rank)
        lines.append(f"'{key}': " + "; ".join(f"{_ranks(r)}: {v}" for v, r in by_value.items()))
    more = f" (and {len(differing) - 20} more)" if len(differing) > 20 else ""
    error = ConfigError(f"The ranks of this MPI job run different configs; differing keys{more}: "
                        + ", ".join(lines) + ". Every rank must load the same config files with the same "
                        "++ overrides.")
    error.agreed = True
    raise error


class ParamSyncSchedule:
    """When to average parameters in param mode: ``step % N == N - 1``, or every T seconds.

    Step mode needs no communication. Time mode: pass ``wants_sync()`` as ``want_param_sync`` into
    ``step_signal`` and the resulting signal to ``due``; without a per-step signal (param +
    random_seed_offset) ``due`` follows this rank's own clock (see the module docstring).
    """

    def __init__(self, ctx: HorovodContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.step_interval = ctx.param_sync_step
        self.time_diff = ctx.param_sync_time_diff
        self._clock = clock
        self._last_sync = clock()

    @property
    def is_time_based(self) -> bool:
        return self.time_diff is not None

    def wants_sync(self, step: int) -> bool:
        """This rank's own view: the step count, or its clock."""
        if self.time_diff is not None:
            return self._clock() - self._last_sync >= self.time_diff
        return step % self.step_interval == self.step_interval - 1

    def due(self, step: int, signal: StepSignal | None = None) -> bool:
        """Whether to average after ``step``; the same answer on every rank. Restarts the clock when due."""
        due = signal.param_sync if self.is_time_based and signal is not None else self.wants_sync(step)
        if due:
            self.reset()
        return due

    def reset(self) -> None:
        """Restart the clock (also after the end-of-epoch average)."""
        self._last_sync = self._clock()


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _fingerprint(value: Any) -> str:
    """A text that is equal on two ranks exactly when the config values are equal (no memory addresses)."""
    if isinstance(value, (str, bytes, bool, int, float, complex, type(None))):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_fingerprint(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        items = sorted((_fingerprint(k), _fingerprint(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_fingerprint(v) for v in value)) + "}"
    if isinstance(value, np.ndarray):
        return f"array({value.dtype}, {value.shape}, {hashlib.sha1(value.tobytes()).hexdigest()[:16]})"
    code = getattr(value, "__code__", None)
    if code is not None:  # a function defined in the config: compare its code, not its address
        return f"<function {value.__qualname__} {hashlib.sha1(_code_bytes(code)).hexdigest()[:16]}>"
    if isinstance(value, type) or type(value).__name__ == "module":
        return f"<{type(value).__name__} {getattr(value, '__qualname__', getattr(value, '__name__', '?'))}>"
    return _ADDRESS.sub("", repr(value))


def _code_bytes(code: Any) -> bytes:
    parts = [code.co_code]
    for const in code.co_consts:
        parts.append(_code_bytes(const) if hasattr(const, "co_code") else repr(const).encode())
    return b"\0".join(parts)


def _preview(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))
