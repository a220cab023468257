"""The files of an ``OggZipDataset``: zip archives (or one plain directory) holding a text list of
utterances beside the audio files.

A zip ``NAME.zip`` holds ``NAME.txt``, a Python literal list of dicts ``{"file": "a.ogg", "seq_name":
"corpus/a", "text": "...", "duration": 2.3}``, and the audio files, under ``NAME/`` when
``zip_audio_files_have_name_as_prefix`` (the default). ``seq_name`` is optional (the tag is then the file
name); without ``file`` the corpus is text only. ``duration`` (seconds) orders the sequences for
``sorted`` and ``laplace`` (as ``int(duration * 100)``); it need not be the audio's real length.
``content_name`` replaces NAME; ``resolve_symlink_for_name`` takes NAME from the file a symlink points
to. A ``NAME.txt.gz`` in the path list replaces the list inside ``NAME.zip``. A path that is a directory
``D`` with a ``D.txt`` beside it is read from the file system (``D.txt``, audio under ``D/``).
"""
from __future__ import annotations

import ast
import gzip
import io
import os
import threading
import zipfile
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from engine.datasets.ogg_pages import vorbis_length
from engine.runtime.errors import DataError


@dataclass
class _Source:
    name: str  # NAME: NAME.txt and NAME/ inside
    where: str  # the zip file or the directory's parent, for messages and reads
    archive: zipfile.ZipFile | None = None
    txt_gz: str | None = None


def internal_name(path: str, resolve_symlink: bool = False) -> tuple[str, str]:
    """``("NAME", ".zip")`` for ``.../NAME.zip``, ``("NAME", ".txt.gz")`` for ``.../NAME.txt.gz``."""
    if resolve_symlink:
        path = os.path.realpath(path)
    name, ext = os.path.splitext(os.path.basename(path))
    if "." in name and ext == ".gz":
        name, ext = name[:name.rindex(".")], name[name.rindex("."):] + ext
    return name, ext


class OggZipCorpus:
    """The utterance entries of all sources, filtered and subset, and reads of their audio files."""

    def __init__(self, path: str | Sequence[str], *, content_name: str | Sequence[str] | None = None,
                 resolve_symlink_for_name: bool = False, audio_prefix: bool = True,
                 segment_file: str | None = None, need_files: bool = True,
                 fixed_random_subset: float | int | None = None, fixed_random_subset_seed: int = 42,
                 owner: str = "OggZipDataset") -> None:
        self.owner = owner
        self.audio_prefix = audio_prefix
        self._lock = threading.Lock()
        self.sources = self._sources(path, content_name, resolve_symlink_for_name)
        segments = read_segment_file(segment_file) if segment_file else None
        self.entries: list[dict[str, Any]] = []
        try:
            for index, source in enumerate(self.sources):
                self.entries += self._read_entries(index, source, segments, need_files)
        except BaseException:
            self.close()
            raise
        if not self.entries:
            where = ", ".join(s.where for s in self.sources)
            filtered = f" after the segment_file '{segment_file}' filter" if segments is not None else ""
            raise DataError(f"{owner}: no sequences in {where}{filtered}.")
        if fixed_random_subset:
            self.entries = self._subset(fixed_random_subset, fixed_random_subset_seed)
        self.tags = [entry.get("seq_name", entry.get("file", "")) for entry in self.entries]
        self.texts = [entry["text"] for entry in self.entries]
        # RETURNN orders by int(duration * 100): centiseconds, so that close durations still differ
        self.order_lengths = np.array([int(entry["duration"] * 100) for entry in self.entries], np.int64)

    def _sources(self, path: Any, content_name: Any, resolve_symlink: bool) -> list[_Source]:
        owner = self.owner
        if (isinstance(path, str) and os.path.splitext(path)[1] != ".zip" and os.path.isdir(path)
                and os.path.isfile(path + ".txt")):
            if content_name is not None or resolve_symlink:
                raise DataError(f"{owner}: path '{path}' is a directory; content_name and "
                                "resolve_symlink_for_name apply to zip files only (RETURNN refuses them "
                                "too).")
            return [_Source(os.path.basename(path), os.path.dirname(path))]
        paths = [path] if isinstance(path, str) else path
        if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, str) for p in paths):
            raise DataError(f"{owner}: path must be a zip file, a list of them, or a directory D with a "
                            f"D.txt beside it; got {path!r}.")
        names = [content_name] * len(paths) if isinstance(content_name, str) else content_name
        if names is not None and (not isinstance(names, (list, tuple)) or len(names) != len(paths)):
            raise DataError(f"{owner}: content_name must be a string or one name per path ({len(paths)}), "
                            f"got {content_name!r}.")
        sources, txt_gz = [], {}
        for i, p in enumerate(paths):
            name, ext = internal_name(p, resolve_symlink)
            name = names[i] if names is not None else name
            if ext == ".txt.gz":
                txt_gz[name] = p
                continue
            if ext != ".zip":
                hint = " (a directory needs its list D.txt beside it)" if os.path.isdir(p) else ""
                raise DataError(f"{owner}: path '{p}' is neither a .zip nor a .txt.gz file{hint}.")
            sources.append(_Source(name, p))
        if not sources:
            raise DataError(f"{owner}: path {path!r} names no zip file (only .txt.gz lists).")
        for source in sources:
            source.txt_gz = txt_gz.get(source.name)
            try:
                source.archive = zipfile.ZipFile(source.where)
            except FileNotFoundError:
                raise DataError(f"{owner}: zip file '{source.where}' does not exist.") from None
            except (OSError, zipfile.BadZipFile) as exc:
                raise DataError(f"{owner}: '{source.where}' cannot be opened as a zip file: {exc}.") from None
        return sources

    def _read_member(self, source: _Source, member: str) -> bytes:
        if source.archive is None:
            path = os.path.join(source.where, member)
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise DataError(f"{self.owner}: '{path}' cannot be read: {exc.strerror}.") from None
        try:
            with self._lock:  # one archive's reads share its file position
                return source.archive.read(member)
        except KeyError:
            raise DataError(f"{self.owner}: zip file '{source.where}' has no member '{member}' (its first "
                            f"members: {source.archive.namelist()[:5]}).") from None

    def _read_entries(self, index: int, source: _Source, segments: set[str] | None,
                      need_files: bool) -> list[dict[str, Any]]:
        listing = f"{source.name}.txt"
        if source.txt_gz:
            listing = source.txt_gz
            try:
                with gzip.open(source.txt_gz, "rb") as f:
                    raw = f.read()
            except OSError as exc:
                raise DataError(f"{self.owner}: '{source.txt_gz}' cannot be read: {exc}.") from None
        else:
            raw = self._read_member(source, listing)
            listing = f"'{source.where}' member '{listing}'" if source.archive else \
                os.path.join(source.where, listing)
        try:
            entries = literal_list(raw.decode("utf8"))
        except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as exc:
            raise DataError(f"{self.owner}: {listing} is not a Python literal list of dicts: "
                            f"{exc}.") from None
        if not isinstance(entries, list) or not entries:
            raise DataError(f"{self.owner}: {listing} must be a non-empty list of dicts.")
        for n, entry in enumerate(entries):
            problem = _entry_problem(entry, need_files)
            if problem:
                raise DataError(f"{self.owner}: {listing}, entry {n} ({_short(entry)}): {problem}.")
            entry["_source"] = index
        if segments is not None:
            entries = [e for e in entries if e.get("seq_name", e.get("file", "")) in segments]
        return entries

    def _subset(self, size: float | int, seed: int) -> list[dict[str, Any]]:
        if isinstance(size, float) and 0 < size < 1:
            size = int(len(self.entries) * size)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise DataError(f"{self.owner}: fixed_random_subset must be a fraction in (0, 1) or a count >= 1 "
                            f"of the {len(self.entries)} sequences; it gives {size!r}.")
        entries = list(self.entries)
        np.random.RandomState(seed).shuffle(entries)
        return entries[:size]

    def audio_bytes(self, idx: int) -> bytes:
        entry = self.entries[idx]
        if "file" not in entry:
            raise DataError(f"{self.owner}: sequence '{self.tags[idx]}' has no 'file' entry for its audio.")
        source = self.sources[entry["_source"]]
        member = f"{source.name}/{entry['file']}" if self.audio_prefix else entry["file"]
        return self._read_member(source, member)

    def close(self) -> None:
        for source in getattr(self, "sources", []):
            if source.archive is not None:
                source.archive.close()


def _entry_problem(entry: Any, need_files: bool) -> str:
    if not isinstance(entry, dict):
        return "not a dict"
    if not isinstance(entry.get("text"), str):
        return "'text' must be a string"
    duration = entry.get("duration")
    if not isinstance(duration, (int, float)) or isinstance(duration, bool):
        return "'duration' (seconds) must be a number"
    if "file" in entry and not isinstance(entry["file"], str):
        return "'file' must be a string"
    if "file" not in entry:
        if need_files:
            return "no 'file', but audio features are asked for (audio is not None)"
        if not isinstance(entry.get("seq_name"), str):
            return "a text-only entry (no 'file') needs a string 'seq_name'"
    return ""


def read_segment_file(path: str) -> set[str]:
    """The tags of a segment list: one a line, plain or ``.gz``."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path) as f:
                return {line.decode() for line in f.read().splitlines()}
        with open(path) as f:
            return set(f.read().splitlines())
    except OSError as exc:
        raise DataError(f"segment_file '{path}' cannot be read: {exc.strerror or exc}.") from None


def literal_list(text: str, lines_per_part: int = 2000) -> Any:
    """The Python literal ``text``, as ``ast.literal_eval``. A list written one item per line (as RETURNN's
    tools and this engine's write them) is parsed in parts of ``lines_per_part`` lines: the syntax tree of
    a whole LibriSpeech list (281k entries) would take gigabytes for a moment, in every rank."""
    lines = text.split("\n")
    if len(lines) <= lines_per_part or lines[0].strip() != "[" or lines[-1].strip() not in ("]", ""):
        return ast.literal_eval(text)
    body = [line for line in lines[1:] if line.strip() not in ("", "]")]
    items: list[Any] = []
    for start in range(0, len(body), lines_per_part):
        try:
            part = ast.literal_eval("[" + "\n".join(body[start:start + lines_per_part]) + "]")
        except (ValueError, SyntaxError, RecursionError):
            return ast.literal_eval(text)  # an item spans lines: the whole text at once
        items += part
    return items


def decode_audio(data: bytes, what: str) -> tuple[np.ndarray, int]:
    """``(samples, rate)``: float64 mono samples as soundfile reads them (integer formats in [-1, 1])."""
    import soundfile
    try:
        samples, rate = soundfile.read(io.BytesIO(data))
    except Exception as exc:  # libsndfile's errors come as RuntimeError or its LibsndfileError
        raise DataError(f"Audio of {what} cannot be decoded: {exc}.") from None
    if samples.ndim != 1:
        raise DataError(f"Audio of {what} has {samples.shape[1]} channels; features are made from mono audio "
                        "only (as in RETURNN).")
    return samples, int(rate)


def audio_info(data: bytes, what: str) -> tuple[int, int, int]:
    """``(frames, rate, channels)`` from the audio file's header (an Ogg Vorbis file's from its pages)."""
    known = vorbis_length(data)
    if known is not None:
        return known
    import soundfile
    try:
        info = soundfile.info(io.BytesIO(data))
    except Exception as exc:
        raise DataError(f"Audio of {what} cannot be decoded: {exc}.") from None
    return int(info.frames), int(info.samplerate), int(info.channels)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."
