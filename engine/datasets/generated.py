"""Generated datasets for demos and tests: no download, deterministic given the seeds.

As in RETURNN, generated data is drawn anew for every full epoch (seed: the epoch number plus
``random_seed_offset``) unless ``fixed_random_seed`` is given, which fixes content and order; a dev set
should therefore set ``fixed_random_seed``.
"""
from __future__ import annotations

import numpy as np

from engine.datasets.base import DataKeyInfo, Dataset
from engine.datasets.memory import InMemoryDataset
from engine.datasets.ordering import epoch_seed
from engine.runtime.errors import DataError

SYMBOLS_12AX = "123ABCXYZ"
_ONE, _TWO, _A, _B, _X, _Y = (SYMBOLS_12AX.index(c) for c in "12ABXY")


def _check_positive(owner: str, **values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DataError(f"{owner}: {name} must be a positive integer, got {value!r}.")


def targets_12ax(symbols: np.ndarray) -> np.ndarray:
    """Per frame: 1 (R) on an X right after an A while the last digit was 1, or a Y right after a B
    while the last digit was 2; else 0 (L). ``symbols`` index into ``SYMBOLS_12AX``."""
    symbols = np.asarray(symbols)
    positions = np.where(symbols <= 2, np.arange(len(symbols)), -1)
    last_digit_pos = np.maximum.accumulate(positions) if len(symbols) else positions
    context = np.where(last_digit_pos >= 0, symbols[np.maximum(last_digit_pos, 0)], -1)
    prev = np.concatenate([[-1], symbols[:-1]])
    right = ((symbols == _X) & (prev == _A) & (context == _ONE)) | \
            ((symbols == _Y) & (prev == _B) & (context == _TWO))
    return right.astype(np.int32)


class Task12AXDataset(InMemoryDataset):
    """The 12AX working-memory task: inputs ``1 2 3 A B C X Y Z`` one-hot (dense float32, dim 9, as in
    RETURNN, whose 12AX configs declare ``num_inputs = 9``), classes L/R (sparse, dim 2).

    A sequence is 1-4 outer loops, each a digit (1, 2, or the distractor 3) followed by 1-4 letter pairs
    (A/B/C then X/Y/Z). Half of the pairs are the target pair of the current digit (A-X after 1, B-Y
    after 2), so R frames are frequent enough to learn from; the answer needs the digit remembered
    across the inner loops.
    """

    def __init__(self, num_seqs: int = 1000, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_positive(self.name, num_seqs=num_seqs)
        self.num_seqs_total = num_seqs
        self._seed = None
        self.labels = {"data": list(SYMBOLS_12AX), "classes": ["L", "R"]}
        self._prepare_full_epoch(1)

    def _prepare_full_epoch(self, full_epoch: int) -> None:
        seed = epoch_seed(full_epoch, fixed_random_seed=self.fixed_random_seed,
                          random_seed_offset=self.random_seed_offset)
        if seed == self._seed:
            return
        rng = np.random.RandomState(seed)
        seqs = [self._generate(rng) for _ in range(self.num_seqs_total)]
        lengths = np.array([len(s) for s in seqs], np.int64)
        symbols = np.concatenate(seqs)
        data = np.eye(len(SYMBOLS_12AX), dtype=np.float32)[symbols]
        keys = {"data": DataKeyInfo(dim=len(SYMBOLS_12AX)), "classes": DataKeyInfo(dim=2, sparse=True)}
        classes = np.concatenate([targets_12ax(s) for s in seqs])
        self._set_corpus(keys, {"data": data, "classes": classes}, np.stack([lengths, lengths], axis=1),
                         [f"12ax-{seed}-{i}" for i in range(self.num_seqs_total)])
        self._seed = seed

    @staticmethod
    def _generate(rng: np.random.RandomState) -> np.ndarray:
        out = []
        for digit in rng.choice(3, size=rng.randint(1, 5), p=[0.4, 0.4, 0.2]):
            out.append(digit)
            num_pairs = rng.randint(1, 5)
            first, second = rng.randint(3, 6, size=num_pairs), rng.randint(6, 9, size=num_pairs)
            target = rng.rand(num_pairs) < 0.5
            if digit == _ONE:
                first[target], second[target] = _A, _X
            elif digit == _TWO:
                first[target], second[target] = _B, _Y
            out.extend(np.stack([first, second], axis=1).reshape(-1))
        return np.array(out, np.int32)


class DummyDataset(Dataset):
    """Random features ``(seq_len, input_dim)`` and classes given by a fixed random linear map of them
    (so a model can learn something), generated per sequence on demand."""

    def __init__(self, input_dim: int, output_dim: int, num_seqs: int, seq_len: int = 20, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_positive(self.name, input_dim=input_dim, output_dim=output_dim, num_seqs=num_seqs,
                        seq_len=seq_len)
        self.num_seqs_total, self.seq_len = num_seqs, seq_len
        self._keys = {"data": DataKeyInfo(dim=input_dim), "classes": DataKeyInfo(dim=output_dim, sparse=True)}
        self._lengths = np.full((num_seqs, 2), seq_len, dtype=np.int64)
        weights_seed = (self.fixed_random_seed or 0) % 2**32
        self._weights = np.random.RandomState(weights_seed).standard_normal((input_dim, output_dim))
        self._seed = 1
        self._last: tuple = (None, None)  # (seed, corpus index) and features of the last sequence drawn

    def _prepare_full_epoch(self, full_epoch: int) -> None:
        self._seed = epoch_seed(full_epoch, fixed_random_seed=self.fixed_random_seed,
                                random_seed_offset=self.random_seed_offset)

    def _corpus_num_seqs(self) -> int:
        return self.num_seqs_total

    def _corpus_lengths(self) -> np.ndarray:
        return self._lengths

    def _corpus_tag(self, corpus_idx: int) -> str:
        return f"dummy-{self._seed}-{corpus_idx}"

    def _corpus_data(self, corpus_idx: int, key: str) -> np.ndarray:
        self.key_info(key)
        if self._last[0] != (self._seed, corpus_idx):  # both keys of a sequence come from one draw
            rng = np.random.RandomState([self._seed, corpus_idx])
            features = rng.standard_normal((self.seq_len, self._keys["data"].dim)).astype(np.float32)
            self._last = ((self._seed, corpus_idx), features)
        features = self._last[1]
        if key == "data":
            return features.copy()
        return np.argmax(features @ self._weights, axis=1).astype(np.int32)


class LabelFramesDataset(InMemoryDataset):
    """A label sequence rendered as frames, for sequence training (CTC): targets shorter than the input.

    Each sequence is ``min_labels``..``max_labels`` labels drawn from ``num_labels``; every label becomes
    ``min_frames``..``max_frames`` frames of its own fixed random pattern (dim ``input_dim``) plus Gaussian
    noise (``noise``), with 1-2 frames of silence (noise only) before, between and after the labels, so
    that a repeated label stays two labels. ``data``: dense float32 ``(T, input_dim)``; ``classes``: the
    labels, sparse ``(L,)`` with their own length. Not a RETURNN class: this engine's test corpus.
    """

    def __init__(self, num_seqs: int = 100, num_labels: int = 5, input_dim: int = 8, min_labels: int = 1,
                 max_labels: int = 6, min_frames: int = 2, max_frames: int = 5, noise: float = 0.3,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        _check_positive(self.name, num_seqs=num_seqs, num_labels=num_labels, input_dim=input_dim,
                        min_labels=min_labels, max_labels=max_labels, min_frames=min_frames,
                        max_frames=max_frames)
        if min_labels > max_labels or min_frames > max_frames:
            raise DataError(f"{self.name}: need min_labels <= max_labels and min_frames <= max_frames, got "
                            f"{min_labels}..{max_labels} labels and {min_frames}..{max_frames} frames.")
        if not isinstance(noise, (int, float)) or isinstance(noise, bool) or noise < 0:
            raise DataError(f"{self.name}: noise must be a number >= 0, got {noise!r}.")
        self.num_seqs_total, self.num_labels, self.input_dim = num_seqs, num_labels, input_dim
        self.label_range, self.frame_range = (min_labels, max_labels), (min_frames, max_frames)
        self.noise = noise
        # the label patterns are one fixed task; only the sequences change with the epoch's seed
        patterns = np.random.RandomState(1234).standard_normal((num_labels, input_dim))
        self.patterns = patterns.astype(np.float32)
        self.labels = {"classes": [f"L{i}" for i in range(num_labels)]}
        self._seed = None
        self._prepare_full_epoch(1)

    def _prepare_full_epoch(self, full_epoch: int) -> None:
        seed = epoch_seed(full_epoch, fixed_random_seed=self.fixed_random_seed,
                          random_seed_offset=self.random_seed_offset)
        if seed == self._seed:
            return
        rng = np.random.RandomState(seed)
        feats, labels = zip(*(self.render(rng) for _ in range(self.num_seqs_total)))
        lengths = np.array([[len(f), len(lab)] for f, lab in zip(feats, labels)], np.int64)
        keys = {"data": DataKeyInfo(dim=self.input_dim),
                "classes": DataKeyInfo(dim=self.num_labels, sparse=True)}
        self._set_corpus(keys, {"data": np.concatenate(feats), "classes": np.concatenate(labels)}, lengths,
                         [f"labelframes-{seed}-{i}" for i in range(self.num_seqs_total)])
        self._seed = seed

    def render(self, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
        """One sequence: (frames ``(T, input_dim)`` float32, labels ``(L,)`` int32)."""
        num = rng.randint(self.label_range[0], self.label_range[1] + 1)
        labels = rng.randint(0, self.num_labels, size=num)
        pieces = [np.zeros((rng.randint(1, 3), self.input_dim), np.float32)]
        for label in labels:
            duration = rng.randint(self.frame_range[0], self.frame_range[1] + 1)
            pieces.append(np.repeat(self.patterns[label:label + 1], duration, axis=0))
            pieces.append(np.zeros((rng.randint(1, 3), self.input_dim), np.float32))
        frames = np.concatenate(pieces)
        frames += self.noise * rng.standard_normal(frames.shape).astype(np.float32)
        return frames, labels.astype(np.int32)
