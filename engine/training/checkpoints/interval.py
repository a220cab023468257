"""``checkpoint_interval``: how often training saves a checkpoint within an epoch.

Forms (``30 min`` by default):
- an integer N, or ``"N steps"``: after every N-th train step, counted over the whole run (global steps N,
  2N, 3N, ... of rank 0), so the positions do not move when a run is resumed;
- ``"M min"`` (also ``minutes``), ``"H h"`` (``hours``), ``"S s"`` (``sec``, ``seconds``): once this much
  wall time has passed since the last checkpoint (mid-epoch or end of epoch) or the start of training. Each
  rank looks at its own clock and votes in the step signal; all ranks save at the first step at which
  any rank voted, so they agree on the step (as the time-based parameter sync does);
- ``0``, ``None``, ``"off"``: no mid-epoch checkpoints.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from engine.runtime.errors import ConfigError

_UNITS = {"step": None, "steps": None, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
          "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0}
_FORMS = "an integer number of steps, 'N steps', 'M min', 'H h', 'S s', or 0 / 'off'"


@dataclass(frozen=True)
class CheckpointInterval:
    steps: int | None = None
    seconds: float | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.steps or self.seconds)

    @classmethod
    def parse(cls, value: Any, key: str = "checkpoint_interval") -> CheckpointInterval:
        if value is None or value is False or value == 0 or (isinstance(value, str) and value.strip() in
                                                             ("0", "off", "none", "None", "")):
            return cls()
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return cls(steps=value)
        number = r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)?\s*"
        match = re.fullmatch(number, value) if isinstance(value, str) else None
        if match is None or (match.group(2) or "steps") not in _UNITS:
            raise ConfigError(f"Config key '{key}' is {value!r}; expected {_FORMS}.")
        number, unit = float(match.group(1)), _UNITS[match.group(2) or "steps"]
        if unit is None:
            if number != int(number) or number < 1:
                raise ConfigError(f"Config key '{key}' is {value!r}: a number of steps must be a whole "
                                  "number >= 1.")
            return cls(steps=int(number))
        if not math.isfinite(number) or number <= 0:
            raise ConfigError(f"Config key '{key}' is {value!r}; expected a time > 0.")
        return cls(seconds=number * unit)

    def describe(self) -> str:
        if self.steps:
            return f"every {self.steps} steps"
        if self.seconds:
            return f"every {self.seconds / 60:g} min" if self.seconds >= 60 else f"every {self.seconds:g} s"
        return "never within an epoch"


class CheckpointSchedule:
    """Whether this rank votes for a checkpoint at a step boundary."""

    def __init__(self, interval: CheckpointInterval, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last = clock()

    def due(self, global_step: int, step_in_epoch: int) -> bool:
        """``global_step``: train steps done in the whole run; ``step_in_epoch``: in this epoch (at 0 the
        previous epoch's checkpoint is not a step old)."""
        if step_in_epoch == 0:
            return False
        if self.interval.steps:
            return global_step % self.interval.steps == 0
        return bool(self.interval.seconds) and self._clock() - self._last >= self.interval.seconds

    def saved(self) -> None:
        """A checkpoint was just written (mid-epoch or at the end of an epoch)."""
        self._last = self._clock()
