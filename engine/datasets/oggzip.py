"""``OggZipDataset``: RETURNN's corpus of zip archives with audio files and their transcriptions.

    train = {"class": "OggZipDataset", "path": "train.zip", "audio": {"features": "mfcc"},
             "targets": {"bpe_file": "bpe.codes", "vocab_file": "bpe.vocab", "unknown_label": "<unk>"},
             "partition_epoch": 20, "seq_ordering": "laplace:.1000"}

Data keys: ``data``, the audio features (``audio_features.py``; ``audio=None``: none), ``classes``, the
transcription's label indices (``vocabulary.py``; ``targets=None``: none), and ``orth``, the UTF-8 bytes
of the transcription (256 classes). RETURNN's fourth key ``raw`` (the text as a string) is not offered:
this engine's streams are numeric arrays. The files and their list: ``oggzip_corpus.py``.

Orders and seeds are RETURNN's: ``sorted``/``laplace`` use ``int(duration * 100)`` from the list, not
the features; every epoch seeds the audio generator (``random_permute``, ``pre_process``) and the
vocabulary with the epoch's seed; ``epoch_wise_filter`` thins out an epoch after ordering.

Batches are planned from lengths, which RETURNN learns only while reading. Here, when the features'
length follows from the audio's (no ``random_permute``, ``pre_process``, ``post_process`` or feature
function), the lengths come from the audio files' headers (each read once per corpus) and features are
computed when a batch needs them; otherwise the features of the whole (sub-)epoch are computed in
epoch order when it starts and kept in memory, which is what makes their random draws RETURNN's, and
costs memory (``partition_epoch`` keeps it to a part of the corpus).
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from engine.datasets import ordering
from engine.datasets.audio_features import AudioFeatures
from engine.datasets.base import DataKeyInfo, Dataset
from engine.datasets.epoch_filter import EpochWiseFilter
from engine.datasets.oggzip_corpus import OggZipCorpus, audio_info, decode_audio
from engine.datasets.orthography import text_post_processor
from engine.datasets.prefetch import BackgroundPass, SequencePrefetcher, prefetch_enabled, warm_up
from engine.datasets.vocabulary import Vocabulary, create_vocabulary
from engine.runtime.errors import DataError

FEATURE_CACHE_SEQS = 64  # computed features kept for reads of the same sequence (chunks, keys)
FIRST_FEATURES = 64  # epoch 1's first sequences computed while the network is built


class OggZipDataset(Dataset):
    """See the module's text. ``audio`` and ``targets`` must be given (None switches them off), as in
    RETURNN; ``use_cache_manager`` has no effect here (the files are read where they are)."""

    def __init__(self, path: str | Sequence[str], *, audio: dict[str, Any] | None,
                 targets: dict[str, Any] | Vocabulary | None, content_name: str | Sequence[str] | None = None,
                 resolve_symlink_for_name: bool = False, targets_post_process: Any = None,
                 segment_file: str | None = None, zip_audio_files_have_name_as_prefix: bool = True,
                 fixed_random_subset: float | int | None = None, fixed_random_subset_seed: int = 42,
                 epoch_wise_filter: dict | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if audio is not None and not isinstance(audio, dict):
            raise DataError(f"{self.name}: audio must be a dict of feature options ({{}} for the defaults) "
                            f"or None, got {audio!r}.")
        self.features = AudioFeatures(audio, owner=f"{self.name} audio") if audio is not None else None
        self.vocab = create_vocabulary(targets, owner=f"{self.name} targets") if targets is not None else None
        self.post_process_text = text_post_processor(targets_post_process, self.name)
        self.epoch_filter = EpochWiseFilter(epoch_wise_filter, owner=f"{self.name} epoch_wise_filter") \
            if epoch_wise_filter is not None else None
        self.corpus = OggZipCorpus(
            path, content_name=content_name, resolve_symlink_for_name=resolve_symlink_for_name,
            audio_prefix=zip_audio_files_have_name_as_prefix, segment_file=segment_file,
            need_files=self.features is not None, fixed_random_subset=fixed_random_subset,
            fixed_random_subset_seed=fixed_random_subset_seed, owner=self.name)
        self._init_streams()

    def _init_streams(self, orth: bool = True) -> None:
        """The data keys and the per-epoch state, once ``features``, ``vocab`` and ``corpus`` are set (also
        for ``LibriSpeechCorpus``, which has no ``orth``)."""
        if self.features is not None:
            self._keys["data"] = DataKeyInfo(dim=self.features.dim)
        if self.vocab is not None:
            self._keys["classes"] = DataKeyInfo(dim=self.vocab.num_labels, sparse=True)
            self.labels["classes"] = list(self.vocab.labels)
        # RETURNN names orth's classes chr(0)..chr(255); not here: an HDF file cannot store the NUL label
        if orth:
            self._keys["orth"] = DataKeyInfo(dim=256, sparse=True, dtype="uint8")
        self._audio_rng = np.random.RandomState(1)
        self._lock = threading.RLock()
        self._num_samples: dict[int, tuple[int, int]] = {}  # corpus idx -> (samples, rate), from headers
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._epoch_features: dict[int, np.ndarray] | None = None
        self._epoch_targets: dict[int, np.ndarray] = {}
        self._epoch_lengths: np.ndarray | None = None
        self._prefetcher: SequencePrefetcher | None = None
        self._spare: dict[int, np.ndarray] = {}  # features the last worker computed that were not read
        self._ahead: BackgroundPass | None = None
        if self.features is not None and self.features.predictable and prefetch_enabled():
            warm_up(self._warm_up_features, key=repr(self.features.features), name=f"{self.name} warm-up")
            self._prepare_ahead(1, first_features=FIRST_FEATURES)  # while the network is built

    # ----- epochs -----
    def init_seq_order(self, epoch: int) -> None:
        full_epoch = (epoch - 1) // self.partition_epoch + 1
        seed = ordering.epoch_seed(full_epoch, fixed_random_seed=self.fixed_random_seed,
                                   random_seed_offset=self.random_seed_offset)
        order = self._epoch_order(epoch)
        self._stop_prefetch()
        with self._lock:
            self._order, self.epoch = np.asarray(order, np.int64), epoch
            self._audio_rng.seed(seed)
            if self.vocab is not None:
                self.vocab.set_random_seed(seed)
            self._epoch_features = None
            self._epoch_targets = {}
            self._epoch_lengths = None
            if self.features is not None and not self.features.predictable:
                self._cache.clear()

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """Corpus indices of ``epoch``, in order (a function of the epoch only)."""
        order = ordering.epoch_order(
            self.seq_ordering, num_seqs=len(self.corpus.entries), epoch=epoch,
            get_lengths=lambda: self.corpus.order_lengths, partition_epoch=self.partition_epoch,
            fixed_random_seed=self.fixed_random_seed, random_seed_offset=self.random_seed_offset)
        if self.epoch_filter is not None:
            order = self.epoch_filter.filter(epoch, order, self.corpus.order_lengths)
        return np.asarray(order, np.int64)

    def epoch_seq_lengths(self) -> np.ndarray:
        with self._lock:
            if self._epoch_lengths is None:
                self._epoch_lengths = self._compute_epoch_lengths()
            return self._epoch_lengths

    def get_seq_length(self, seq_idx: int) -> dict[str, int]:
        return {key: int(n) for key, n in zip(self._keys, self.epoch_seq_lengths()[seq_idx])}

    def _compute_epoch_lengths(self) -> np.ndarray:
        eager = self.features is not None and not self.features.predictable
        if eager:
            self._epoch_features = {}
        lengths = np.zeros((len(self.order), len(self._keys)), np.int64)
        for row, idx in enumerate(self.order.tolist()):
            col = 0
            if self.features is not None:
                if eager:  # in epoch order: the random draws follow each other as in RETURNN
                    self._epoch_features[idx] = self._compute_features(idx)
                    lengths[row, col] = len(self._epoch_features[idx])
                else:
                    lengths[row, col] = self._predicted_frames(idx)
                col += 1
            if self.vocab is not None:
                lengths[row, col] = len(self._targets(idx))
                col += 1
            if "orth" in self._keys:
                lengths[row, col] = len(self.corpus.texts[idx].encode("utf8"))
        return lengths

    # ----- the corpus -----
    def _corpus_num_seqs(self) -> int:
        return len(self.corpus.entries)

    def _corpus_lengths(self) -> np.ndarray:
        raise NotImplementedError(f"{self.name}: lengths are known per epoch only; use epoch_seq_lengths()")

    def _corpus_tag(self, corpus_idx: int) -> str:
        return self.corpus.tags[corpus_idx]

    def _corpus_data(self, corpus_idx: int, key: str) -> np.ndarray:
        if key == "data" and self.features is not None:
            return self._features(corpus_idx).copy()
        if key == "classes" and self.vocab is not None:
            return self._targets(corpus_idx).copy()
        if key == "orth" and "orth" in self._keys:
            return np.frombuffer(self.corpus.texts[corpus_idx].encode("utf8"), np.uint8).copy()
        self.key_info(key)  # raises the DataError naming the keys
        raise AssertionError(key)

    def _what(self, idx: int) -> str:
        return f"{self.name} sequence '{self.corpus.tags[idx]}'"

    def _targets(self, idx: int) -> np.ndarray:
        with self._lock:
            seq = self._epoch_targets.get(idx)
            if seq is None:
                text = self.corpus.texts[idx]
                if self.post_process_text is not None:
                    text = self.post_process_text(text)
                try:
                    seq = np.asarray(self.vocab.get_seq(text), np.int32)
                except DataError as exc:
                    raise DataError(f"{self._what(idx)}: {exc}") from None
                self._epoch_targets[idx] = seq
            return seq

    def _audio_length(self, idx: int) -> tuple[int, int]:
        """(samples, rate) of the sequence's audio, from its header (read once)."""
        info = self._num_samples.get(idx)
        if info is None:
            frames, rate, channels = audio_info(self.corpus.audio_bytes(idx), self._what(idx))
            if channels != 1:
                raise DataError(f"Audio of {self._what(idx)} has {channels} channels; features are made from "
                                "mono audio only (as in RETURNN).")
            info = self._num_samples[idx] = (frames, rate)
        return info

    def _predicted_frames(self, idx: int) -> int:
        info = self._audio_length(idx)
        frames = self.features.num_frames(*info)
        least = 9 if self.features.with_delta else 1
        if frames < least:
            raise DataError(f"{self._what(idx)}: {info[0]} samples give {frames} feature frames; at least "
                            f"{least} are needed{' for with_delta' if least > 1 else ''}.")
        return frames

    def will_read(self, positions: np.ndarray, next_epoch_start: int = 0) -> None:
        """Features without random draws are computed ahead in a background thread (``prefetch.py``), and
        then the start of the next epoch; what that has computed seeds the next epoch's worker. Another
        thread reads the audio lengths of the next epoch, which its plan needs."""
        self._stop_prefetch()
        if self._ahead is not None:  # it may still fill ``_spare``
            self._ahead.stop()
        if self.features is not None and self.features.predictable and len(positions) and prefetch_enabled():
            next_order = self._epoch_order(self.epoch + 1)
            self._prefetcher = SequencePrefetcher(
                self._compute_features, self.order[positions].tolist(),
                then=next_order[:next_epoch_start].tolist(), done=self._spare,
                name=f"{self.name} feature prefetch")
            self._prepare_ahead(self.epoch + 1, next_order)
        self._spare = {}

    def _prepare_ahead(self, epoch: int, order: np.ndarray | None = None, first_features: int = 0) -> None:
        """In a background thread: the audio lengths of ``epoch``'s sequences, which its plan needs (read
        from disk: 0.5 ms a file when it is cold), then the features of its first ``first_features``
        sequences (kept for the epoch's worker, as the previous epoch's worker keeps them)."""
        if self._ahead is not None:
            self._ahead.stop()
        try:
            order = self._epoch_order(epoch) if order is None else order
        except DataError:  # e.g. an epoch_wise_filter that empties the epoch: its init_seq_order says so
            return
        jobs = [functools.partial(self._audio_length, idx) for idx in order.tolist()
                if idx not in self._num_samples]
        jobs += [functools.partial(self._keep_spare, idx) for idx in order[:first_features].tolist()]
        self._ahead = BackgroundPass(jobs, name=f"{self.name} epoch {epoch} ahead")

    def _keep_spare(self, idx: int) -> None:
        if idx not in self._spare:
            self._spare[idx] = self._compute_features(idx)

    def _warm_up_features(self) -> None:
        rate = self.features.sample_rate or 16000
        noise = np.random.RandomState(0).uniform(-0.1, 0.1, rate)  # one second
        self.features.compute(noise, rate, np.random.RandomState(0))

    def _stop_prefetch(self) -> None:
        if self._prefetcher is not None:
            self._spare = self._prefetcher.close()
            self._prefetcher = None

    def _features(self, idx: int) -> np.ndarray:
        prefetcher = self._prefetcher
        with self._lock:
            if self._epoch_features is not None and idx in self._epoch_features:
                return self._epoch_features[idx]
            if self.features.predictable and idx in self._cache:
                self._cache.move_to_end(idx)
                return self._cache[idx]
            if not self.features.predictable:  # only epoch order gives RETURNN's random draws
                self.epoch_seq_lengths()
                return self._epoch_features[idx]
            data = prefetcher.take(idx) if prefetcher is not None else None
            if data is None:
                data = self._compute_features(idx)
            self._cache[idx] = data
            while len(self._cache) > FEATURE_CACHE_SEQS:
                self._cache.popitem(last=False)
            return data

    def _compute_features(self, idx: int) -> np.ndarray:
        samples, rate = decode_audio(self.corpus.audio_bytes(idx), self._what(idx))
        expected = self._num_samples.get(idx)
        if expected is not None and len(samples) != expected[0]:
            raise DataError(f"{self._what(idx)}: the audio header says {expected[0]} samples, but "
                            f"{len(samples)} were decoded.")
        data = self.features.compute(samples, rate, self._audio_rng, seq_name=self.corpus.tags[idx])
        return np.ascontiguousarray(data, np.float32)

    def close(self) -> None:
        self._stop_prefetch()
        if self._ahead is not None:
            self._ahead.stop()
            self._ahead = None
        self._spare = {}
        self.corpus.close()

    def __repr__(self) -> str:
        where = ", ".join(s.where or "." for s in self.corpus.sources)
        return f"<OggZipDataset [{where}]: {len(self.corpus.entries)} seqs, keys {self.data_keys}>"
