"""Progress of an epoch on rank 0: a tqdm bar on a terminal, a plain line every N seconds elsewhere.

On a terminal the bar shows the steps done of the epoch's planned steps, the rate and ETA, frames/s and
the running score; it disappears when closed, so the epoch's summary line takes its place. When the
stream is not a terminal (a batch job's log) there is no bar: every ``interval`` seconds [60, config
key ``progress_interval``] one line like

    train epoch 3: step 1200 of 5000 (24.0%), 0:12:00 elapsed, about 0:38:00 to go, 5123 frames/s, ...

shows that the job lives. Both appear from ``log_verbosity`` 3 (the level of the epoch lines) on.

Lines printed while a bar is shown must go through ``tqdm.write`` (it clears the bar, prints the line
and redraws the bar below it); a plain ``print`` would land in the middle of the bar. ``engine.runtime.log``
does so while a bar is shown (a bar tells it when it appears and goes).

Under ``mpirun`` a rank's stdout is a pseudo-terminal even when ``mpirun``'s own output goes to a file:
there the bar shows only when ``mpirun``'s output is a terminal (``launch.launcher_output_is_terminal``).
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from tqdm import tqdm

from engine.config import keys
from engine.report.clock import hms
from engine.runtime import log
from engine.runtime.errors import ConfigError
from engine.runtime.launch import launcher_output_is_terminal

CONFIG_KEY = "progress_interval"
DEFAULT_INTERVAL = keys.default(CONFIG_KEY)


def interval_from_config(config) -> float:
    """Seconds between plain progress lines: config key ``progress_interval`` (> 0) [60]."""
    interval = config.float(CONFIG_KEY)
    if not interval > 0:
        raise ConfigError(f"Config key '{CONFIG_KEY}' must be a number of seconds above 0, got {interval!r}.")
    return interval


class Progress:
    """``update`` after every step with the epoch's totals so far; ``close`` before the epoch's lines.

    ``total_steps``: the steps the epoch is planned to have, None when unknown (no percentage, no ETA).
    ``unit``: what is counted, "step" unless a tool counts something else (sequences, say).
    ``enabled``: None decides by ``log_verbosity`` (on from 3). ``clock``: seconds, for the plain lines
    (tests pass a fake one). ``bar_refresh``: least seconds between redraws of the bar.
    """

    def __init__(self, name: str, total_steps: int | None = None, *, stream: TextIO | None = None,
                 interval: float = DEFAULT_INTERVAL, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, bar_refresh: float = 0.5,
                 unit: str = "step") -> None:
        self.name = name
        self.unit = unit
        self.total_steps = total_steps
        self.stream = stream if stream is not None else sys.stdout
        self.interval = interval
        self.enabled = log.verbosity() >= log.INFO if enabled is None else enabled
        self.clock = clock
        self.start = clock()
        self.next_line = self.start + interval
        self.bar: tqdm | None = None
        if self.enabled and _is_terminal(self.stream):
            self.bar = tqdm(total=total_steps, desc=name, unit=unit, file=self.stream, leave=False,
                            dynamic_ncols=True, mininterval=bar_refresh, miniters=1, smoothing=0.1)
            log.progress_bar_shown(True)

    @property
    def terminal(self) -> bool:
        """Whether progress shows as a bar (else as plain lines, or not at all when disabled)."""
        return self.bar is not None

    def update(self, steps_done: int, frames: float | None = None, score: float | None = None) -> None:
        """``steps_done`` and ``frames`` count from the epoch's start; ``score`` is the running score."""
        if not self.enabled:
            return
        now = self.clock()
        if self.bar is not None:
            details = _details(frames, score, now - self.start)
            if details:
                self.bar.set_postfix_str(details, refresh=False)
            self.bar.update(steps_done - self.bar.n)
        elif now >= self.next_line:
            self.next_line = now + self.interval
            self.stream.write(self.line(steps_done, frames, score, now - self.start) + "\n")
            self.stream.flush()

    def line(self, steps_done: int, frames: float | None, score: float | None, elapsed: float) -> str:
        """The plain progress line."""
        parts = [f"{self.name}: {self.unit} {steps_done}"]
        if self.total_steps:
            done = steps_done / self.total_steps
            parts[0] += f" of {self.total_steps} ({100 * done:.1f}%)"
        parts.append(f"{hms(elapsed)} elapsed")
        if self.total_steps and steps_done:
            parts.append(f"about {hms(max(elapsed * (self.total_steps - steps_done) / steps_done, 0))} to go")
        details = _details(frames, score, elapsed)
        return ", ".join(parts + ([details] if details else []))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            log.progress_bar_shown(False)
        self.enabled = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _details(frames: float | None, score: float | None, elapsed: float) -> str:
    parts = []
    if frames is not None and elapsed > 0:
        parts.append(f"{frames / elapsed:.0f} frames/s")
    if score is not None:
        parts.append(f"score {score:.4f}")
    return ", ".join(parts)


def _is_terminal(stream: TextIO) -> bool:
    try:
        if not stream.isatty():
            return False
        return launcher_output_is_terminal(stream.fileno())
    except (AttributeError, ValueError, OSError):  # no isatty or fileno, or a closed stream
        return False
