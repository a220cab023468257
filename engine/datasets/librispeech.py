"""``LibriSpeechCorpus``: RETURNN's reader of the LibriSpeech corpus as distributed (folders or zips).

    train = {"class": "LibriSpeechCorpus", "path": "LibriSpeech", "prefix": "train", "use_zip": True,
             "audio": {"norm_mean": "stats.mean.txt", "norm_std_dev": "stats.std_dev.txt"},
             "bpe": {"bpe_file": "bpe.codes", "vocab_file": "bpe.vocab", "unknown_label": "<unk>"},
             "partition_epoch": 20, "seq_ordering": "laplace:281",
             "epoch_wise_filter": {(1, 5): {"use_new_filter": True, "max_mean_len": 150,
                                            "subdirs": ["train-clean-100", "train-clean-360"]}}}

The files and the sequence tags (``seq_tag_format``, default ``train-clean-100-19-198-0001``):
``librispeech_files.py``. Data keys: ``data``, the audio features (the ``audio`` dict, as for
``OggZipDataset``; ``audio=None``: none), and ``classes``, the transcription's labels: ``targets`` a
vocabulary dict (as for ``OggZipDataset``), or ``"bpe"`` / ``"chars"`` with the options of a
``BytePairEncoding`` / ``CharacterTargets`` in ``bpe`` / ``chars`` (``bpe`` or ``chars`` alone also
choose it); no targets at all: no ``classes``. RETURNN's third key ``raw`` (the text as a string) is not
offered, as for ``OggZipDataset``; nor is ``orth``, which RETURNN's class does not have.

``orth_post_process`` (a function str -> str, or a list of them) changes the transcriptions as they are
read, so the labels and the lengths below see its result. ``sorted`` and ``laplace`` order by the
transcription's length in characters, as RETURNN does for this class (not by the audio's length); so
does ``epoch_wise_filter``, RETURNN's own variant for this class (``LibriSpeechFilter``).
The audio is decoded, featurised and seeded as in ``OggZipDataset`` (this class reuses it).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from engine.datasets.audio_features import AudioFeatures
from engine.datasets.base import Dataset
from engine.datasets.epoch_filter import _max_mean_len, epoch_range
from engine.datasets.librispeech_files import DEFAULT_TAG_FORMAT, LibriSpeechFiles
from engine.datasets.oggzip import OggZipDataset
from engine.datasets.orthography import text_post_processor
from engine.datasets.vocabulary import Vocabulary, create_vocabulary
from engine.runtime.errors import DataError


class LibriSpeechCorpus(OggZipDataset):
    """See the module's text. ``use_cache_manager`` has no effect here (the files are read where they are);
    ``path``, ``prefix`` and ``audio`` must be given, as in RETURNN."""

    def __init__(self, path: str, prefix: str, audio: dict[str, Any] | None, *,
                 orth_post_process: Callable[[str], str] | Sequence[Callable[[str], str]] | None = None,
                 targets: dict[str, Any] | str | None = None, chars: dict[str, Any] | None = None,
                 bpe: dict[str, Any] | None = None, use_zip: bool = False, use_ogg: bool = False,
                 fixed_random_subset: float | int | None = None, epoch_wise_filter: dict | None = None,
                 seq_tag_format: str = DEFAULT_TAG_FORMAT, **kwargs) -> None:
        if kwargs.get("name") is None:
            kwargs["name"] = f"LibriSpeechCorpus {prefix!r}"
        Dataset.__init__(self, **kwargs)
        if audio is not None and not isinstance(audio, dict):
            raise DataError(f"{self.name}: audio must be a dict of feature options ({{}} for the defaults) "
                            f"or None, got {audio!r}.")
        self.features = AudioFeatures(audio, owner=f"{self.name} audio") if audio is not None else None
        self.vocab = _vocabulary(targets, bpe, chars, self.name)
        if self.features is None and self.vocab is None:
            raise DataError(f"{self.name}: with audio=None and no targets nothing is left to read: RETURNN's "
                            "only key would be 'raw', the text as a string, which this engine's numeric "
                            "streams do not offer. Give audio options or targets.")
        self.post_process_text = None  # orth_post_process is applied as the transcriptions are read
        post_process = text_post_processor(orth_post_process, self.name, "orth_post_process")
        if not isinstance(seq_tag_format, str):
            raise DataError(f"{self.name}: seq_tag_format must be a %-format string, got {seq_tag_format!r}.")
        self.corpus = LibriSpeechFiles(path, prefix, use_zip=use_zip, use_ogg=use_ogg,
                                       post_process=post_process, fixed_random_subset=fixed_random_subset,
                                       tag_format=seq_tag_format, owner=self.name)
        try:
            self.epoch_filter = LibriSpeechFilter(epoch_wise_filter, self.corpus.subdirs,
                                                  owner=f"{self.name} epoch_wise_filter") \
                if epoch_wise_filter else None
        except DataError:
            self.corpus.close()
            raise
        self._init_streams(orth=False)

    def __repr__(self) -> str:
        return (f"<LibriSpeechCorpus [{self.corpus.path}, prefix {self.corpus.prefix!r}]: "
                f"{len(self.corpus.entries)} seqs, keys {self.data_keys}>")


def _vocabulary(targets: Any, bpe: Any, chars: Any, owner: str) -> Vocabulary | None:
    """RETURNN's choice among ``targets``, ``bpe`` and ``chars``; any other combination is refused."""
    if isinstance(targets, dict):
        if bpe is not None or chars is not None:
            raise DataError(f"{owner}: targets is a vocabulary dict, so bpe and chars must not be given "
                            "(RETURNN refuses the combination too).")
        return create_vocabulary(targets, owner=f"{owner} targets")
    for kind, opts, other, other_name in (("bpe", bpe, chars, "chars"), ("chars", chars, bpe, "bpe")):
        if targets == kind or (targets is None and opts is not None):
            if opts is None or other is not None:
                raise DataError(f"{owner}: targets {kind!r} needs the options dict '{kind}' and no "
                                f"'{other_name}' (got {kind}={opts!r}, {other_name}={other!r}).")
            if not isinstance(opts, dict) or "class" in opts:
                raise DataError(f"{owner}: {kind} must be a dict of {_CLASSES[kind]} options without 'class' "
                                f"(RETURNN passes it to {_CLASSES[kind]} itself), got {opts!r}.")
            return create_vocabulary({**opts, "class": _CLASSES[kind]}, owner=f"{owner} {kind}")
    if targets is None:
        return None
    raise DataError(f"{owner}: targets must be a vocabulary dict, 'bpe', 'chars' or None, got {targets!r}.")


_CLASSES = {"bpe": "BytePairEncoding", "chars": "CharacterTargets"}


class LibriSpeechFilter:
    """``epoch_wise_filter`` as ``LibriSpeechCorpus`` applies it: ``{(first, last): opts}`` (``None`` as
    first: 1; ``None`` or -1 as last: no end). In each active range, in the order of the sorted keys:
    ``subdirs`` (a list) keeps the sequences of those subdirs; then ``max_mean_len`` keeps the shortest
    ones (transcription characters) whose mean length is at most it. With ``use_new_filter`` that is
    ``epoch_filter.py``'s filter (kept in epoch order). Without, RETURNN's older search, kept for old
    setups' sake: it stops at the first count it tries whose mean is within the limit, which may be far
    fewer sequences than allowed, and the kept ones come sorted by (length, corpus index), not in epoch
    order."""

    OPTIONS = ("subdirs", "use_new_filter", "max_mean_len")

    def __init__(self, epochs_opts: dict, subdirs: Sequence[str], *,
                 owner: str = "epoch_wise_filter") -> None:
        self.owner, self.subdirs = owner, subdirs
        if not isinstance(epochs_opts, dict):
            raise DataError(f"{owner} must be a dict (first_epoch, last_epoch) -> options, got "
                            f"{epochs_opts!r}.")
        try:
            items = sorted(epochs_opts.items(), key=lambda item: item[0])
        except TypeError:
            raise DataError(f"{owner}: the epoch ranges {list(epochs_opts)} cannot be sorted (None beside a "
                            "number in the same place); RETURNN sorts them and fails the same way.") from None
        self.ranges: list[tuple[int, int, dict[str, Any]]] = []
        for key, opts in items:
            start, end, opts = epoch_range(key, opts, owner, self.OPTIONS, "LibriSpeechCorpus's filter")
            if opts.get("subdirs") is not None and not isinstance(opts["subdirs"], list):
                raise DataError(f"{owner}: subdirs for epochs {key!r} must be a list of subdir names, got "
                                f"{opts['subdirs']!r}.")
            self.ranges.append((start, end, opts))

    def filter(self, epoch: int, order: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The sequences of ``order`` (corpus indices) kept in ``epoch``; ``lengths`` per corpus index."""
        for start, end, opts in self.ranges:
            if not start <= epoch <= end:
                continue
            if opts.get("subdirs") is not None:
                wanted = set(opts["subdirs"])
                order = np.asarray([i for i in order if self.subdirs[i] in wanted], np.int64)
                if not len(order):
                    raise DataError(f"{self.owner}: in epoch {epoch} no sequence is of subdirs "
                                    f"{opts['subdirs']} (the corpus has {sorted(set(self.subdirs))}).")
            if opts.get("max_mean_len") and len(order):
                if opts.get("use_new_filter"):
                    order = _max_mean_len(order, lengths, float(opts["max_mean_len"]))
                else:
                    order = _old_max_mean_len(order, lengths, opts["max_mean_len"])
        return np.asarray(order, np.int64)


def _old_max_mean_len(order: np.ndarray, lengths: np.ndarray, max_mean: float) -> np.ndarray:
    pairs = np.array(sorted((int(lengths[i]), int(i)) for i in order), dtype=np.int64)
    low, high = 1, len(pairs) + 1
    while low < high:  # RETURNN's binary_search_any with a yes/no comparison: "within" ends the search
        mid = (low + high) // 2
        if np.mean(pairs[:mid, 0]) > max_mean:
            high = mid
        else:
            low = mid
            break
    return pairs[:low, 1]
