#!/usr/bin/env python3
"""Synthesise a small spoken-digit corpus with espeak-ng and write it as HDF (log-mel ``data``, word
``classes`` with their own lengths) for the BLSTM-CTC demo (``configs/speech_ctc.py``, ``make demo-speech``).

    python demos/make_speech_corpus.py [--out data/speech] [--num_train 400] [--num_dev 60] [--seed 1] [--eos]

Each utterance says 2-5 random digits ("three one four"). Voices, speeds and pitches vary; the
(voice, speed, pitch) combinations are split, so the dev set is spoken only in combinations train never
hears, and no dev digit string occurs in train. The WAVs go to a temporary folder beside the output and
are removed; the output is ``train.hdf`` and ``dev.hdf`` (written by ``audio_to_hdf``, 40 log-mel bins,
10 ms shift), their ``.labels`` files and ``vocab.txt`` (the ten digit words: the label ids). Needs the
``espeak-ng`` program (Debian: ``apt-get install espeak-ng``).
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.runtime.errors import EngineError  # noqa: E402
from engine.tools import audio_to_hdf  # noqa: E402

EOS = "</s>"
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
VOICES = ["en+m1", "en+m3", "en+f2", "en+f3", "en-us+m2", "en-us+f4"]
SPEEDS = [130, 155, 180]
PITCHES = [35, 55, 75]
DEV_SHARE = 0.2  # of the (voice, speed, pitch) combinations


def split_styles(rng: random.Random) -> tuple[list, list]:
    """(train, dev) voice/speed/pitch combinations; every voice appears in both."""
    styles = list(itertools.product(VOICES, SPEEDS, PITCHES))
    rng.shuffle(styles)
    dev = []
    for voice in VOICES:  # one held-out combination per voice, then more at random
        dev.append(next(s for s in styles if s[0] == voice and s not in dev))
    extra = [s for s in styles if s not in dev]
    dev += extra[:max(0, int(len(styles) * DEV_SHARE) - len(dev))]
    return [s for s in styles if s not in dev], dev


def sentences(rng: random.Random, count: int, exclude: set[str]) -> list[str]:
    out: list[str] = []
    seen = set(exclude)
    while len(out) < count:
        text = " ".join(rng.choice(DIGITS) for _ in range(rng.randint(2, 5)))
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def synthesise(folder: str, name: str, texts: list[str], styles: list, rng: random.Random) -> str:
    """WAVs and the ``path<TAB>transcript`` list of one split; returns the list's path."""
    lines = []
    for i, text in enumerate(texts):
        voice, speed, pitch = rng.choice(styles)
        wav = f"{name}-{i:04d}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w",
                        os.path.join(folder, wav), text], check=True, stdout=subprocess.DEVNULL)
        lines.append(f"{wav}\t{text}\n")
    list_path = os.path.join(folder, f"{name}.tsv")
    with open(list_path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return list_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/speech", help="output folder [data/speech]")
    parser.add_argument("--num_train", type=int, default=400)
    parser.add_argument("--num_dev", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eos", action="store_true",
                        help="label 0 is the end of sequence '</s>', which ends every label sequence (the "
                             "attention demo's decoder stops at it); the digits are labels 1-10")
    args = parser.parse_args(argv)
    if shutil.which("espeak-ng") is None:
        print("make_speech_corpus: the program 'espeak-ng' is not installed (Debian/Ubuntu: "
              "apt-get install -y espeak-ng); no corpus written.", file=sys.stderr)
        return 1
    started = time.monotonic()
    rng = random.Random(args.seed)
    train_styles, dev_styles = split_styles(rng)
    train_texts = sentences(rng, args.num_train, set())
    dev_texts = sentences(rng, args.num_dev, set(train_texts))
    os.makedirs(args.out, exist_ok=True)
    vocab = os.path.join(args.out, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.writelines(f"{d}\n" for d in ([EOS] if args.eos else []) + DIGITS)
    with tempfile.TemporaryDirectory(prefix=".wav-", dir=args.out) as folder:
        lists = {"train": synthesise(folder, "train", train_texts, train_styles, rng),
                 "dev": synthesise(folder, "dev", dev_texts, dev_styles, rng)}
        synth_s = time.monotonic() - started
        wav_mb = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)) / 2**20
        print(f"Synthesised {args.num_train} + {args.num_dev} utterances ({wav_mb:.1f} MiB of WAV) in "
              f"{synth_s:.1f} s; train styles {len(train_styles)}, dev styles {len(dev_styles)} (unseen).")
        for name, list_path in lists.items():
            out = os.path.join(args.out, f"{name}.hdf")
            try:
                print(audio_to_hdf.convert(audio_to_hdf.build_parser().parse_args(
                    [list_path, out, "--unit", "word", "--vocab", vocab, "--overwrite"]
                    + (["--seq_postfix", EOS] if args.eos else []))))
            except EngineError as exc:
                print(f"make_speech_corpus: {exc}", file=sys.stderr)
                return exc.exit_code
    print(f"Corpus in {args.out}/ made in {time.monotonic() - started:.1f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
