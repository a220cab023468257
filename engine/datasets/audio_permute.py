"""``random_permute`` of RETURNN's audio features: random changes of the waveform before the features.

``True`` uses the defaults below, a dict overrides some of them, ``False``/``None``/``{}`` is off. Per
utterance, from the dataset's generator and in this order: the samples are scaled by a factor drawn from
[``rnd_scale_lower``, ``rnd_scale_upper``]; with probability ``rnd_zoom_switch`` resampled by a zoom
factor (scipy's spline ``zoom`` of order ``rnd_zoom_order``); with probability ``rnd_stretch_switch``
time-stretched (librosa) by a rate; with probability ``rnd_pitch_switch`` pitch-shifted by a number of
semitones. Every probability check draws one number whether it passes or not, so the draws of the next
utterance depend on this one's, as in RETURNN.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from engine.runtime.errors import DataError

DEFAULTS = {
    "rnd_scale_lower": 0.8, "rnd_scale_upper": 1.0,
    "rnd_zoom_switch": 0.2, "rnd_zoom_lower": 0.9, "rnd_zoom_upper": 1.1, "rnd_zoom_order": 3,
    "rnd_stretch_switch": 0.2, "rnd_stretch_lower": 0.9, "rnd_stretch_upper": 1.2,
    "rnd_pitch_switch": 0.2, "rnd_pitch_lower": -1.0, "rnd_pitch_upper": 1.0,
}
_GROUPS = {"zoom": ("rnd_zoom_lower", "rnd_zoom_upper", "rnd_zoom_order"),
           "stretch": ("rnd_stretch_lower", "rnd_stretch_upper"),
           "pitch": ("rnd_pitch_lower", "rnd_pitch_upper")}


class PermuteOptions(dict):
    """The checked options with defaults filled in."""

    @classmethod
    def parse(cls, value: Any, *, owner: str) -> PermuteOptions | None:
        if value is None or value is False:
            return None
        if value is True:
            return cls(DEFAULTS)
        if not isinstance(value, dict):
            raise DataError(f"{owner} must be True, False or a dict of options, got {value!r}.")
        if not value:
            return None  # RETURNN: an empty dict is false, so nothing is changed
        unknown = sorted(set(value) - set(DEFAULTS))
        if unknown:
            raise DataError(f"{owner}: unknown option(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}.")
        for group, names in _GROUPS.items():
            switch = value.get(f"rnd_{group}_switch", 1.0)
            unused = [n for n in names if n in value]
            if switch <= 0 and unused:
                # RETURNN stops at the first utterance here (it checks that every option given was read)
                raise DataError(f"{owner}: rnd_{group}_switch is {switch}, so {', '.join(unused)} would "
                                "never be used; RETURNN refuses that too.")
        return cls({**DEFAULTS, **value})


def random_permute(audio: np.ndarray, sample_rate: int, opts: PermuteOptions,
                   rng: np.random.RandomState) -> np.ndarray:
    """The changed samples (another length after a zoom or a stretch)."""
    import librosa
    import scipy.ndimage

    audio = audio * rng.uniform(opts["rnd_scale_lower"], opts["rnd_scale_upper"])
    if rng.uniform(0.0, 1.0) < opts["rnd_zoom_switch"]:
        factor = rng.uniform(opts["rnd_zoom_lower"], opts["rnd_zoom_upper"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            audio = scipy.ndimage.zoom(audio, factor, order=opts["rnd_zoom_order"])
    if rng.uniform(0.0, 1.0) < opts["rnd_stretch_switch"]:
        rate = rng.uniform(opts["rnd_stretch_lower"], opts["rnd_stretch_upper"])
        audio = librosa.effects.time_stretch(audio, rate=rate)
    if rng.uniform(0.0, 1.0) < opts["rnd_pitch_switch"]:
        n_steps = rng.uniform(opts["rnd_pitch_lower"], opts["rnd_pitch_upper"])
        audio = librosa.effects.pitch_shift(audio, sr=sample_rate, n_steps=n_steps)
    return audio
