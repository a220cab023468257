"""Audio features as RETURNN's ``ExtractAudioFeatures`` computes them (the ``audio`` dict of
``OggZipDataset``), with librosa, the library RETURNN uses.

The samples are float64 as soundfile reads them. Then, in this order: ``preemphasis`` (a first-order
filter), ``peak_normalization`` (divide by the largest magnitude; on by default), ``random_permute``
(random scale, zoom, time stretch and pitch shift, ``audio_permute.py``), ``pre_process(audio=,
sample_rate=, random_state=)``, the features (``features``: ``mfcc`` (default; its first coefficient
replaced by the frame energy), ``log_mel_filterbank``, ``log_log_mel_filterbank``, ``db_mel_filterbank``,
``linear_spectrogram``, ``raw`` samples, or a function), ``with_delta`` (librosa's delta features of
order 1..N appended), ``norm_mean`` / ``norm_std_dev`` (a number, a vector, a text file of one, or
``"per_seq"``), ``join_frames`` (stack N frames into one, the last padded with copies), and
``post_process(features, seq_name=)``. Frames are ``window_len`` / ``step_len`` seconds (25 / 10 ms);
``num_feature_filters`` dims (40; 1 for raw), ``feature_options`` goes to the feature function.

Where nothing random or user-written takes part, the number of frames follows from the number of samples
(``num_frames``), which lets a dataset plan batches without computing features.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from engine.datasets.audio_permute import PermuteOptions, random_permute
from engine.runtime.errors import DataError

DEFAULT_NUM_FILTERS = 40
REFUSED_FEATURES = {
    "raw_ogg": "it decodes Ogg Vorbis packets with RETURNN's own C++ extension (extern/ParseOggVorbis), "
               "which this engine does not have",
    "f0": "it needs the 'pyworld' package, which this engine does not depend on",
}
REFUSED_OPTIONS = {
    "num_channels": "multi-channel raw waveforms are not implemented here (only mono audio is read)",
    "random_state": "the dataset owns the generator (seeded per epoch, as in RETURNN); it cannot be given",
    "raw_ogg_opts": "it configures features 'raw_ogg', which is refused ("
                    + REFUSED_FEATURES["raw_ogg"] + ")",
}


def _librosa():
    try:
        import librosa
    except ImportError:
        raise DataError("Audio features need the 'librosa' package (pip install librosa).") from None
    return librosa


def _frames_params(sample_rate: int, window_len: float, step_len: float) -> dict:
    return {"hop_length": int(step_len * sample_rate), "n_fft": int(window_len * sample_rate)}


def mfcc(audio, sample_rate, window_len=0.025, step_len=0.010, num_feature_filters=40, n_mels=128, fmin=0,
         fmax=None, center=True):
    """MFCCs with the frame's RMS energy in place of the first coefficient."""
    librosa = _librosa()
    frames = _frames_params(sample_rate, window_len, step_len)
    out = librosa.feature.mfcc(y=audio, sr=sample_rate, n_mfcc=num_feature_filters, n_mels=n_mels, fmin=fmin,
                               fmax=fmax, center=center, **frames)
    out[0] = librosa.feature.rms(y=audio, hop_length=frames["hop_length"], frame_length=frames["n_fft"],
                                 center=center)
    return out.T.astype("float32")


def _mel(audio, sample_rate, window_len, step_len, num_feature_filters, **kwargs):
    return _librosa().feature.melspectrogram(y=audio, sr=sample_rate, n_mels=num_feature_filters,
                                             **_frames_params(sample_rate, window_len, step_len),
                                             **kwargs)


def log_mel_filterbank(audio, sample_rate, window_len=0.025, step_len=0.010, num_feature_filters=80):
    """Natural log of the mel power spectrogram, floored at 1e-3."""
    mel = _mel(audio, sample_rate, window_len, step_len, num_feature_filters)
    return np.log(np.maximum(1e-3, mel)).T.astype("float32")


def log_log_mel_filterbank(audio, sample_rate, window_len=0.025, step_len=0.010, num_feature_filters=80):
    """``log_mel_filterbank`` in decibels (librosa's amplitude_to_db of it)."""
    mel = _mel(audio, sample_rate, window_len, step_len, num_feature_filters)
    return _librosa().amplitude_to_db(np.log(np.maximum(1e-3, mel))).T.astype("float32")


def db_mel_filterbank(audio, sample_rate, window_len=0.025, step_len=0.010, num_feature_filters=80, fmin=0,
                      fmax=None, min_amp=1e-10, center=True):
    """``20 log10`` of the mel power spectrogram, floored at ``min_amp``."""
    if fmin < 0 or min_amp <= 0:
        raise DataError(f"db_mel_filterbank needs fmin >= 0 and min_amp > 0, got {fmin}, {min_amp}.")
    mel = _mel(audio, sample_rate, window_len, step_len, num_feature_filters, fmin=fmin, fmax=fmax,
               center=center)
    return (20 * np.log10(np.maximum(min_amp, mel))).T.astype("float32")


def linear_spectrogram(audio, sample_rate, window_len=0.025, step_len=0.010, num_feature_filters=512,
                       center=True):
    """STFT magnitudes without the DC bin: ``2 * num_feature_filters`` FFT points."""
    spectrum = np.abs(_librosa().stft(audio, hop_length=int(step_len * sample_rate),
                                      win_length=int(window_len * sample_rate),
                                      n_fft=num_feature_filters * 2, center=center))
    return spectrum[1:].T.astype("float32")


FEATURES: dict[str, Callable[..., np.ndarray]] = {f.__name__: f for f in (
    mfcc, log_mel_filterbank, log_log_mel_filterbank, db_mel_filterbank, linear_spectrogram)}


class AudioFeatures:
    """One ``audio`` dict, checked; ``compute`` makes the features of one utterance."""

    def __init__(self, opts: dict[str, Any], *, owner: str = "audio") -> None:
        self.owner = owner
        known = set(inspect.signature(_options).parameters)
        for name in sorted(set(opts) & set(REFUSED_OPTIONS)):
            if opts[name] is not None:
                raise DataError(f"{owner} option {name!r} is not implemented: {REFUSED_OPTIONS[name]}.")
        unknown = sorted(set(opts) - known - set(REFUSED_OPTIONS))
        if unknown:
            raise DataError(f"{owner}: unknown option(s) {', '.join(map(repr, unknown))}; RETURNN's "
                            f"ExtractAudioFeatures takes {', '.join(sorted(known | set(REFUSED_OPTIONS)))}.")
        o = _options(**{k: v for k, v in opts.items() if k not in REFUSED_OPTIONS})
        self.features = o["features"]
        if isinstance(self.features, str) and self.features in REFUSED_FEATURES:
            raise DataError(f"{owner}: features {self.features!r} is not implemented: "
                            f"{REFUSED_FEATURES[self.features]}.")
        if not callable(self.features) and self.features not in FEATURES and self.features != "raw":
            raise DataError(f"{owner}: unknown features {self.features!r}; implemented: "
                            f"{', '.join([*FEATURES, 'raw'])} or a function.")
        self.num_filters = o["num_feature_filters"] or (1 if self.features == "raw" else DEFAULT_NUM_FILTERS)
        if self.features == "raw" and self.num_filters != 1:
            raise DataError(f"{owner}: features 'raw' has one dim; num_feature_filters is "
                            f"{self.num_filters}.")
        with_delta = o["with_delta"]
        self.with_delta = int(with_delta) if isinstance(with_delta, bool) else with_delta
        if not isinstance(self.with_delta, int) or self.with_delta < 0:
            raise DataError(f"{owner}: with_delta must be a bool or an int >= 0, got {with_delta!r}.")
        self.join_frames = o["join_frames"]
        self.dim = (self.with_delta + 1) * self.num_filters * (self.join_frames or 1)
        self.norm_mean = self._norm("norm_mean", o["norm_mean"])
        self.norm_std_dev = self._norm("norm_std_dev", o["norm_std_dev"])
        self.kwargs = {"window_len": o["window_len"], "step_len": o["step_len"],
                       "num_feature_filters": self.num_filters, **(o["feature_options"] or {})}
        if isinstance(self.features, str) and self.features in FEATURES:
            takes = set(inspect.signature(FEATURES[self.features]).parameters) - {"audio", "sample_rate"}
            extra = sorted(set(self.kwargs) - takes)
            if extra:
                raise DataError(f"{owner}: feature_options {', '.join(map(repr, extra))} are not options of "
                                f"features {self.features!r} (it takes {', '.join(sorted(takes))}).")
        self.permute = PermuteOptions.parse(o["random_permute"], owner=f"{owner} random_permute")
        self.pre_process, self.post_process = o["pre_process"], o["post_process"]
        self.sample_rate, self.preemphasis = o["sample_rate"], o["preemphasis"]
        self.peak_normalization = o["peak_normalization"]
        # randomness or user code may change the length: then only computing the features tells it
        self.predictable = not (self.permute or self.pre_process or self.post_process
                                or callable(self.features))

    def _norm(self, name: str, value: Any) -> float | np.ndarray | str | None:
        if value is None or (isinstance(value, str) and value == "per_seq") or (
                isinstance(value, (int, float)) and not isinstance(value, bool)):
            return value
        if self.join_frames:
            raise DataError(f"{self.owner}: {name} as a vector with join_frames fails in RETURNN (the vector "
                            "is checked against the joined dim but applied before joining); give a number "
                            "or 'per_seq', or no join_frames.")
        if isinstance(value, str):
            try:
                value = np.loadtxt(value)
            except (OSError, ValueError) as exc:
                raise DataError(f"{self.owner} {name}: file '{value}' cannot be read as numbers: "
                                f"{exc}.") from None
        value = np.asarray(value)
        if value.shape != (self.dim,):
            raise DataError(f"{self.owner} {name}: expected {self.dim} values (the feature dim), got shape "
                            f"{value.shape}.")
        return value.astype("float32")

    def num_frames(self, num_samples: int, sample_rate: int) -> int:
        """The feature frames of ``num_samples`` samples (``predictable`` features only)."""
        if self.features == "raw":
            frames = num_samples
        else:
            kw = self.kwargs
            hop = int(kw["step_len"] * sample_rate)
            n_fft = kw["num_feature_filters"] * 2 if self.features == "linear_spectrogram" \
                else int(kw["window_len"] * sample_rate)
            if kw.get("center", True):
                frames = 1 + (num_samples + 2 * (n_fft // 2) - n_fft) // hop
            else:
                frames = 1 + (num_samples - n_fft) // hop if num_samples >= n_fft else -1
        if self.join_frames:
            frames = -(-frames // self.join_frames)
        return frames

    def compute(self, audio: np.ndarray, sample_rate: int, rng: np.random.RandomState,
                seq_name: str | None = None) -> np.ndarray:
        """``(frames, dim)`` float32 features of mono float64 ``audio``; ``rng`` for the random parts."""
        if self.sample_rate is not None and sample_rate != self.sample_rate:
            raise DataError(f"{self.owner}: '{seq_name}' has sample rate {sample_rate}, the option "
                            f"sample_rate says {self.sample_rate}; resampling is not done (nor in RETURNN).")
        if self.preemphasis:
            from scipy import signal
            audio = signal.lfilter([1, -self.preemphasis], [1], audio)
        if self.peak_normalization:
            peak = np.max(np.abs(audio))
            if peak != 0.0:
                audio /= peak
        if self.permute:
            audio = random_permute(audio, sample_rate, self.permute, rng)
        if self.pre_process:
            audio = self.pre_process(audio=audio, sample_rate=sample_rate, random_state=rng)
            if not isinstance(audio, np.ndarray) or audio.ndim != 1:
                raise DataError(f"{self.owner} pre_process must return a 1-D numpy array of samples.")
        data = self._features(audio, sample_rate, rng, seq_name)
        if self.with_delta:
            librosa = _librosa()
            if len(data) < 9:
                raise DataError(f"{self.owner}: '{seq_name}' has {len(data)} frames; with_delta needs at "
                                "least 9 (librosa's delta window), as in RETURNN.")
            data = np.concatenate([data] + [librosa.feature.delta(data, order=i, axis=0).astype("float32")
                                            for i in range(1, self.with_delta + 1)], axis=-1)
        data = self._normalise(data)
        if self.join_frames is not None:
            pad = -len(data) % self.join_frames
            data = np.pad(data, ((0, pad), (0, 0)), mode="edge")
            data = data.reshape(len(data) // self.join_frames, data.shape[-1] * self.join_frames)
        if self.post_process:
            data = self.post_process(data, seq_name=seq_name)
            if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[-1] != self.dim:
                raise DataError(f"{self.owner} post_process must return a (frames, {self.dim}) numpy array.")
        return data

    def _features(self, audio: np.ndarray, sample_rate: int, rng: np.random.RandomState,
                  seq_name: str | None) -> np.ndarray:
        if self.features == "raw":
            return audio[:, None].astype("float32")
        kwargs = {"sample_rate": sample_rate, "audio": audio, **self.kwargs}
        if callable(self.features):
            data = self.features(random_state=rng, **kwargs)
        else:
            try:
                data = FEATURES[self.features](**kwargs)
            except Exception as exc:  # librosa's ParameterError: e.g. a signal shorter than one window
                if type(exc).__name__ != "ParameterError":
                    raise
                raise DataError(f"{self.owner}: features of '{seq_name}' ({len(audio)} samples): "
                                f"{exc}.") from None
        if data.ndim != 2 or data.shape[-1] != self.num_filters:
            raise DataError(f"{self.owner}: features of '{seq_name}' have shape {data.shape}; expected "
                            f"(frames, {self.num_filters}).")
        return data

    def _normalise(self, data: np.ndarray) -> np.ndarray:
        if isinstance(self.norm_mean, str):
            data -= np.mean(data, axis=0, keepdims=True)
        elif self.norm_mean is not None:
            data -= self.norm_mean
        if isinstance(self.norm_std_dev, str):
            data /= np.maximum(np.std(data, axis=0, keepdims=True), 1e-2)
        elif self.norm_std_dev is not None:
            data /= self.norm_std_dev
        return data


def _options(window_len=0.025, step_len=0.010, num_feature_filters=None, with_delta=False, norm_mean=None,
             norm_std_dev=None, features="mfcc", feature_options=None, random_permute=None, pre_process=None,
             post_process=None, sample_rate=None, peak_normalization=True, preemphasis=None,
             join_frames=None):
    """RETURNN's options of ExtractAudioFeatures and their defaults (the refused ones aside)."""
    return dict(locals())
