"""Reading audio files for feature extraction: WAV, FLAC and OGG as mono float32 at a given sample rate.

The ``soundfile`` wheel (libsndfile inside) reads all three formats; without it, WAV still works
through the standard library's ``wave`` module (8/16/24/32-bit PCM). Several channels are averaged to
one. A file at another sample rate is resampled with the FFT (a band-limited resampling: the spectrum is
cut or padded to the new rate's length), which is exact for the short utterances a corpus holds and needs
nothing beyond NumPy.
"""
from __future__ import annotations

import os
import wave

import numpy as np

from engine.runtime.errors import DataError

try:
    import soundfile
except (ImportError, OSError):  # no wheel, or a wheel whose libsndfile does not load: WAV through `wave`
    soundfile = None

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")


def read_audio(path: str, sample_rate: int | None = None) -> tuple[np.ndarray, int]:
    """``(samples, rate)``: mono float32 in [-1, 1], resampled to ``sample_rate`` when given.

    Raises DataError naming the file when it is missing, unreadable or of an unknown kind."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in AUDIO_SUFFIXES:
        raise DataError(f"Audio file '{path}': unknown kind '{suffix}'; this tool reads "
                        f"{', '.join(AUDIO_SUFFIXES)}.")
    if not os.path.isfile(path):
        raise DataError(f"Audio file '{path}' does not exist.")
    if soundfile is not None:
        try:
            samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
        except Exception as exc:  # libsndfile's errors come as RuntimeError or its own LibsndfileError
            raise DataError(f"Audio file '{path}' cannot be read: {exc}.") from None
    elif suffix == ".wav":
        samples, rate = _read_wav_stdlib(path)
    else:
        raise DataError(f"Audio file '{path}': reading {suffix} needs the 'soundfile' package "
                        "(pip install soundfile); only WAV is read without it.")
    mono = samples.mean(axis=1, dtype=np.float64).astype(np.float32) if samples.shape[1] > 1 \
        else samples[:, 0]
    if sample_rate is not None and rate != sample_rate:
        mono, rate = resample(mono, rate, sample_rate), sample_rate
    return np.ascontiguousarray(mono, np.float32), int(rate)


def _read_wav_stdlib(path: str) -> tuple[np.ndarray, int]:
    try:
        with wave.open(path, "rb") as f:
            width, channels, rate = f.getsampwidth(), f.getnchannels(), f.getframerate()
            raw = f.readframes(f.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise DataError(f"Audio file '{path}' cannot be read as WAV: {exc}.") from None
    if width == 1:  # 8-bit WAV is unsigned
        samples = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:  # 24-bit: pad each little-endian sample to 32 bits
        bytes3 = np.frombuffer(raw, np.uint8).reshape(-1, 3)
        padded = np.concatenate([np.zeros((len(bytes3), 1), np.uint8), bytes3], axis=1)
        samples = padded.copy().view("<i4")[:, 0].astype(np.float32) / 2.0 ** 31
    elif width in (2, 4):
        samples = np.frombuffer(raw, f"<i{width}").astype(np.float32) / 2.0 ** (8 * width - 1)
    else:
        raise DataError(f"Audio file '{path}': {8 * width}-bit WAV samples are not supported.")
    return samples.reshape(-1, channels), rate


def resample(samples: np.ndarray, rate: int, new_rate: int) -> np.ndarray:
    """``samples`` at ``rate`` Hz -> ``new_rate`` Hz, band-limited (the spectrum above the lower Nyquist
    frequency is dropped)."""
    n = len(samples)
    new_n = int(round(n * new_rate / rate))
    if n == 0 or new_n == 0:
        return np.zeros(new_n, np.float32)
    spectrum = np.fft.rfft(samples.astype(np.float64))
    keep = min(len(spectrum), new_n // 2 + 1)
    out = np.fft.irfft(spectrum[:keep], n=new_n) * (new_n / n)
    return out.astype(np.float32)
