#!/usr/bin/env python3
"""Does the OggZipDataset data path keep a 2-rank training busy? Measured with and without the feature
worker (``engine/datasets/prefetch.py``).

    .venv/bin/python benchmarks/bench_oggzip_data.py [--corpus data/speech_oggzip] [--epochs 3]
                                                      [--repeat 2] [--np 2]
                                                      [--larger-than-memory [--memory-mb 3200]]

Builds the spoken-digit ogg zip corpus with ``demos/make_oggzip_corpus.py`` unless ``--corpus`` holds
one, then trains ``configs/speech_ctc_oggzip.py`` (BLSTM-CTC, MFCCs computed while training) with
``--np`` ranks under mpirun, ``cache_size = 0``, ``--epochs`` epochs, once with the worker (the default)
and once without it (``ENGINE_FEATURE_PREFETCH=0``), ``--repeat`` times interleaved. From the epoch
lines of the log it prints, per variant, the medians of computing time %, the share of the epoch spent
waiting for data and training sequences per second (epoch 1, which pays librosa's compilation and the
reading of the audio headers, apart from the later epochs), and each rank's peak RSS (``/usr/bin/time``).

``--larger-than-memory`` (root): the training corpus is made larger than the memory the job may use. The
demo's training zip is copied into one zip of ``--copies`` times its sequences (each copy under new names;
by default enough copies for 1.25 times ``--memory-mb``), read with ``partition_epoch`` so that each
sub-epoch holds ``--subepoch-seqs`` sequences drawn from the whole zip, and each training runs in a memory
cgroup of ``--memory-mb`` (processes and page cache together; ``memory_cgroup.py``) after the page cache
is dropped. Printed besides: the cgroup's peak use and how often the limit made the kernel reclaim.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile

from memory_cgroup import MemoryLimit, drop_page_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv", "bin", "python")
MPIRUN = os.path.join(ROOT, ".venv", "bin", "mpirun")
DONE = re.compile(r"train epoch (\d+), finished after \d+ steps, .* \(([\d.]+)% computing time\)")
RATE = re.compile(r"train epoch (\d+): ([\d.]+) frames/sec \((\d+) frames, .*; ([\d.]+)% in collectives, "
                  r"([\d.]+)% waiting for data")
RSS = re.compile(r"peak_rss_kb=(\d+)")
WHOLE_RUN = re.compile(r"^\s+all\s+\S+\s+[\d.]+\s+([\d.]+)%\s+[\d.]+%\s+([\d.]+)%", re.M)  # the summary's row


def ensure_corpus(folder: str) -> int:
    """The corpus's training sequences (the corpus is made first if missing)."""
    train = os.path.join(folder, "train.zip")
    if not (os.path.exists(train) and os.path.exists(os.path.join(folder, "bpe.vocab"))):
        subprocess.run([PY, os.path.join(ROOT, "demos", "make_oggzip_corpus.py"), "--out", folder],
                       check=True, cwd=ROOT)
    with zipfile.ZipFile(train) as z:
        return len(ast.literal_eval(z.read("train.txt").decode("utf8")))


def make_big_corpus(corpus: str, out: str, copies: int) -> tuple[int, int]:
    """``out/train.zip``: the demo's training zip ``copies`` times, each copy's files and sequence names
    prefixed ``c<k>-`` (the audio stored as it is). Returns (sequences, bytes); kept when it exists."""
    path = os.path.join(out, "train.zip")
    if not os.path.exists(path):
        with zipfile.ZipFile(os.path.join(corpus, "train.zip")) as z:
            entries = ast.literal_eval(z.read("train.txt").decode("utf8"))
            audio = {e["file"]: z.read(f"train/{e['file']}") for e in entries}
        os.makedirs(out, exist_ok=True)
        if shutil.disk_usage(out).free < 2 * copies * sum(map(len, audio.values())):
            sys.exit(f"not enough free disk under {out} for {copies} copies of the corpus")
        listed = []
        with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_STORED) as big:
            for k in range(copies):
                for e in entries:
                    name = f"c{k}-{e['file']}"
                    big.writestr(f"train/{name}", audio[e["file"]])
                    listed.append({**e, "file": name, "seq_name": f"c{k}-{e['seq_name']}"})
            big.writestr("train.txt", "[\n" + "".join(f"{e!r},\n" for e in listed) + "]\n")
        os.replace(path + ".tmp", path)
    with zipfile.ZipFile(path) as z:  # one entry a line, as written above
        return z.read("train.txt").count(b"\n{"), os.path.getsize(path)


def run_training(corpus: str, epochs: int, ranks: int, prefetch: bool, workdir: str,
                 big: tuple[str, int] | None = None, limit: MemoryLimit | None = None) -> dict:
    """Per train epoch (computing %, waiting %, frames/sec, frames), and the ranks' peak RSS in MB.
    ``big``: (zip, partition_epoch) for the training data; ``limit``: the memory cgroup to run in."""
    config = os.path.join(workdir, "config.py")
    with open(os.path.join(ROOT, "configs", "speech_ctc_oggzip.py")) as f:
        text = f.read().replace('_corpus = "data/speech_oggzip"', f"_corpus = {corpus!r}")
    if big:
        text += f'\ntrain["path"], train["partition_epoch"] = {big[0]!r}, {big[1]}\n'
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
    if limit is not None:
        drop_page_cache()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                         preexec_fn=limit.enter if limit is not None else None)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"training failed ({out.returncode}):\n{log[-3000:]}")
    epochs_seen: dict[int, dict] = {}
    for m in DONE.finditer(log):
        epochs_seen.setdefault(int(m.group(1)), {})["computing"] = float(m.group(2))
    for m in RATE.finditer(log):
        epochs_seen.setdefault(int(m.group(1)), {}).update(
            fps=float(m.group(2)), frames=int(m.group(3)), waiting=float(m.group(5)))
    whole = WHOLE_RUN.search(log)
    return {"epochs": epochs_seen, "rss_mb": [int(v) / 1024 for v in RSS.findall(log)],
            "run": (float(whole.group(1)), float(whole.group(2))) if whole else None,
            "cgroup": limit.usage() if limit is not None else None}


def seqs_per_second(epoch: dict, num_seqs: int) -> float:
    """The epoch's sequences over its wall time (the log gives frames/sec and frames)."""
    return num_seqs * epoch["fps"] / epoch["frames"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=os.path.join(ROOT, "data", "speech_oggzip"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--larger-than-memory", action="store_true",
                        help="train on copies of the corpus larger than a memory cgroup's limit (root)")
    parser.add_argument("--memory-mb", type=int, default=3200, help="the job's memory limit [3200]")
    parser.add_argument("--copies", type=int, help="copies of the corpus [1.25 x --memory-mb of audio]")
    parser.add_argument("--subepoch-seqs", type=int, default=3000, help="sequences per sub-epoch [3000]")
    parser.add_argument("--big-dir", default=os.path.join(ROOT, "data", "speech_oggzip_big"))
    args = parser.parse_args()
    corpus = os.path.abspath(args.corpus)
    num_seqs = ensure_corpus(corpus)
    big = limit = None
    if args.larger_than_memory:
        limit = MemoryLimit(args.memory_mb)
        copies = args.copies or -(-int(1.25 * args.memory_mb * 2**20)
                                  // os.path.getsize(os.path.join(corpus, "train.zip")))
        total, size = make_big_corpus(corpus, os.path.abspath(args.big_dir), copies)
        if size <= limit.limit:
            sys.exit(f"the corpus ({size / 2**20:.0f} MB) is not larger than --memory-mb {args.memory_mb}")
        big = (os.path.join(os.path.abspath(args.big_dir), "train.zip"), max(1, total // args.subepoch_seqs))
        num_seqs = -(-total // big[1])
        print(f"corpus {size / 2**20:.0f} MB ({total} sequences, partition_epoch {big[1]}: about {num_seqs} "
              f"per sub-epoch), memory limit {args.memory_mb} MB for the job, page cache dropped per run",
              flush=True)
    runs: dict[str, list[dict]] = {"worker": [], "direct": []}
    for i in range(args.repeat):
        for name in runs:
            with tempfile.TemporaryDirectory() as workdir, limit or contextlib.nullcontext():
                run = run_training(corpus, args.epochs, args.np, name == "worker", workdir, big, limit)
            runs[name].append(run)
            for epoch, e in sorted(run["epochs"].items()):
                print(f"run {i + 1} {name:6s} epoch {epoch}: {e['computing']:5.1f}% computing, "
                      f"{e['waiting']:4.1f}% waiting for data, {seqs_per_second(e, num_seqs):6.1f} seqs/s",
                      flush=True)
            if run["cgroup"]:
                print(f"run {i + 1} {name:6s} cgroup: peak {run['cgroup']['peak'] / 2**20:.0f} MB of "
                      f"{args.memory_mb} MB, limit reached {run['cgroup']['limit_hits']} times", flush=True)
    print(f"\n{args.np} ranks, cache_size = 0, {num_seqs} training sequences per epoch, {args.epochs} "
          f"epochs, {args.repeat} run(s) each; medians:")
    for name, variant_runs in runs.items():
        for label, chosen in (("epoch 1", lambda ep: ep == 1), ("epochs 2+", lambda ep: ep > 1)):
            rows = [e for run in variant_runs for ep, e in run["epochs"].items() if chosen(ep)]
            if not rows:
                continue
            computing = statistics.median(e["computing"] for e in rows)
            print(f"  {name:6s} {label:9s}: {computing:5.1f}% computing, "
                  f"{statistics.median(e['waiting'] for e in rows):4.1f}% waiting for data, "
                  f"{statistics.median(seqs_per_second(e, num_seqs) for e in rows):6.1f} seqs/s")
        whole = [run["run"] for run in variant_runs if run["run"]]
        if whole:
            print(f"  {name:6s} whole run: {statistics.median(c for c, _ in whole):5.1f}% computing, "
                  f"{statistics.median(w for _, w in whole):4.1f}% waiting for data (run summary's 'all')")
        rss = [mb for run in variant_runs for mb in run["rss_mb"]]
        if rss:
            print(f"  {name:6s} peak RSS per rank: {statistics.median(rss):.0f} MB median, "
                  f"{max(rss):.0f} MB max")


if __name__ == "__main__":
    main()
