"""Files that appear whole or not at all: written to a temp file beside the target, flushed to disk,
renamed over the target, and the rename flushed to disk too. A crash, kill or full disk mid-write
leaves the previous file (or none), never a part, and a power loss after the rename cannot bring back
the old file or an empty one.

The temp file gets an unpredictable name and is created exclusively (``mkstemp``: ``O_CREAT|O_EXCL``,
which never follows a symlink), so a file or symlink that someone planted at a guessable name beside
the target is neither written through nor clobbered. It gets the permissions a plain ``open()`` would
give (0666 less the umask), not mkstemp's 0600.
"""
from __future__ import annotations

import errno
import os
import re
import tempfile
from contextlib import contextmanager
from typing import Iterator


def create_temp_beside(path: str, prefix: str | None = None) -> str:
    """A new, empty temp file in ``path``'s directory (created if needed); returns its path. Its name is
    ``prefix`` (default ``.<name of path>.``), random characters and ``.tmp``: a prefix of its own keeps
    the temp file out of readers that pick files by name (TensorBoard reads any name with "tfevents")."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    prefix = f".{os.path.basename(path)}." if prefix is None else prefix
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    finally:
        os.close(fd)
    return tmp


def commit(tmp: str, path: str) -> None:
    """Flush ``tmp`` to disk, rename it to ``path``, flush the directory entry."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def discard(tmp: str) -> None:
    try:
        os.remove(tmp)
    except FileNotFoundError:
        pass


@contextmanager
def atomic_path(path: str, prefix: str | None = None) -> Iterator[str]:
    """Yields a temp path to write ``path``'s new content to; renamed to ``path`` when the block ends
    normally, removed when it raises. ``prefix``: of the temp file's name (``create_temp_beside``)."""
    tmp = create_temp_beside(path, prefix)
    try:
        yield tmp
        commit(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def write_text_atomically(path: str, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def io_errno(exc: BaseException) -> int | None:
    """The errno of a failed file operation: the exception's own, or (h5py's errors may carry it only
    inside their message) the ``errno = N`` in its text; None when there is none."""
    code = getattr(exc, "errno", None)
    if code is None:
        match = re.search(r"errno = (\d+)", str(exc))
        code = int(match.group(1)) if match else None
    return code


def describe_io_error(exc: Exception) -> str:
    """The cause of a failed write in words: ``No space left on device (ENOSPC)``; anything without a
    known errno is given as it is."""
    code = io_errno(exc)
    if code is None or code not in errno.errorcode:
        return str(exc)
    return f"{os.strerror(code)} ({errno.errorcode[code]})"


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # file systems that cannot sync a directory
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` can only swap it, which would race
    with files that other threads create meanwhile)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
