"""A step timeline: per-rank spans in the Chrome trace format, viewable in Perfetto or chrome://tracing.

Every rank streams its spans to its own part file ``<stem>.rank<R><ext>`` beside the timeline file
(opened without following a symbolic link: one planted at that predictable name would make the rank
overwrite whatever file it points to, so it is refused with a ``ConfigError`` naming the file);
at the end of the run every rank calls ``stop()``, the ranks meet (a barrier, the caller's business),
and rank 0 calls ``merge(path, size)``, which writes the one file of the run (ranks as processes,
``pid`` = rank) and removes the parts. ``tools/merge_timeline.py`` does the same by hand after a crash.

A part file is a complete JSON array after every span: a new span overwrites the closing bracket
(one ``pwrite``) and closes the array again, so a rank that dies leaves every span it finished on
disk, loadable alone. Should it die inside that one write, the JSON Array Format still loads: the
format lets the closing ``]`` be missing, and ``merge`` skips a torn last line.

Timestamps are microseconds on the wall clock (``time.time``) at start, advanced by ``perf_counter``:
monotonic within a rank, and ranks on different hosts line up as well as their clocks agree.

Off (``start`` never called, or after ``stop``) ``span`` returns a shared do-nothing context manager
and ``record`` returns at once: a few hundred nanoseconds a call (benchmarks/bench_timeline.py).
"""
from __future__ import annotations

import errno
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from engine.runtime.atomic_file import atomic_path, describe_io_error
from engine.runtime.errors import ConfigError, EngineError

CONFIG_KEY = "timeline_file"
ENV_VAR = "ENGINE_TIMELINE"

# Span categories (the ``cat`` field; Perfetto can filter and colour by them).
DATA_WAIT = "data_wait"  # the step loop waits for its next batch
STEP = "step"  # the step's compute (its collective inside it)
ALLREDUCE = "allreduce"  # gradient allreduce
PARAM_AVERAGE = "param_average"  # parameter averaging (param reduce mode)
STEP_SIGNAL = "step_signal"  # the per-step agreement on whether to go on
CHECKPOINT = "checkpoint"  # writing a checkpoint
EVAL = "eval"  # evaluating on dev/eval data
CATEGORIES = (DATA_WAIT, STEP, ALLREDUCE, PARAM_AVERAGE, STEP_SIGNAL, CHECKPOINT, EVAL)

_CLOSE = b"\n]\n"


def path_from(config_value: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The timeline file of a run: the config key ``timeline_file`` if set, else ``$ENGINE_TIMELINE``,
    else None (off). An empty value means off."""
    value = config_value if config_value is not None else environ.get(ENV_VAR)
    return value or None


def part_path(path: str, rank: int) -> str:
    """``out/timeline.json`` -> ``out/timeline.rank1.json``: the file rank 1 streams to."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext}"


class _Recorder:
    """One rank's open part file. Thread-safe: collectives may be timed from TensorFlow's threads."""

    def __init__(self, path: str, rank: int, size: int) -> None:
        self.rank = rank
        self.part = part_path(path, rank)
        self.fd = _open_part(self.part, path, rank)
        self.lock = threading.Lock()
        self.clock_offset = time.time() - time.perf_counter()
        head = [
            {"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
             "args": {"name": f"rank {rank} of {size} ({socket.gethostname()}, pid {os.getpid()})"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
        ]
        text = "[\n" + ",\n".join(json.dumps(event) for event in head)
        os.write(self.fd, text.encode() + _CLOSE)
        self.end = len(text)  # where the closing bracket starts

    def write(self, name: str, category: str, start: float, end: float, args: dict[str, Any]) -> None:
        event = {"name": name, "cat": category, "ph": "X", "pid": self.rank, "tid": 0,
                 "ts": round((start + self.clock_offset) * 1e6, 1), "dur": round((end - start) * 1e6, 1)}
        if args:
            event["args"] = args
        data = (",\n" + json.dumps(event, default=str)).encode()
        with self.lock:
            if self.fd < 0:
                return
            os.pwrite(self.fd, data + _CLOSE, self.end)
            self.end += len(data)

    def close(self) -> None:
        with self.lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


def _open_part(part: str, path: str, rank: int) -> int:
    """Create or truncate ``part`` for writing, never through a symbolic link (O_NOFOLLOW)."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(part)), exist_ok=True)
        return os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(part):
            raise ConfigError(
                f"Timeline part file '{part}' (rank {rank}'s part of {CONFIG_KEY} '{path}') is a symbolic "
                "link; it is not followed, since writing through it would overwrite the file it points to. "
                f"Remove the link, or set {CONFIG_KEY} (or ${ENV_VAR}) to a path in a directory only you "
                "can write to.") from None
        raise ConfigError(f"Cannot write timeline part file '{part}' (rank {rank}'s part of {CONFIG_KEY} "
                          f"'{path}'): {describe_io_error(exc)}. Set {CONFIG_KEY} (or ${ENV_VAR}) to a "
                          "writable path.") from None


_recorder: _Recorder | None = None
_expected = False  # a recording will start (graphs traced before it must include their span ops)


class _Span:
    __slots__ = ("name", "category", "args", "start")

    def __init__(self, name: str, category: str, args: dict[str, Any]) -> None:
        self.name, self.category, self.args = name, category, args

    def __enter__(self) -> "_Span":
        self.start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        end = time.perf_counter()
        recorder = _recorder
        if recorder is not None:
            if exc_type is not None:
                self.args["exception"] = exc_type.__name__
            recorder.write(self.name, self.category, self.start, end, self.args)


class _NoSpan:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        return None


_NO_SPAN = _NoSpan()


def start(path: str, rank: int = 0, size: int = 1) -> None:
    """Start recording this rank's spans into ``part_path(path, rank)`` (truncated); stops a previous one."""
    global _recorder
    stop()
    _recorder = _Recorder(path, rank, size)


def stop() -> None:
    """Stop recording and close this rank's part file (every rank, before rank 0 merges)."""
    global _recorder
    recorder, _recorder = _recorder, None
    if recorder is not None:
        recorder.close()


def enabled() -> bool:
    """Whether spans are recorded: lets a caller skip computing span arguments when off."""
    return _recorder is not None


def expect_recording() -> None:
    """A recording will start later in this process: graphs traced from now on record their spans
    (``engine.report.phases.timed_in_graph`` decides when a function is traced, not when it runs)."""
    global _expected
    _expected = True


def recording_expected() -> bool:
    return _recorder is not None or _expected


def now() -> float:
    """The clock that ``record`` takes its start and end from (``time.perf_counter``, seconds)."""
    return time.perf_counter()


def span(name: str, category: str, **args: Any):
    """``with timeline.span("allreduce", timeline.ALLREDUCE, bytes=n):`` records the block's duration;
    keyword arguments (sizes, counts) appear as the span's args. A block that raises gets an
    ``exception`` arg with the exception's type."""
    if _recorder is None:
        return _NO_SPAN
    return _Span(name, category, args)


def record(name: str, category: str, start: float, end: float, **args: Any) -> None:
    """Record a span measured elsewhere, from ``now()`` readings ``start`` and ``end`` (e.g. taken by
    ``tf.numpy_function`` markers around a collective inside a ``tf.function``)."""
    recorder = _recorder
    if recorder is not None:
        recorder.write(name, category, start, end, args)


@dataclass
class MergeResult:
    path: str
    ranks: list[int]
    missing_ranks: list[int]
    events: int
    torn_lines: int = 0
    parts: list[str] = field(default_factory=list)


def _read_part(part: str) -> tuple[list[dict], int]:
    """The events of a part file, line by line so that a torn last line costs only itself."""
    events, torn = [], 0
    with open(part, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip().rstrip(",")
            if line in ("", "[", "]"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                torn += 1
                continue
            if isinstance(event, dict):
                events.append(event)
            else:
                torn += 1
    return events, torn


def part_ranks(path: str) -> list[int]:
    """The ranks whose part files of ``path`` exist, in order."""
    stem, ext = os.path.splitext(path)
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(os.path.basename(stem)) + r"\.rank(\d+)" + re.escape(ext) + "$")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(int(m.group(1)) for name in names if (m := pattern.match(name)))


def merge(path: str, size: int | None = None, *, keep_parts: bool = False) -> MergeResult:
    """Merge the part files of ranks ``0..size-1`` (all parts found when ``size`` is None) into ``path``,
    written atomically as one JSON array, spans sorted by time; then remove the parts. Ranks without a
    part file are listed in ``missing_ranks``; no part file at all is an error."""
    ranks = part_ranks(path) if size is None else list(range(size))
    found, missing, metadata, spans, torn = [], [], [], [], 0
    for rank in ranks:
        part = part_path(path, rank)
        if not os.path.exists(part):
            missing.append(rank)
            continue
        events, bad = _read_part(part)
        found.append(rank)
        torn += bad
        for event in events:
            (metadata if event.get("ph") == "M" else spans).append(event)
    if not found:
        raise EngineError(
            f"Timeline '{path}': no part files to merge (expected {part_path(path, 0)} and so on, written "
            f"by the ranks of a run with '{CONFIG_KEY}' or ${ENV_VAR} set)."
        )
    spans.sort(key=lambda event: event.get("ts", 0))
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(event) for event in metadata + spans) + "\n]\n")
    parts = [part_path(path, rank) for rank in found]
    if not keep_parts:
        for part in parts:
            os.remove(part)
    return MergeResult(path, found, missing, len(spans), torn, parts)
