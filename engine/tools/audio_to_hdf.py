"""Audio files and their transcripts -> an HDF corpus: log-mel features as ``data``, labels as ``classes``.

    audio-to-hdf LIST.tsv OUT.hdf [--vocab FILE] [--unit char|word] [--num_mel_bins 40]
                 [--sample_rate 16000] [--window_ms 25] [--shift_ms 10] [--overwrite] [--seq_postfix LABEL]

(or ``python tools/audio_to_hdf.py ...``). LIST.tsv has one utterance a line, ``path<TAB>transcript``
(a path relative to the list's folder; blank lines and lines starting with ``#`` are skipped). Audio:
WAV, FLAC or OGG (see ``engine/datasets/audio.py``), resampled to ``--sample_rate``. Labels: the
transcript's characters (``--unit char``, the default; a space is the label " ") or its
whitespace-separated words (``--unit word``). Without ``--vocab`` the label list is every unit seen,
sorted; with it, the file's lines in order (one label a line) and any other unit is an error. The
label list goes into the HDF (``targets/labels/classes``) and beside it as ``OUT.hdf.labels`` (one a
line), which a second corpus (dev) takes as its ``--vocab``. ``--seq_postfix`` appends a label of the
vocabulary to every sequence (RETURNN's ``seq_postfix``: the end-of-sequence label). Sequence tags are
the audio paths as written in the list. The HDF is written under a temporary name and renamed at the
end: after any error no file is left under OUT.hdf.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from engine.datasets import DataKeyInfo, HDFWriter
from engine.datasets.audio import read_audio
from engine.datasets.log_mel import LogMelOptions, log_mel, mel_filterbank
from engine.report.progress import Progress
from engine.runtime.atomic_file import write_text_atomically
from engine.runtime.errors import ConfigError, DataError, EngineError


@dataclass(frozen=True)
class Utterance:
    path: str  # as the list gives it (the sequence tag)
    file: str  # the path to open
    transcript: str
    where: str  # "LIST:LINE", for messages


def read_list(list_path: str) -> list[Utterance]:
    """The utterances of a ``path<TAB>transcript`` list; a DataError names the file and line of a bad one."""
    try:
        with open(list_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"Corpus list '{list_path}' cannot be read: {exc}.") from None
    folder = os.path.dirname(os.path.abspath(list_path))
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{list_path}:{number}"
        path, tab, text = line.partition("\t")
        transcript = " ".join(text.split())
        if not tab or not path.strip():
            raise DataError(f"Corpus list line {where} is not 'path<TAB>transcript': {line[:80]!r}.")
        if not transcript:
            raise DataError(f"Corpus list line {where}: the transcript of '{path}' is empty; every "
                            "utterance needs at least one label.")
        out.append(Utterance(path, os.path.join(folder, path), transcript, where))
    if not out:
        raise DataError(f"Corpus list '{list_path}' holds no utterances (expected 'path<TAB>transcript' "
                        "lines).")
    return out


def units_of(transcript: str, unit: str) -> list[str]:
    return list(transcript) if unit == "char" else transcript.split(" ")


def read_vocab(path: str) -> list[str]:
    """One label a line, in order; a line holding one space is the space label (char units)."""
    try:
        with open(path, encoding="utf-8") as f:
            labels = [line.rstrip("\n") for line in f]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"Vocabulary file '{path}' cannot be read: {exc}.") from None
    labels = [label for label in labels if label != ""]
    if not labels or len(set(labels)) != len(labels):
        raise DataError(f"Vocabulary file '{path}' must hold one distinct label a line, got "
                        f"{len(labels)} labels ({len(set(labels))} distinct).")
    return labels


def label_list(utterances: list[Utterance], unit: str, vocab: str | None) -> list[str]:
    if vocab is not None:
        return read_vocab(vocab)
    return sorted({u for utt in utterances for u in units_of(utt.transcript, unit)})


def convert(args: argparse.Namespace) -> str:
    """Writes the corpus; returns the summary line."""
    if os.path.exists(args.out) and not args.overwrite:
        raise DataError(f"Output file '{args.out}' exists already; pass --overwrite to replace it.")
    options = LogMelOptions(sample_rate=args.sample_rate, window_ms=args.window_ms, shift_ms=args.shift_ms,
                            num_mel_bins=args.num_mel_bins)
    try:
        options.check()
    except ValueError as exc:
        raise DataError(f"Feature options: {exc}.") from None
    utterances = read_list(args.corpus_list)
    labels = label_list(utterances, args.unit, args.vocab)
    started = time.monotonic()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    try:
        writer = _write(args, utterances, options, labels)
    except BaseException:
        if not os.path.exists(args.out) and os.path.exists(args.out + ".labels"):
            os.remove(args.out + ".labels")  # written just before the HDF's rename, which failed
        raise
    frames = ", ".join(f"{key} {n}" for key, n in writer.num_frames.items())
    size_mb = os.path.getsize(args.out) / 2**20
    return (f"Wrote {writer.num_seqs} utterances to {args.out}: frames {frames}; {len(labels)} labels "
            f"({args.out}.labels); {size_mb:.1f} MiB; {time.monotonic() - started:.1f} s.")


def _write(args: argparse.Namespace, utterances: list[Utterance], options: LogMelOptions,
           labels: list[str]) -> HDFWriter:
    index = {label: i for i, label in enumerate(labels)}
    if args.seq_postfix is not None and args.seq_postfix not in index:
        raise ConfigError(f"audio_to_hdf: --seq_postfix {args.seq_postfix!r} is not a label of the "
                          f"vocabulary ({len(labels)} labels).")
    filterbank = mel_filterbank(options)
    keys = {"data": DataKeyInfo(dim=options.num_mel_bins),
            "classes": DataKeyInfo(dim=len(labels), sparse=True)}
    with HDFWriter(args.out, keys, labels={"classes": labels}, overwrite=args.overwrite) as writer, \
            Progress("audio_to_hdf", len(utterances), stream=sys.stderr, unit="file") as progress:
        for done, utt in enumerate(utterances, 1):
            units = units_of(utt.transcript, args.unit)
            unknown = sorted({u for u in units if u not in index})
            if unknown:
                raise DataError(f"Corpus list line {utt.where}: the transcript of '{utt.path}' has "
                                f"{args.unit} unit(s) {unknown} that the vocabulary '{args.vocab}' does not "
                                "list.")
            samples, _ = read_audio(utt.file, options.sample_rate)
            features = log_mel(samples, options, filterbank)
            if len(features) == 0:
                raise DataError(f"Audio file '{utt.file}' ({utt.where}) is too short: {len(samples)} "
                                f"samples at {options.sample_rate} Hz give no {options.window_ms} ms frame.")
            ids = [index[u] for u in units] + ([index[args.seq_postfix]] if args.seq_postfix else [])
            writer.insert(utt.path, {"data": features, "classes": np.array(ids, np.int32)})
            progress.update(done)
        # the label list beside the corpus appears only with it (written before the HDF's rename)
        write_text_atomically(args.out + ".labels", "".join(f"{label}\n" for label in labels))
    return writer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus_list", metavar="LIST.tsv", help="one 'path<TAB>transcript' a line")
    parser.add_argument("out", metavar="OUT.hdf")
    parser.add_argument("--vocab", default=None, help="label list, one a line (default: the units seen)")
    parser.add_argument("--unit", choices=["char", "word"], default="char", help="what a label is [char]")
    parser.add_argument("--num_mel_bins", type=int, default=40, help="feature dim [40]")
    parser.add_argument("--sample_rate", type=int, default=16000, help="resample to this rate [16000]")
    parser.add_argument("--window_ms", type=float, default=25.0, help="frame length [25]")
    parser.add_argument("--shift_ms", type=float, default=10.0, help="frame shift [10]")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    parser.add_argument("--seq_postfix", default=None, metavar="LABEL",
                        help="a label appended to every sequence (RETURNN's seq_postfix: the end-of-sequence "
                             "label an attention decoder stops at)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        print(convert(args))
    except EngineError as exc:
        print(f"audio_to_hdf: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\naudio_to_hdf: interrupted; no output file written.", file=sys.stderr)
        return 130
    return 0
