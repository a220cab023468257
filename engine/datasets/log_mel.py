"""Log-mel features from audio samples, NumPy only: frames, a Hann window, the power spectrum and a
triangular mel filterbank (HTK's mel scale).

Frame i covers samples ``[i*shift, i*shift + window)``; only whole frames are made (a signal shorter than
one window gives none), so ``num_frames = 1 + (N - window) // shift``. The FFT size is the window rounded
up to a power of two. The log is taken of the mel energies floored at 1e-10.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ENERGY_FLOOR = 1e-10


@dataclass(frozen=True)
class LogMelOptions:
    """``sample_rate`` Hz; ``window_ms``/``shift_ms`` of a frame; ``num_mel_bins`` filters spread evenly on
    the mel scale between ``f_min`` and ``f_max`` Hz (None: half the sample rate)."""

    sample_rate: int = 16000
    window_ms: float = 25.0
    shift_ms: float = 10.0
    num_mel_bins: int = 40
    f_min: float = 0.0
    f_max: float | None = None

    @property
    def window(self) -> int:
        return int(round(self.sample_rate * self.window_ms / 1000))

    @property
    def shift(self) -> int:
        return int(round(self.sample_rate * self.shift_ms / 1000))

    @property
    def fft_size(self) -> int:
        return 1 << (self.window - 1).bit_length()

    def check(self) -> None:
        """Raises ValueError (the tool words it for its options) for a setting that cannot work."""
        if self.sample_rate < 1 or self.window < 2 or self.shift < 1 or self.num_mel_bins < 1:
            raise ValueError("the sample rate, window, shift and mel bins must be positive (window >= 2 "
                             f"samples), got {self}")
        top = self.sample_rate / 2 if self.f_max is None else self.f_max
        if not 0 <= self.f_min < top <= self.sample_rate / 2:
            raise ValueError(f"need 0 <= f_min < f_max <= sample_rate / 2, got f_min {self.f_min}, "
                             f"f_max {top}")


def hz_to_mel(hz: float | np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(hz, np.float64) / 700.0)


def mel_to_hz(mel: float | np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(mel, np.float64) / 2595.0) - 1.0)


def mel_filterbank(options: LogMelOptions) -> np.ndarray:
    """``(fft_size // 2 + 1, num_mel_bins)``: filter m rises from edge m to 1 at edge m+1 and falls to 0 at
    edge m+2 (edges evenly spaced in mel), weighting the FFT bins by their frequency."""
    top = options.sample_rate / 2 if options.f_max is None else options.f_max
    edges = mel_to_hz(np.linspace(hz_to_mel(options.f_min), hz_to_mel(top), options.num_mel_bins + 2))
    freqs = np.arange(options.fft_size // 2 + 1) * options.sample_rate / options.fft_size
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs[None, :] - lower) / (centre - lower)
    falling = (upper - freqs[None, :]) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling)).T


def frames_of(samples: np.ndarray, options: LogMelOptions) -> np.ndarray:
    """``(num_frames, window)`` views of the whole frames."""
    n, window, shift = len(samples), options.window, options.shift
    count = 0 if n < window else 1 + (n - window) // shift
    if count == 0:
        return np.zeros((0, window), np.float64)
    index = np.arange(window)[None, :] + shift * np.arange(count)[:, None]
    return np.asarray(samples, np.float64)[index]


def log_mel(samples: np.ndarray, options: LogMelOptions, filterbank: np.ndarray | None = None) -> np.ndarray:
    """``(num_frames, num_mel_bins)`` float32 log-mel energies of mono ``samples`` at the options' rate."""
    if filterbank is None:
        filterbank = mel_filterbank(options)
    frames = frames_of(samples, options) * np.hanning(options.window)[None, :]
    power = np.abs(np.fft.rfft(frames, n=options.fft_size, axis=1)) ** 2
    return np.log(np.maximum(power @ filterbank, ENERGY_FLOOR)).astype(np.float32)
