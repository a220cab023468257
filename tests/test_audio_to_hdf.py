"""audio_to_hdf: reading WAV/FLAC/OGG (and WAV without soundfile), resampling, log-mel features against an
independent computation, labels with their own lengths, the label list, atomic output and its errors."""
from __future__ import annotations

import importlib.util
import os
import random
import re
import shutil
import subprocess
import sys
import wave

import h5py
import numpy as np
import pytest
import soundfile

from engine.datasets import HDFDataset, audio
from engine.datasets.log_mel import LogMelOptions, log_mel, mel_filterbank
from engine.runtime.errors import DataError
from engine.tools import audio_to_hdf
from helpers import ROOT, child_env
from prerequisites import missing

pytestmark = pytest.mark.tf_latest


def sine(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def write_wav_stdlib(path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def reference_log_mel(samples, rate=16000, window=400, shift=160, bins=40):
    """Written from the definitions with loops: Hann-windowed frames, a direct DFT of 512 points, triangles
    on HTK's mel scale between 0 Hz and rate / 2."""
    def mel(f):
        return 2595 * np.log10(1 + f / 700)

    def hz(m):
        return 700 * (10 ** (m / 2595) - 1)
    n_fft = 512
    edges = [hz(mel(rate / 2) * i / (bins + 1)) for i in range(bins + 2)]
    bank = np.zeros((n_fft // 2 + 1, bins))
    for k in range(n_fft // 2 + 1):
        f = k * rate / n_fft
        for m in range(bins):
            lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
            if lo < f <= mid:
                bank[k, m] = (f - lo) / (mid - lo)
            elif mid < f < hi:
                bank[k, m] = (hi - f) / (hi - mid)
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(window) / (window - 1))
    dft = np.exp(-2j * np.pi * np.outer(np.arange(window), np.arange(n_fft // 2 + 1)) / n_fft)
    out = []
    start = 0
    while start + window <= len(samples):
        spectrum = (samples[start:start + window].astype(np.float64) * hann) @ dft
        out.append(np.log(np.maximum(np.abs(spectrum) ** 2 @ bank, 1e-10)))
        start += shift
    return np.array(out).reshape(-1, bins)


def test_features_match_an_independent_computation():
    rng = np.random.RandomState(0)
    samples = (sine(440, 0.1, 16000) + 0.01 * rng.standard_normal(1600)).astype(np.float32)
    ours = log_mel(samples, LogMelOptions())
    ref = reference_log_mel(samples)
    assert ours.shape == (1 + (1600 - 400) // 160, 40) == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-3)
    # the 440 Hz tone lands in the filter whose centre is nearest to it
    centres = np.argmax(mel_filterbank(LogMelOptions()), axis=0) * 16000 / 512
    assert np.argmax(ours.mean(axis=0)) == np.argmin(np.abs(centres - 440))
    assert log_mel(samples[:399], LogMelOptions()).shape == (0, 40)  # shorter than a window: no frame
    assert log_mel(samples, LogMelOptions(num_mel_bins=80, shift_ms=20)).shape == (1 + 1200 // 320, 80)


def test_formats_and_the_stdlib_fallback(tmp_path, monkeypatch):
    tone = sine(1000, 0.25, 16000)
    soundfile.write(tmp_path / "a.wav", tone, 16000, subtype="PCM_16")
    soundfile.write(tmp_path / "a.flac", tone, 16000)
    soundfile.write(tmp_path / "a.ogg", tone, 16000)
    stereo = np.stack([tone, np.zeros_like(tone)], axis=1)
    soundfile.write(tmp_path / "stereo.wav", stereo, 16000, subtype="PCM_16")
    wav, rate = audio.read_audio(str(tmp_path / "a.wav"))
    assert rate == 16000 and wav.dtype == np.float32
    np.testing.assert_allclose(wav, tone, atol=1 / 32767)
    # lossless at 16 bits (libsndfile scales by 2^15 for FLAC, by 2^15 - 1 for WAV)
    np.testing.assert_allclose(audio.read_audio(str(tmp_path / "a.flac"))[0], tone, atol=2 / 32767)
    ogg = audio.read_audio(str(tmp_path / "a.ogg"))[0]  # lossy: the same tone
    assert abs(len(ogg) - len(tone)) < 100 and np.argmax(np.abs(np.fft.rfft(ogg))) * 16000 / len(ogg) == \
        pytest.approx(1000, abs=8)
    np.testing.assert_allclose(audio.read_audio(str(tmp_path / "stereo.wav"))[0], tone / 2, atol=1 / 32767)

    write_wav_stdlib(tmp_path / "std.wav", tone, 22050)
    with_soundfile = audio.read_audio(str(tmp_path / "std.wav"), 16000)[0]
    monkeypatch.setattr(audio, "soundfile", None)
    without = audio.read_audio(str(tmp_path / "std.wav"), 16000)[0]
    np.testing.assert_array_equal(without, with_soundfile)
    np.testing.assert_allclose(audio.read_audio(str(tmp_path / "stereo.wav"))[0], tone / 2, atol=1 / 32767)
    with pytest.raises(DataError, match="a.flac.*needs the 'soundfile' package"):
        audio.read_audio(str(tmp_path / "a.flac"))


def test_resampling_keeps_the_tone():
    tone = sine(1000, 1.0, 22050)
    out = audio.resample(tone, 22050, 16000)
    assert len(out) == 16000
    assert np.argmax(np.abs(np.fft.rfft(out))) == 1000  # 1 s: bin k is k Hz
    np.testing.assert_allclose(out[100:-100], sine(1000, 1.0, 16000)[100:-100], atol=1e-3)
    # a tone above the new Nyquist frequency is removed, not folded back
    assert np.abs(audio.resample(sine(10000, 1.0, 44100), 44100, 16000)).max() < 1e-3


@pytest.fixture
def corpus(tmp_path):
    """Three utterances in three formats and two sample rates, a list with a comment and a blank line."""
    os.makedirs(tmp_path / "audio")
    soundfile.write(tmp_path / "audio" / "u1.wav", sine(300, 0.3, 16000), 16000, subtype="PCM_16")
    soundfile.write(tmp_path / "audio" / "u2.flac", sine(600, 0.5, 22050), 22050)
    soundfile.write(tmp_path / "audio" / "u3.ogg", sine(900, 0.4, 16000), 16000)
    (tmp_path / "list.tsv").write_text("# path\ttranscript\naudio/u1.wav\tone two\n\n"
                                       "audio/u2.flac\t  two   two \naudio/u3.ogg\tthree\n")
    return tmp_path


def convert(*args) -> int:
    return audio_to_hdf.main([str(a) for a in args])


def test_corpus_with_character_labels(corpus):
    out = corpus / "out" / "train.hdf"
    assert convert(corpus / "list.tsv", out) == 0
    labels = sorted(set("one twothree"))
    assert (corpus / "out" / "train.hdf.labels").read_text() == "".join(f"{x}\n" for x in labels)
    ds = HDFDataset(str(out))
    ds.init_seq_order(1)
    assert ds.labels["classes"] == labels and ds.get_data_dim("data") == 40
    assert [ds.get_seq_tag(i) for i in range(3)] == ["audio/u1.wav", "audio/u2.flac", "audio/u3.ogg"]
    lengths = ds.epoch_seq_lengths()
    assert lengths[:2, 0].tolist() == [1 + (4800 - 400) // 160, 1 + (8000 - 400) // 160]  # u2 resampled
    assert lengths[:, 1].tolist() == [7, 7, 5]  # "one two", "two two" (spaces collapsed), "three"
    decoded = ["".join(labels[c] for c in ds.get_data(i, "classes")) for i in range(3)]
    assert decoded == ["one two", "two two", "three"]
    wav = audio.read_audio(str(corpus / "audio" / "u1.wav"))[0]
    np.testing.assert_allclose(ds.get_data(0, "data"), reference_log_mel(wav), rtol=1e-4, atol=1e-3)
    ds.close()


def test_word_labels_from_a_vocabulary(corpus):
    (corpus / "vocab.txt").write_text("zero\none\ntwo\nthree\n")
    out = corpus / "w.hdf"
    assert convert(corpus / "list.tsv", out, "--unit", "word", "--vocab", corpus / "vocab.txt",
                   "--num_mel_bins", 80) == 0
    with h5py.File(out, "r") as f:
        assert [x.decode() for x in f["targets/labels/classes"][()]] == ["zero", "one", "two", "three"]
        assert f["targets/data/classes"][()].tolist() == [1, 2, 2, 2, 3]
        assert f["seqLengths"][:, 1].tolist() == [2, 2, 1] and f["inputs"].shape[1] == 80
    assert convert(corpus / "list.tsv", corpus / "eos.hdf", "--unit", "word", "--vocab", corpus / "vocab.txt",
                   "--seq_postfix", "zero") == 0  # an end-of-sequence label after every sequence
    with h5py.File(corpus / "eos.hdf", "r") as f:
        assert f["targets/data/classes"][()].tolist() == [1, 2, 0, 2, 2, 0, 3, 0]
    assert convert(corpus / "list.tsv", corpus / "eos2.hdf", "--unit", "word", "--vocab",
                   corpus / "vocab.txt", "--seq_postfix", "</s>") != 0
    assert not os.path.exists(corpus / "eos2.hdf")
    (corpus / "vocab.txt").write_text("zero\none\nthree\n")
    assert convert(corpus / "list.tsv", corpus / "w2.hdf", "--unit", "word", "--vocab",
                   corpus / "vocab.txt") != 0
    assert not os.path.exists(corpus / "w2.hdf") and not os.path.exists(corpus / "w2.hdf.labels")


def leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if not n.endswith((".tsv", ".txt")) and n != "audio")


@pytest.mark.parametrize("bad_line, message", [
    ("audio/broken.wav\tfour", "broken.wav' cannot be read"),
    ("audio/missing.flac\tfour", "missing.flac' does not exist"),
    ("audio/u1.mp4\tfour", "unknown kind '.mp4'"),
    ("audio/u1.wav\t   ", r"list.tsv:6: the transcript of 'audio/u1.wav' is empty"),
    ("audio/u1.wav", "list.tsv:6 is not 'path<TAB>transcript'"),
    ("audio/tiny.wav\tfour", "tiny.wav.*is too short"),
])
def test_errors_name_the_file_and_leave_no_output(corpus, capsys, bad_line, message):
    (corpus / "audio" / "broken.wav").write_bytes(b"RIFF....WAVEfmt garbage")
    soundfile.write(corpus / "audio" / "tiny.wav", sine(300, 0.01, 16000), 16000)
    with open(corpus / "list.tsv", "a") as f:
        f.write(bad_line + "\n")
    before = leftovers(corpus)
    assert convert(corpus / "list.tsv", corpus / "out.hdf") != 0
    err = capsys.readouterr().err
    assert err.startswith("audio_to_hdf: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert leftovers(corpus) == before  # neither out.hdf, nor its labels, nor a temporary file


def test_existing_output_kept_without_overwrite_and_the_script_runs(corpus):
    (corpus / "out.hdf").write_text("keep me")
    script = str(ROOT / "tools" / "audio_to_hdf.py")
    r = subprocess.run([sys.executable, script, str(corpus / "list.tsv"), str(corpus / "out.hdf")],
                       capture_output=True, text=True, env=child_env(), timeout=120)
    assert r.returncode != 0 and "exists already" in r.stderr
    assert (corpus / "out.hdf").read_text() == "keep me"
    r = subprocess.run([sys.executable, script, str(corpus / "list.tsv"), str(corpus / "out.hdf"),
                        "--overwrite"], capture_output=True, text=True, env=child_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Wrote 3 utterances" in r.stdout and h5py.is_hdf5(corpus / "out.hdf")


def test_speech_corpus_script(tmp_path):
    """demos/make_speech_corpus.py: a tiny corpus where espeak-ng is installed; without the program (here
    hidden from PATH), one line and a non-zero exit."""
    script = [sys.executable, str(ROOT / "demos" / "make_speech_corpus.py")]
    env = child_env({"PATH": os.path.dirname(sys.executable)})
    r = subprocess.run(script + ["--out", str(tmp_path / "none")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "espeak-ng" in r.stderr
    assert not os.path.exists(tmp_path / "none")
    if shutil.which("espeak-ng") is None:  # .ci/run and make demo-speech install it
        missing("espeak-ng", "not on PATH (apt-get install espeak-ng; .ci/run installs it)")
    r = subprocess.run(script + ["--out", str(tmp_path / "speech"), "--num_train", "8", "--num_dev", "3"],
                       capture_output=True, text=True, env=child_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    digits = "zero one two three four five six seven eight nine".split()
    texts = {}
    for name, count in (("train", 8), ("dev", 3)):
        ds = HDFDataset(str(tmp_path / "speech" / f"{name}.hdf"))
        ds.init_seq_order(1)
        assert ds.num_seqs == count and ds.labels["classes"] == digits and ds.get_data_dim("data") == 40
        lengths = ds.epoch_seq_lengths()
        assert (lengths[:, 1] >= 2).all() and (lengths[:, 1] <= 5).all()
        assert (lengths[:, 0] > 8 * lengths[:, 1]).all()  # ~0.3 s a digit: room for a 4x time reduction
        texts[name] = {" ".join(digits[c] for c in ds.get_data(i, "classes")) for i in range(count)}
        ds.close()
    assert not texts["train"] & texts["dev"]  # dev sentences are unseen
    assert sorted(os.listdir(tmp_path / "speech")) == ["dev.hdf", "dev.hdf.labels", "train.hdf",
                                                       "train.hdf.labels", "vocab.txt"]


def test_speech_corpus_dev_styles_are_unseen():
    path = ROOT / "demos" / "make_speech_corpus.py"
    spec = importlib.util.spec_from_file_location("make_speech_corpus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    train, dev = module.split_styles(random.Random(1))
    assert not set(train) & set(dev) and len(train) + len(dev) == 6 * 3 * 3
    assert {v for v, _, _ in train} == {v for v, _, _ in dev} == set(module.VOICES)
    assert len(module.sentences(random.Random(2), 50, {"one two"})) == 50
