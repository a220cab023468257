"""Files that appear whole or not at all: write to a temp file beside the target, flush it to disk,
rename it over the target. A crash or kill mid-write leaves the previous file (or none), never a part.
(``datasets.HDFWriter`` does the same for files written in a stream.)"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a temp path to write ``path``'s new content to; renamed to ``path`` when the block ends
    normally, removed when it raises."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomically(path: str, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
