#!/usr/bin/env python3
"""Synthesise the spoken-digit corpus with espeak-ng as RETURNN's LibriSpeech setups keep their data: Ogg
zips for ``OggZipDataset``, subword-nmt BPE codes and vocabulary, feature statistics
(``configs/speech_ctc_oggzip.py``, ``make demo-oggzip``).

    python demos/make_oggzip_corpus.py [--out data/speech_oggzip] [--num_train 400] [--num_dev 60]
                                       [--seed 1] [--bpe_merges 20] [--tree]

The utterances are those of ``make_speech_corpus.py`` with the same seed (same digit strings, voices,
speeds and pitches; dev in unseen voice/speed/pitch combinations), upper-cased as LibriSpeech's
transcriptions are, resampled to 16 kHz and written as Ogg Vorbis:

- ``train.zip`` / ``dev.zip``: ``train.txt``, the list ``[{"file": "1001-102-0000.ogg", "seq_name":
  "train/1001-102-0000/1001-102-0000", "text": "THREE ONE", "duration": 1.23}, ...]`` (speaker: the
  voice, chapter: the speed and pitch, as in LibriSpeech's naming), and the files under ``train/``;
- ``bpe.codes`` (``#version: 0.2``, ``--bpe_merges`` merges learnt from the training text as subword-nmt
  learns them: the most frequent pair of symbols, ties to the larger pair) and ``bpe.vocab`` (a dict
  literal label -> index: ``<unk>`` then the pieces of the segmented training text, most frequent first);
- ``stats.mean.txt`` / ``stats.std_dev.txt``: mean and standard deviation of the training set's MFCCs
  (``OggZipDataset``'s default features), for ``norm_mean`` / ``norm_std_dev``;
- with ``--tree``, also ``LibriSpeech/train-clean-100`` and ``LibriSpeech/dev-clean`` as LibriSpeech is
  distributed (FLAC files, ``.trans.txt`` lists) for ``LibriSpeechCorpus``.

Needs the ``espeak-ng`` program (Debian: ``apt-get install espeak-ng``).
"""
from __future__ import annotations

import argparse
import collections
import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_speech_corpus import PITCHES, SPEEDS, VOICES, sentences, split_styles  # noqa: E402

SAMPLE_RATE = 16000


def learn_bpe(texts: list[str], merges: int) -> list[tuple[str, str]]:
    """subword-nmt's merges (version 0.2: the end-of-word marker glued to the last character)."""
    words = collections.Counter(word for text in texts for word in text.split())
    vocab = {tuple(word[:-1]) + (word[-1] + "</w>",): count for word, count in words.items()}
    codes: list[tuple[str, str]] = []
    for _ in range(merges):
        pairs: collections.Counter = collections.Counter()
        for symbols, count in vocab.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs, key=lambda pair: (pairs[pair], pair))
        codes.append(best)
        merged = {}
        for symbols, count in vocab.items():
            out, i = [], 0
            while i < len(symbols):
                if symbols[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] = count
        vocab = merged
    return codes


def write_bpe(out: str, texts: list[str], merges: int) -> dict[str, int]:
    from engine.datasets.bpe import BpeCodes

    codes_file = os.path.join(out, "bpe.codes")
    with open(codes_file, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in learn_bpe(texts, merges)))
    codes = BpeCodes(codes_file)
    counts = collections.Counter(piece for text in texts for piece in codes.segment(text))
    labels = ["<unk>"] + sorted(counts, key=lambda piece: (-counts[piece], piece))
    vocab = {label: i for i, label in enumerate(labels)}
    with open(os.path.join(out, "bpe.vocab"), "w", encoding="utf-8") as f:
        f.write("{\n" + "".join(f"{label!r}: {i},\n" for label, i in vocab.items()) + "}\n")
    return vocab


def utterance_name(style: tuple, counters: dict) -> str:
    """LibriSpeech's ``<speaker>-<chapter>-<utt>``: the voice is the speaker, speed and pitch the chapter."""
    voice, speed, pitch = style
    speaker = 1001 + VOICES.index(voice)
    chapter = 101 + SPEEDS.index(speed) * len(PITCHES) + PITCHES.index(pitch)
    utt = counters[(speaker, chapter)] = counters.get((speaker, chapter), -1) + 1
    return f"{speaker}-{chapter}-{utt:04d}"


def read_16k(path: str) -> np.ndarray:
    import soundfile
    from scipy.signal import resample_poly

    samples, rate = soundfile.read(path)
    divisor = np.gcd(SAMPLE_RATE, rate)
    return resample_poly(samples, SAMPLE_RATE // divisor, rate // divisor)


def synthesise(folder: str, name: str, texts: list[str], styles: list, rng: random.Random) -> list[tuple]:
    """``(wav path, text, style)`` of one split; the styles are drawn as make_speech_corpus.py draws them."""
    out = []
    for i, text in enumerate(texts):
        voice, speed, pitch = style = rng.choice(styles)
        wav = os.path.join(folder, f"{name}-{i:04d}.wav")
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", wav, text],
                       check=True, stdout=subprocess.DEVNULL)
        out.append((wav, text, style))
    return out


def write_split(out: str, name: str, utterances: list[tuple], tree_subdir: str | None) -> None:
    """``NAME.zip`` (and the LibriSpeech tree's ``tree_subdir``) from the WAVs."""
    import soundfile

    entries, chapters, counters = [], collections.defaultdict(list), {}
    with zipfile.ZipFile(os.path.join(out, f"{name}.zip"), "w") as archive:
        for wav, text, style in utterances:
            utt, text = utterance_name(style, counters), text.upper()
            samples = np.clip(read_16k(wav), -1.0, 1.0)
            buffer = io.BytesIO()
            soundfile.write(buffer, samples, SAMPLE_RATE, format="OGG", subtype="VORBIS")
            archive.writestr(f"{name}/{utt}.ogg", buffer.getvalue())
            entries.append({"file": f"{utt}.ogg", "seq_name": f"{name}/{utt}/{utt}", "text": text,
                            "duration": round(len(samples) / SAMPLE_RATE, 4)})
            if tree_subdir:
                speaker, chapter, _ = utt.split("-")
                folder = os.path.join(out, "LibriSpeech", tree_subdir, speaker, chapter)
                os.makedirs(folder, exist_ok=True)
                soundfile.write(os.path.join(folder, f"{utt}.flac"), samples, SAMPLE_RATE, subtype="PCM_16")
                chapters[os.path.join(folder, f"{speaker}-{chapter}.trans.txt")].append(f"{utt} {text}\n")
        archive.writestr(f"{name}.txt", "[\n" + "".join(f"{entry!r},\n" for entry in entries) + "]\n")
    for path, lines in chapters.items():
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(lines)


def write_stats(out: str) -> None:
    """Mean and standard deviation of the training MFCCs over all frames, as RETURNN's setups keep them."""
    from engine.datasets.factory import create_dataset

    dataset = create_dataset({"class": "OggZipDataset", "path": os.path.join(out, "train.zip"), "audio": {},
                              "targets": None})
    dataset.init_seq_order(1)
    total, total_sq, frames = 0.0, 0.0, 0
    for i in range(dataset.num_seqs):
        data = dataset.get_data(i, "data").astype(np.float64)
        total, total_sq, frames = total + data.sum(0), total_sq + (data ** 2).sum(0), frames + len(data)
    mean = total / frames
    np.savetxt(os.path.join(out, "stats.mean.txt"), mean)
    np.savetxt(os.path.join(out, "stats.std_dev.txt"), np.sqrt(np.maximum(total_sq / frames - mean ** 2, 0)))
    dataset.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/speech_oggzip", help="output folder [data/speech_oggzip]")
    parser.add_argument("--num_train", type=int, default=400)
    parser.add_argument("--num_dev", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bpe_merges", type=int, default=20)
    parser.add_argument("--tree", action="store_true", help="also write a LibriSpeech folder tree (FLAC)")
    args = parser.parse_args(argv)
    if shutil.which("espeak-ng") is None:
        print("make_oggzip_corpus: the program 'espeak-ng' is not installed (Debian/Ubuntu: "
              "apt-get install -y espeak-ng); no corpus written.", file=sys.stderr)
        return 1
    started = time.monotonic()
    rng = random.Random(args.seed)  # drawn in make_speech_corpus.py's order: the same utterances
    train_styles, dev_styles = split_styles(rng)
    train_texts = sentences(rng, args.num_train, set())
    dev_texts = sentences(rng, args.num_dev, set(train_texts))
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(os.path.join(args.out, "LibriSpeech"), ignore_errors=True)
    splits = {"train": (train_texts, train_styles, "train-clean-100"),
              "dev": (dev_texts, dev_styles, "dev-clean")}
    with tempfile.TemporaryDirectory(prefix=".wav-", dir=args.out) as folder:
        wavs = {name: synthesise(folder, name, texts, styles, rng)
                for name, (texts, styles, _) in splits.items()}
        synth_s = time.monotonic() - started
        for name, utterances in wavs.items():
            write_split(args.out, name, utterances, splits[name][2] if args.tree else None)
    counts = {name: len(utterances) for name, utterances in wavs.items()}
    vocab = write_bpe(args.out, [t.upper() for t in train_texts], args.bpe_merges)
    write_stats(args.out)
    size_mb = sum(os.path.getsize(os.path.join(args.out, f"{n}.zip")) for n in counts) / 2**20
    print(f"Synthesised {counts['train']} + {counts['dev']} utterances in {synth_s:.1f} s; Ogg zips "
          f"{size_mb:.1f} MiB; BPE {args.bpe_merges} merges, {len(vocab)} labels; corpus in {args.out}/ "
          f"made in {time.monotonic() - started:.1f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
