"""Logging by verbosity level (RETURNN's ``log_verbosity`` 0..5), log files, and rank-aware stdout.

Levels: 1 error, 2 warning, 3 progress (epoch lines), 4 details, 5 per-step lines and debugging.
Under MPI only rank 0 prints progress on stdout; other ranks print their errors and warnings prefixed
with their rank (all their messages with ``log_all_ranks``). Every rank may keep its own log file,
``<name>.horovod-<rank>-<size><ext>``, so 8 ranks never write into one file.
"""
from __future__ import annotations

import os
import sys
from typing import TextIO

from engine.runtime import process

ERROR, WARNING, INFO, DEBUG, TRACE = 1, 2, 3, 4, 5


class _State:
    verbosity: int = INFO
    all_ranks_stdout: bool = False
    files: list[TextIO] = []
    progress_bars: int = 0  # tqdm bars on the console (engine.report.progress)


_state = _State()


def rank_log_file_name(path: str, rank: int, size: int) -> str:
    """``train.log`` -> ``train.horovod-1-4.log`` (the per-rank name RETURNN uses under Horovod)."""
    base, ext = os.path.splitext(path)
    return f"{base}.horovod-{rank}-{size}{ext}"


def init(*, verbosity: int = INFO, files: list[str] | None = None, per_rank_files: bool = False,
         all_ranks_stdout: bool = False) -> None:
    """(Re)configure logging; opens ``files`` for appending, renamed per rank (``engine.runtime.process``)
    when asked."""
    close()
    _state.verbosity = verbosity
    _state.all_ranks_stdout = all_ranks_stdout
    for path in files or []:
        if per_rank_files:
            path = rank_log_file_name(path, process.rank(), process.size())
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _state.files.append(open(path, "a", encoding="utf-8", buffering=1))


def close() -> None:
    for f in _state.files:
        f.close()
    _state.files = []


def verbosity() -> int:
    return _state.verbosity


def write(level: int, message: str, same_on_all_ranks: bool = False) -> None:
    """``same_on_all_ranks``: every rank logs this very message (e.g. about the config, which all ranks
    share), so other ranks write it to their files only and rank 0 alone prints it."""
    if level > _state.verbosity:
        return
    for f in _state.files:
        f.write(message + "\n")
    stream = sys.stdout if level > WARNING else sys.stderr
    if process.is_main():
        _print(message, stream)
    elif (level <= WARNING and not same_on_all_ranks) or _state.all_ranks_stdout:
        _print(process.prefix_lines(message), stream)


def _print(message: str, stream: TextIO) -> None:
    if _state.progress_bars:
        from tqdm import tqdm

        tqdm.write(message, file=stream)  # clears the bars, prints, draws them again below the line
        stream.flush()
    else:
        print(message, file=stream, flush=True)


def progress_bar_shown(shown: bool) -> None:
    """A progress bar appeared on the console (True) or went (False): until the last one goes, lines
    are printed through tqdm, so that none lands in the middle of a bar."""
    _state.progress_bars = max(0, _state.progress_bars + (1 if shown else -1))


def error(message: str) -> None:
    write(ERROR, message)


def warning(message: str) -> None:
    write(WARNING, message)


def info(message: str) -> None:
    write(INFO, message)


def debug(message: str) -> None:
    write(DEBUG, message)


def trace(message: str) -> None:
    write(TRACE, message)
