"""The files of a ``LibriSpeechCorpus``: LibriSpeech as distributed (https://www.openslr.org/12/), either
extracted or as its zip archives.

Extracted: ``PATH/<subdir>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` lists the utterances of a
chapter, one a line, ``<speaker>-<chapter>-<utt> TRANSCRIPTION``; the audio is beside it as
``<speaker>-<chapter>-<utt>.flac``. ``<subdir>`` is every directory ``PATH/<prefix>*`` (``prefix``
``"dev"``: ``dev-clean`` and ``dev-other``). With ``use_zip``, ``PATH/<prefix>*.zip`` are read instead,
each ``<subdir>.zip`` holding ``LibriSpeech/<subdir>/...``. With ``use_ogg`` every audio file name gets a
``.ogg`` suffix (``...-0000.flac.ogg``), the Ogg copies RETURNN's setups made of the corpus.

As in RETURNN, an utterance is the key ``(subdir, speaker, chapter, utt)`` with the numbers as integers
(so speaker 19 comes before 103, and the audio of ``0019-...`` is looked up as ``19/...``); the corpus
order is these keys sorted. ``PATH`` must hold ``train-clean-100`` (``.zip`` with ``use_zip``) whatever
the prefix: RETURNN checks for it to recognise a LibriSpeech folder.
"""
from __future__ import annotations

import glob
import os
import threading
import zipfile
from typing import Callable

import numpy as np

from engine.runtime.errors import DataError

Key = tuple  # (subdir: str, speaker: int, chapter: int, utt: int)
DEFAULT_TAG_FORMAT = "%(subdir)s-%(speaker)i-%(chapter)i-%(seq)04i"
PREFIX_KINDS = ("train", "dev", "test")
SUBSET_SEED = 42  # RETURNN's fixed seed for fixed_random_subset; it has no option to change it


class LibriSpeechFiles:
    """The utterances (keys, tags, transcriptions) in corpus order, and reads of their audio.

    ``entries``, ``tags``, ``texts``, ``order_lengths`` and ``audio_bytes`` are what ``OggZipDataset``
    reads from its corpus; ``order_lengths`` are the transcriptions' lengths in characters, which is what
    RETURNN sorts and filters LibriSpeech by."""

    def __init__(self, path: str, prefix: str, *, use_zip: bool = False, use_ogg: bool = False,
                 post_process: Callable[[str], str] | None = None,
                 fixed_random_subset: float | int | None = None, tag_format: str = DEFAULT_TAG_FORMAT,
                 owner: str = "LibriSpeechCorpus") -> None:
        self.owner = owner
        if not isinstance(path, (str, os.PathLike)):
            raise DataError(f"{owner}: path must be the LibriSpeech folder, got {path!r}.")
        self.path = os.fspath(path)
        if not isinstance(prefix, str) or prefix.split("-")[0] not in PREFIX_KINDS:
            raise DataError(f"{owner}: prefix must start with one of {', '.join(PREFIX_KINDS)} (e.g. "
                            f"'train', 'dev-clean'), got {prefix!r}.")
        self.prefix, self.use_zip, self.use_ogg = prefix, bool(use_zip), bool(use_ogg)
        self._lock = threading.Lock()
        self.archives: dict[str, zipfile.ZipFile] = {}
        zip_names = self._zip_names() if use_zip else []
        marker = os.path.join(self.path, "train-clean-100" + (".zip" if use_zip else ""))
        if not os.path.exists(marker):
            raise DataError(f"{owner}: '{self.path}' does not look like LibriSpeech: '{marker}' is missing "
                            "(RETURNN requires it whatever the prefix).")
        try:
            texts = self._read_zips(zip_names, post_process) if use_zip else self._read_tree(post_process)
        except BaseException:
            self.close()
            raise
        self.entries: list[Key] = sorted(texts)
        if fixed_random_subset:
            self.entries = _subset(self.entries, fixed_random_subset, owner)
        self.texts = [texts[key] for key in self.entries]
        self.tags = [_tag(tag_format, key, owner) for key in self.entries]
        self.subdirs = [key[0] for key in self.entries]
        self.order_lengths = np.array([len(text) for text in self.texts], np.int64)

    # ----- transcriptions -----
    def _read_tree(self, post_process: Callable[[str], str] | None) -> dict[Key, str]:
        texts: dict[Key, str] = {}
        pattern = os.path.join(glob.escape(self.path), glob.escape(self.prefix) + "*")
        for folder in sorted(p for p in glob.glob(pattern) if os.path.isdir(p)):
            subdir = os.path.basename(folder)
            for name in sorted(glob.glob(os.path.join(glob.escape(folder), "*", "*", "*.trans.txt"))):
                try:
                    with open(name, encoding="utf8") as f:
                        content = f.read()
                except (OSError, UnicodeDecodeError) as exc:
                    raise DataError(f"{self.owner}: transcription file '{name}' cannot be read: "
                                    f"{exc}.") from None
                self._add_lines(texts, subdir, content, f"'{name}'", post_process)
        if not texts:
            raise DataError(f"{self.owner}: no transcriptions (*/*/*.trans.txt) under '{pattern}'.")
        return texts

    def _zip_names(self) -> list[str]:
        pattern = os.path.join(glob.escape(self.path), glob.escape(self.prefix) + "*.zip")
        names = sorted(glob.glob(pattern))
        if not names:
            raise DataError(f"{self.owner}: use_zip is set, but there are no zip files '{pattern}'.")
        return names

    def _read_zips(self, names: list[str], post_process: Callable[[str], str] | None) -> dict[Key, str]:
        texts: dict[Key, str] = {}
        for name in names:
            subdir = os.path.splitext(os.path.basename(name))[0]
            try:
                archive = self.archives[subdir] = zipfile.ZipFile(name)
            except (OSError, zipfile.BadZipFile) as exc:
                raise DataError(f"{self.owner}: '{name}' cannot be opened as a zip file: {exc}.") from None
            members = archive.namelist()
            if not members or not members[0].startswith("LibriSpeech/"):
                raise DataError(f"{self.owner}: zip file '{name}' must hold LibriSpeech/{subdir}/...; its "
                                f"first member is {members[:1]}.")
            for member in members:
                parts = member.split("/")
                if parts[0] != "LibriSpeech":
                    raise DataError(f"{self.owner}: zip file '{name}' has member '{member}' outside "
                                    "LibriSpeech/.")
                if len(parts) < 2 or not parts[1].startswith(self.prefix):
                    continue
                if parts[1] != subdir:
                    raise DataError(f"{self.owner}: zip file '{name}' holds '{member}', but only "
                                    f"LibriSpeech/{subdir}/ belongs in it.")
                if parts[-1].endswith(".trans.txt"):
                    try:
                        content = archive.read(member).decode("utf8")
                    except UnicodeDecodeError as exc:
                        raise DataError(f"{self.owner}: '{name}' member '{member}' is not UTF-8: "
                                        f"{exc}.") from None
                    self._add_lines(texts, subdir, content, f"'{name}' member '{member}'", post_process)
        if not texts:
            raise DataError(f"{self.owner}: no transcriptions (*.trans.txt) in {', '.join(names)}.")
        return texts

    def _add_lines(self, texts: dict[Key, str], subdir: str, content: str, where: str,
                   post_process: Callable[[str], str] | None) -> None:
        for number, line in enumerate(content.splitlines(), 1):
            name, space, text = line.partition(" ")
            try:
                if not space:
                    raise ValueError
                speaker, chapter, utt = map(int, name.split("-"))
            except ValueError:
                raise DataError(f"{self.owner}: {where}, line {number}: expected '<speaker>-<chapter>-<utt> "
                                f"TRANSCRIPTION', found {line[:80]!r}.") from None
            key = (subdir, speaker, chapter, utt)
            if key in texts:  # RETURNN keeps whichever file its directory listing gives last
                raise DataError(f"{self.owner}: {where}, line {number}: utterance {name} of {subdir} is "
                                "listed twice.")
            texts[key] = post_process(text) if post_process is not None else text

    # ----- audio -----
    def audio_name(self, idx: int) -> str:
        """The audio file of utterance ``idx``, relative to PATH (inside the zip: under ``LibriSpeech/``)."""
        subdir, speaker, chapter, utt = self.entries[idx]
        name = f"{subdir}/{speaker}/{chapter}/{speaker}-{chapter}-{utt:04d}.flac"
        return name + ".ogg" if self.use_ogg else name

    def audio_bytes(self, idx: int) -> bytes:
        name = self.audio_name(idx)
        if self.use_zip:
            archive = self.archives[self.entries[idx][0]]
            try:
                with self._lock:  # one archive's reads share its file position
                    return archive.read(f"LibriSpeech/{name}")
            except KeyError:
                raise DataError(f"{self.owner}: zip file '{archive.filename}' has no member "
                                f"'LibriSpeech/{name}' (the audio of '{self.tags[idx]}').") from None
        path = os.path.join(self.path, name)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise DataError(f"{self.owner}: the audio of '{self.tags[idx]}', '{path}', cannot be read: "
                            f"{exc.strerror}.") from None

    def close(self) -> None:
        for archive in self.archives.values():
            archive.close()


def _subset(keys: list[Key], size: float | int, owner: str) -> list[Key]:
    """RETURNN's fixed subset: the sorted keys shuffled with seed 42, the first ``size`` of them (a fraction
    in (0, 1) of the corpus, or a count); they stay in the shuffled order."""
    if isinstance(size, float) and 0 < size < 1:
        size = int(len(keys) * size)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise DataError(f"{owner}: fixed_random_subset must be a fraction in (0, 1) or a count >= 1 of the "
                        f"{len(keys)} sequences; it gives {size!r}.")
    keys = list(keys)
    np.random.RandomState(SUBSET_SEED).shuffle(keys)
    return keys[:size]


def _tag(tag_format: str, key: Key, owner: str) -> str:
    subdir, speaker, chapter, utt = key
    try:
        return tag_format % {"subdir": subdir, "speaker": speaker, "chapter": chapter, "seq": utt}
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{owner}: seq_tag_format {tag_format!r} cannot be filled in from subdir, speaker, "
                        f"chapter and seq: {type(exc).__name__}: {exc}.") from None
