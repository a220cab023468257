"""The lines of ``LmDataset``'s corpus files, split and measured exactly as RETURNN's ``LmDataset`` does it.

Three kinds of file, told apart as RETURNN does (Bliss first, then by the ``.gz`` suffix):

- plain text: mapped into memory; a line is what ends with ``\\n`` (so text after the last newline is not
  a line, as in RETURNN), empty lines skipped with ``skip_empty_lines``; its length for ``sorted`` /
  ``laplace`` is its byte count as it stands in the file (spaces and a ``\\r`` included);
- ``.gz`` text: every line (the last one too) stripped of ASCII whitespace, then skipped if empty with
  ``skip_empty_lines``; its length is that of the stripped bytes;
- Bliss XML (root element ``corpus``, maybe ``.gz``): the ``orth`` of every ``segment``, whitespace
  collapsed, never skipped.

The last two are unpacked once into a temporary file (deleted when the dataset closes), as RETURNN does,
so a corpus of millions of lines costs index arrays, not Python strings. Entries are numbered across the
files in order; the text of an entry is its bytes decoded as UTF-8 and stripped.
"""
from __future__ import annotations

import array
import gzip
import mmap
import tempfile
import xml.etree.ElementTree as ElementTree
from typing import BinaryIO

import numpy as np

from engine.runtime.errors import DataError

_SCAN_BYTES = 1 << 24  # newlines are searched in slices of this size


class TextLines:
    def __init__(self, files: list[str], *, skip_empty_lines: bool = True, owner: str = "LmDataset") -> None:
        self.files, self.owner = list(files), owner
        self._buffers: list[mmap.mmap | bytes] = []
        self._handles: list[BinaryIO] = []
        self._tmp: BinaryIO | None = None
        self._tmp_index = -1
        buffer_of, starts, lengths = array.array("i"), array.array("q"), array.array("q")
        self.counts: list[int] = []  # entries per file
        try:
            for path in self.files:
                before = len(starts)
                if _is_bliss(path):
                    self._unpack(path, _bliss_orths(path, owner), buffer_of, starts, lengths)
                elif path.endswith(".gz"):
                    self._unpack(path, _gz_lines(path, skip_empty_lines, owner), buffer_of, starts, lengths)
                else:
                    self._map_text(path, skip_empty_lines, buffer_of, starts, lengths)
                self.counts.append(len(starts) - before)
            if self._tmp is not None:
                self._tmp.flush()
                size = self._tmp.tell()
                self._buffers[self._tmp_index] = mmap.mmap(self._tmp.fileno(), 0, access=mmap.ACCESS_READ) \
                    if size else b""
        except BaseException:
            self.close()
            raise
        self.buffer_of = np.frombuffer(buffer_of, np.int32) if len(buffer_of) else np.zeros(0, np.int32)
        self.starts = np.frombuffer(starts, np.int64) if len(starts) else np.zeros(0, np.int64)
        self.lengths = np.frombuffer(lengths, np.int64) if len(lengths) else np.zeros(0, np.int64)
        self.file_of = np.repeat(np.arange(len(self.files)), self.counts)

    def __len__(self) -> int:
        return len(self.starts)

    def text(self, idx: int) -> str:
        start = int(self.starts[idx])
        raw = self._buffers[int(self.buffer_of[idx])][start:start + int(self.lengths[idx])]
        try:
            return bytes(raw).decode("utf8").strip()
        except UnicodeDecodeError as exc:
            raise DataError(f"{self.owner}: corpus file '{self.file(idx)}', its line {raw[:60]!r}...: not "
                            f"UTF-8 ({exc.reason} at byte {exc.start}).") from None

    def file(self, idx: int) -> str:
        return self.files[int(self.file_of[idx])]

    # ----- reading the files -----
    def _map_text(self, path: str, skip_empty: bool, buffer_of: array.array, starts: array.array,
                  lengths: array.array) -> None:
        try:
            handle = open(path, "rb")
        except OSError as exc:
            raise DataError(f"{self.owner}: corpus file '{path}' cannot be read: "
                            f"{exc.strerror or exc}.") from None
        self._handles.append(handle)
        size = handle.seek(0, 2)
        buf = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        index = len(self._buffers)
        self._buffers.append(buf)
        view = np.frombuffer(buf, np.uint8) if size else np.zeros(0, np.uint8)
        ends = np.concatenate([np.flatnonzero(view[pos:pos + _SCAN_BYTES] == 10) + pos
                               for pos in range(0, size, _SCAN_BYTES)] or [np.zeros(0, np.int64)])
        del view  # an mmap with a live view cannot be closed
        line_starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if len(ends) else ends
        line_lengths = ends - line_starts
        keep = line_lengths > 0 if skip_empty else slice(None)
        line_starts, line_lengths = line_starts[keep], line_lengths[keep]
        buffer_of.frombytes(np.full(len(line_starts), index, np.int32).tobytes())
        starts.frombytes(line_starts.astype(np.int64).tobytes())
        lengths.frombytes(line_lengths.astype(np.int64).tobytes())

    def _unpack(self, path: str, lines, buffer_of: array.array, starts: array.array,
                lengths: array.array) -> None:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryFile(prefix="lm_dataset_")
            self._tmp_index = len(self._buffers)
            self._buffers.append(b"")  # mapped when all files are in
        offset = self._tmp.tell()
        for line in lines:
            self._tmp.write(line + b"\n")
            buffer_of.append(self._tmp_index)
            starts.append(offset)
            lengths.append(len(line))
            offset += len(line) + 1

    def close(self) -> None:
        for buf in self._buffers:
            if isinstance(buf, mmap.mmap):
                buf.close()
        for handle in self._handles + ([self._tmp] if self._tmp is not None else []):
            handle.close()
        self._buffers, self._handles, self._tmp = [], [], None


def _open(path: str, owner: str) -> BinaryIO:
    try:
        return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    except OSError as exc:
        raise DataError(f"{owner}: corpus file '{path}' cannot be read: {exc.strerror or exc}.") from None


def _is_bliss(path: str) -> bool:
    """Whether the file's first XML element is ``corpus`` (anything that does not parse is text)."""
    try:
        with _open(path, "") as f:
            _, root = next(iter(ElementTree.iterparse(f, events=("start",))))
            return root.tag == "corpus"
    except (OSError, EOFError, ElementTree.ParseError, StopIteration):
        return False
    except DataError:
        return False  # a missing file: reported when it is read as text


def _gz_lines(path: str, skip_empty: bool, owner: str):
    with _open(path, owner) as f:
        try:
            for line in f:
                line = line.strip()
                if line or not skip_empty:
                    yield line
        except (OSError, EOFError) as exc:
            raise DataError(f"{owner}: corpus file '{path}' is not a readable gzip file: {exc}.") from None


def _bliss_orths(path: str, owner: str):
    with _open(path, owner) as f:
        events = ElementTree.iterparse(f, events=("start", "end"))
        _, root = next(iter(events))
        try:
            for event, elem in events:
                if event == "end" and elem.tag == "segment":
                    orth = elem.find("orth")
                    if orth is None:
                        raise DataError(f"{owner}: Bliss corpus '{path}': segment {elem.get('name')!r} "
                                        "has no <orth> element.")
                    yield " ".join((orth.text or "").split()).encode("utf8")
                    root.clear()
        except ElementTree.ParseError as exc:
            raise DataError(f"{owner}: Bliss corpus '{path}' is not well-formed XML: {exc}.") from None
