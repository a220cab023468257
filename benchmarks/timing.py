"""Running the programs a benchmark compares and timing them from their output, side by side.

A run's time is the wall time between two of its output lines, stamped as they arrive (the programs
print unbuffered): for training, from the end of epoch 1 (graph building and tracing done) to the end of
the last epoch, so start-up and the first epoch are left out alike for every program. Rows are run in
turns (``interleaved``): a machine whose load drifts slows every row alike, and each row reports the
median of its runs with the range.

A run that fails ends the benchmark (``run_stamped``), except where a row measures several programs at
once in threads (where an exit would end only its thread): there a failed program makes the whole row
FAIL (``RowFailed``), never a number over fewer programs, and a verdict that needs the row says FAIL.

Verdicts (``compare``): a verdict compares two sides, a measured row's runs against another row's runs
(times a factor: "at least 1.8x the single process") or against a fixed target. Each measured side
is its median with its range (min..max), over at least ``MIN_RUNS`` interleaved runs. PASS or MISS
only when the ranges are apart; where they overlap (or a range contains the target) the verdict says
``INCONCLUSIVE: ranges overlap`` and names no winner; with fewer than ``MIN_RUNS`` runs it says
``INCONCLUSIVE`` too; a side that failed makes it ``FAIL``, naming the failed row.
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
BASE_ENV = dict(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def child_env(threads: int | None = None, extra: dict | None = None) -> dict:
    """The benchmark's environment without the thread variables (the engine's default threading), or
    with both set to ``threads``."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update(BASE_ENV, PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    if threads is not None:
        env.update(TF_NUM_INTRAOP_THREADS=str(threads), TF_NUM_INTEROP_THREADS=str(threads))
    env.update(extra or {})
    return env


PEAK_MEMORY = os.path.join(ROOT, "benchmarks", "peak_memory.py")  # rnn.py that reports its peak memory


def rnn_command(config: str, ranks: int, overrides: Sequence[str] = (), env: dict | None = None,
                program: str = PEAK_MEMORY, mpirun: bool | None = None) -> list[str]:
    """``python rnn.py CONFIG ...`` (by default through ``peak_memory.py``), under ``mpirun -np ranks``
    (forwarding the thread variables that ``env`` sets) when ranks > 1 or ``mpirun``."""
    cmd = [sys.executable, program, config, *overrides]
    if not (ranks > 1 if mpirun is None else mpirun):
        return cmd
    return mpirun_command(cmd, ranks, env)


def mpirun_command(cmd: list[str], ranks: int, env: dict | None = None) -> list[str]:
    """``cmd`` on ``ranks`` ranks of this venv's ``mpirun`` (no binding: the ranks share the cores as the
    kernel places them), forwarding the thread variables that ``env`` sets."""
    forwarded = [arg for var in THREAD_VARS if var in (env or {}) for arg in ("-x", var)]
    return [os.path.join(BIN, "mpirun"), "--oversubscribe", "--bind-to", "none", "--map-by", "slot",
            "-np", str(ranks), *forwarded, *cmd]


class RowFailed(Exception):
    """A row's measurement failed (a program it ran exited non-zero or printed no timing line)."""


@dataclass
class Output:
    text: str
    stamps: list[tuple[float, str]]  # (seconds since start, line)
    returncode: int = 0

    def seconds_between(self, start: str, end: str) -> float:
        """From the first line matching ``start`` to the last line matching ``end``."""
        starts = [t for t, line in self.stamps if re.search(start, line)]
        ends = [t for t, line in self.stamps if re.search(end, line)]
        if not starts or not ends:
            raise RuntimeError(f"no line matching {start!r} or {end!r} in the output:\n{self.text[-3000:]}")
        return ends[-1] - starts[0]


def run_stamped(cmd: list[str], env: dict, timeout: float = 1800, check: bool = True) -> Output:
    """Run ``cmd`` (stderr into stdout), stamping each line; exits the benchmark when it fails, unless
    ``check`` is False (then the caller looks at ``Output.returncode``; a killed run's is non-zero)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=ROOT)
    stamps = []
    assert proc.stdout is not None
    for line in proc.stdout:
        stamps.append((time.perf_counter() - start, line.rstrip("\n")))
        if time.perf_counter() - start > timeout:
            proc.kill()
            break
    proc.wait()
    text = "\n".join(line for _, line in stamps)
    if check and proc.returncode != 0:
        sys.exit(f"benchmark run failed (exit {proc.returncode}): {' '.join(cmd)}\n{text[-4000:]}")
    return Output(text, stamps, proc.returncode)


@dataclass
class Row:
    """One line of a result table: a name and the measurements of its runs."""

    name: str
    measure: Callable[[], float]
    values: list[float] = field(default_factory=list)
    note: str = ""
    failure: str = ""  # why a measurement failed (``RowFailed``); the row then has no figure

    @property
    def failed(self) -> bool:
        return bool(self.failure)

    @property
    def median(self) -> float:
        """The median of the runs; NaN for a failed row (which compares as neither above nor below)."""
        return float("nan") if self.failed else statistics.median(self.values)

    def spread(self, fmt: str = "{:.0f}") -> str:
        if self.failed:
            return "FAIL"
        return f"{fmt.format(min(self.values))}-{fmt.format(max(self.values))}"


def interleaved(rows: Sequence[Row], runs: int, progress: bool = True) -> None:
    """``runs`` rounds; in each, every row measures once (the order reversed every other round). A row
    whose measurement fails (``RowFailed``) keeps the reason and measures no more."""
    for i in range(runs):
        order = list(rows) if i % 2 == 0 else list(reversed(rows))
        for row in order:
            if row.failed:
                continue
            try:
                row.values.append(row.measure())
            except RowFailed as exc:
                row.failure = str(exc)
            if progress:
                value = None if row.failed else row.values[-1]
                result = (f"FAIL: {row.failure}" if value is None
                          else f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}")  # ratios too
                print(f"  round {i + 1}/{runs}: {row.name}: {result}", file=sys.stderr, flush=True)


def verdict(ok: bool, text: str, failed: Sequence[Row] = ()) -> str:
    """``PASS`` or ``MISS`` of a check that is not a measurement with a range (e.g. bit-for-bit equal
    results); ``FAIL`` when any of the rows the verdict needs failed. Measured figures take ``compare``."""
    failures = [row for row in failed if row.failed]
    if failures:
        return f"FAIL: {text} [failed: {'; '.join(f'{r.name}: {r.failure}' for r in failures)}]"
    return f"{'PASS' if ok else 'MISS'}: {text}"


MIN_RUNS = 3  # a verdict on fewer interleaved runs per side is INCONCLUSIVE


@dataclass(frozen=True)
class Side:
    """One side of a verdict: a row's runs (``of``), or a fixed target (``target``: no runs, no range)."""

    name: str
    values: tuple[float, ...] = ()
    failure: str = ""
    fixed: bool = False

    @classmethod
    def of(cls, row: Row, scale: float = 1.0, name: str | None = None) -> "Side":
        return cls(row.name if name is None else name, tuple(v * scale for v in row.values), row.failure)

    @classmethod
    def target(cls, name: str, value: float) -> "Side":
        return cls(name, (value,), fixed=True)

    @property
    def failed(self) -> bool:
        return bool(self.failure) or not self.values

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def low(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def high(self) -> float:
        return max(self.values) if self.values else float("nan")

    def describe(self, fmt: str = "{:.3f}", factor: float = 1.0) -> str:
        """"name 5.20 (4.99..5.42, 3 runs)"; a target "name 5.20"; ``factor`` scales the figures."""
        if self.failed:
            return f"{self.name} FAIL"
        scaled = " x " + f"{factor:.3g}" if factor != 1.0 else ""
        if self.fixed:
            return f"{self.name}{scaled} {fmt.format(self.median * factor)}"
        runs = len(self.values)
        return (f"{self.name}{scaled} {fmt.format(self.median * factor)} ({fmt.format(self.low * factor)}.."
                f"{fmt.format(self.high * factor)}, {runs} run{'s' if runs != 1 else ''})")


def decide(ours: Side, theirs: Side, better: str = "higher", factor: float = 1.0,
           min_runs: int = MIN_RUNS) -> tuple[str, str]:
    """(``PASS`` | ``MISS`` | ``INCONCLUSIVE`` | ``FAIL``, why): whether ``ours`` is ``better``
    ("higher" or "lower") than ``theirs`` x ``factor``. Decided only when the two ranges are apart
    (touching counts as overlapping); a side with fewer than ``min_runs`` runs is INCONCLUSIVE."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', not {better!r}")
    failed = [side for side in (ours, theirs) if side.failed]
    if failed:
        return "FAIL", "failed: " + "; ".join(f"{s.name}: {s.failure or 'no run'}" for s in failed)
    few = [s for s in (ours, theirs) if not s.fixed and len(s.values) < min_runs]
    if few:
        return "INCONCLUSIVE", ", ".join(f"{len(s.values)} run(s) of {s.name}" for s in few) + \
            f" (at least {min_runs} needed)"
    lo, hi = theirs.low * factor, theirs.high * factor
    if ours.low > hi:
        return ("PASS" if better == "higher" else "MISS"), ""
    if ours.high < lo:
        return ("PASS" if better == "lower" else "MISS"), ""
    return "INCONCLUSIVE", "ranges overlap" if not theirs.fixed else "the range contains the target"


def compare(ours: Side, theirs: Side, text: str, better: str = "higher", factor: float = 1.0,
            fmt: str = "{:.3f}", min_runs: int = MIN_RUNS, failed: Sequence[Row] = ()) -> str:
    """A verdict line: the status, ``text``, and both sides' medians and ranges (``decide``). ``failed``:
    more rows the verdict needs (e.g. every row a "best row" was chosen from): one that failed makes it
    FAIL, naming the row, whatever the two sides say."""
    status, why = decide(ours, theirs, better, factor, min_runs)
    extra = [f"{r.name}: {r.failure}" for r in failed if r.failed and r.name not in (ours.name, theirs.name)]
    if extra:
        named = [why[len("failed: "):]] if status == "FAIL" else []
        status, why = "FAIL", "failed: " + "; ".join(named + extra)
    sides = f"[{ours.describe(fmt)}; {theirs.describe(fmt, factor)}]"
    return f"{status}{': ' + why if why else ''}: {text} {sides}"
