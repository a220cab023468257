#!/usr/bin/env python3
"""Does the OggZipDataset data path keep a 2-rank training busy? Measured with and without the feature
worker (``engine/datasets/prefetch.py``).

    .venv/bin/python benchmarks/bench_oggzip_data.py [--corpus data/speech_oggzip] [--epochs 3]
                                                      [--repeat 2] [--np 2]

Builds the spoken-digit ogg zip corpus with ``demos/make_oggzip_corpus.py`` unless ``--corpus`` holds
one, then trains ``configs/speech_ctc_oggzip.py`` (BLSTM-CTC, MFCCs computed while training) with
``--np`` ranks under mpirun, ``cache_size = 0``, ``--epochs`` epochs, once with the worker (the default)
and once without it (``ENGINE_FEATURE_PREFETCH=0``), ``--repeat`` times interleaved. From the epoch
lines of the log it prints, per variant, the medians of computing time %, the share of the epoch spent
waiting for data and training sequences per second (epoch 1, which pays librosa's compilation and the
reading of the audio headers, apart from the later epochs), and each rank's peak RSS (``/usr/bin/time``).
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import statistics
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv", "bin", "python")
MPIRUN = os.path.join(ROOT, ".venv", "bin", "mpirun")
DONE = re.compile(r"train epoch (\d+), finished after \d+ steps, .* \(([\d.]+)% computing time\)")
RATE = re.compile(r"train epoch (\d+): ([\d.]+) frames/sec \((\d+) frames, .*; ([\d.]+)% in collectives, "
                  r"([\d.]+)% waiting for data")
RSS = re.compile(r"peak_rss_kb=(\d+)")


def ensure_corpus(folder: str) -> int:
    """The corpus's training sequences (the corpus is made first if missing)."""
    train = os.path.join(folder, "train.zip")
    if not (os.path.exists(train) and os.path.exists(os.path.join(folder, "bpe.vocab"))):
        subprocess.run([PY, os.path.join(ROOT, "demos", "make_oggzip_corpus.py"), "--out", folder],
                       check=True, cwd=ROOT)
    with zipfile.ZipFile(train) as z:
        return len(ast.literal_eval(z.read("train.txt").decode("utf8")))


def run_training(corpus: str, epochs: int, ranks: int, prefetch: bool, workdir: str) -> dict:
    """Per train epoch (computing %, waiting %, frames/sec, frames), and the ranks' peak RSS in MB."""
    config = os.path.join(workdir, "config.py")
    with open(os.path.join(ROOT, "configs", "speech_ctc_oggzip.py")) as f:
        text = f.read().replace('_corpus = "data/speech_oggzip"', f"_corpus = {corpus!r}")
    with open(config, "w") as f:
        f.write(text)
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "--map-by", "slot", "-np", str(ranks),
           "-x", "TF_NUM_INTRAOP_THREADS=1", "-x", "TF_NUM_INTEROP_THREADS=1", "-x", "TF_CPP_MIN_LOG_LEVEL=2",
           "-x", f"ENGINE_FEATURE_PREFETCH={int(prefetch)}",
           "/usr/bin/time", "-f", "peak_rss_kb=%M", PY, os.path.join(ROOT, "rnn.py"), config,
           "++use_horovod", "1", "++cache_size", "0", "++num_epochs", str(epochs),
           "++model", os.path.join(workdir, "model")]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"training failed ({out.returncode}):\n{log[-3000:]}")
    epochs_seen: dict[int, dict] = {}
    for m in DONE.finditer(log):
        epochs_seen.setdefault(int(m.group(1)), {})["computing"] = float(m.group(2))
    for m in RATE.finditer(log):
        epochs_seen.setdefault(int(m.group(1)), {}).update(
            fps=float(m.group(2)), frames=int(m.group(3)), waiting=float(m.group(5)))
    return {"epochs": epochs_seen, "rss_mb": [int(v) / 1024 for v in RSS.findall(log)]}


def seqs_per_second(epoch: dict, num_seqs: int) -> float:
    """The epoch's sequences over its wall time (the log gives frames/sec and frames)."""
    return num_seqs * epoch["fps"] / epoch["frames"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=os.path.join(ROOT, "data", "speech_oggzip"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--np", type=int, default=2)
    args = parser.parse_args()
    corpus = os.path.abspath(args.corpus)
    num_seqs = ensure_corpus(corpus)
    runs: dict[str, list[dict]] = {"worker": [], "direct": []}
    for i in range(args.repeat):
        for name in runs:
            with tempfile.TemporaryDirectory() as workdir:
                run = run_training(corpus, args.epochs, args.np, name == "worker", workdir)
            runs[name].append(run)
            for epoch, e in sorted(run["epochs"].items()):
                print(f"run {i + 1} {name:6s} epoch {epoch}: {e['computing']:5.1f}% computing, "
                      f"{e['waiting']:4.1f}% waiting for data, {seqs_per_second(e, num_seqs):6.1f} seqs/s",
                      flush=True)
    print(f"\n{args.np} ranks, cache_size = 0, {num_seqs} training sequences, {args.epochs} epochs, "
          f"{args.repeat} run(s) each; medians:")
    for name, variant_runs in runs.items():
        for label, chosen in (("epoch 1", lambda ep: ep == 1), ("epochs 2+", lambda ep: ep > 1)):
            rows = [e for run in variant_runs for ep, e in run["epochs"].items() if chosen(ep)]
            if not rows:
                continue
            computing = statistics.median(e["computing"] for e in rows)
            print(f"  {name:6s} {label:9s}: {computing:5.1f}% computing, "
                  f"{statistics.median(e['waiting'] for e in rows):4.1f}% waiting for data, "
                  f"{statistics.median(seqs_per_second(e, num_seqs) for e in rows):6.1f} seqs/s")
        rss = [mb for run in variant_runs for mb in run["rss_mb"]]
        if rss:
            print(f"  {name:6s} peak RSS per rank: {statistics.median(rss):.0f} MB median, "
                  f"{max(rss):.0f} MB max")


if __name__ == "__main__":
    main()
