#!/usr/bin/env python3
"""Sequence training (BLSTM-CTC with max-pool time reduction) side by side with RETURNN, on the spoken-digit
corpus that ``demos/make_speech_corpus.py`` synthesises with espeak-ng: speed and dev label error.

    .venv/bin/python benchmarks/bench_ctc.py [--epochs 5] [--runs 3] [--quality-epochs 8] [--corpus DIR]

Both programs train one config (``NETWORK`` below: 3 BLSTM layers of 64 units, max-pool 2 after the first
two, a ctc softmax; batch_size 2500, max_seqs 40, laplace order, Adam). It leaves out what RETURNN
1.20261022 on TensorFlow 2.15 cannot run (seen here): ``nadam`` (Keras 2.15's Nadam has no ``_name``),
``darc1`` (its mask does not broadcast against the output) and an ``edit_distance`` layer with
``ctc_decode`` (int32 targets against int64 hypotheses); ``configs/speech_ctc.py`` has all three for
this engine. RETURNN runs where ``$RETURNN_PYTHON`` or ``/tmp/returnn-venv/bin/python`` has it
(``bench_returnn.py``); without it, its rows are skipped with one line.

Speed rows: input frames/s over epochs 2..E (from the epoch lines), medians of ``--runs`` runs taking
turns, with ranges: the engine with 1 process (default threading and 1 thread), RETURNN with 1 process
(NativeLstm2, 1 and 2 threads), 2 single engine processes of 1 thread at once without MPI (the ceiling of
2 ranks on this machine, as in ``bench_train.py``), the engine with 2 ranks (grad mode, 1 thread each).
Verdicts: the engine's best single process >= 1.5x RETURNN's best row; 2 ranks >= 1.8x the best
single-process row of either program. Quality: one run of each program with ``--quality-epochs`` epochs
and the dev set; the dev label error by epoch (edit distance / reference labels, beam search in eval, as
both programs score it).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from typing import Sequence

import h5py

import threading

from timing import (Output, Row, RowFailed, Side, child_env, compare, interleaved, rnn_command,
                    run_stamped)
from bench_returnn import best, rate, returnn_python
from bench_train import ceiling_rate, epochs_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SINGLE_TARGET, PARALLEL_TARGET = 1.5, 1.8


def _network() -> dict:
    network = {}
    for i, source in enumerate(["data", "pool0", "pool1"]):
        for name, direction in (("fw", 1), ("bw", -1)):
            network[f"lstm{i}_{name}"] = {"class": "rec", "unit": "nativelstm2", "n_out": 64,
                                          "direction": direction, "from": source}
        if i < 2:
            network[f"pool{i}"] = {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,),
                                   "from": [f"lstm{i}_fw", f"lstm{i}_bw"]}
    network["output"] = {"class": "softmax", "loss": "ctc", "from": ["lstm2_fw", "lstm2_bw"]}
    return network


COMMON = """
network = {network!r}
train = {{"class": "HDFDataset", "files": [{train!r}], "seq_ordering": "laplace:.100"}}
{dev}
batch_size = 2500
max_seqs = 40
adam = True
learning_rate = 0.005
num_epochs = {epochs}
model = {model!r}
log_verbosity = 3
"""
ENGINE = 'cache_size = "0"\n'
RETURNN = """#!rnn.py
use_tensorflow = True
task = "train"
device = "cpu"
extern_data = {{"data": {{"dim": {dim}}}, "classes": {{"dim": {labels}, "sparse": True}}}}
tf_session_opts = {{"intra_op_parallelism_threads": {threads}, "inter_op_parallelism_threads": {threads}}}
"""
DEV_ERROR = re.compile(r"^dev: score \S+ error (\S+)", re.M)


def corpus_files(folder: str, options: Sequence[str] = ()) -> tuple[str, str]:
    """The corpus in ``folder``, made when missing (``options``: more arguments of make_speech_corpus.py)."""
    train, dev = os.path.join(folder, "train.hdf"), os.path.join(folder, "dev.hdf")
    if not (os.path.exists(train) and os.path.exists(dev)):
        script = os.path.join(ROOT, "demos", "make_speech_corpus.py")
        subprocess.run([sys.executable, script, "--out", folder, *options], check=True)
    return train, dev


def write_config(folder: str, name: str, train: str, dev: str | None, epochs: int,
                 returnn_threads: int | None = None) -> str:
    with h5py.File(train, "r") as f:
        dim, labels = int(f.attrs["inputPattSize"]), int(f["targets/size"].attrs["classes"][0])
    head = ENGINE if returnn_threads is None else \
        RETURNN.format(dim=dim, labels=labels, threads=returnn_threads)
    dev_line = f"dev = {{'class': 'HDFDataset', 'files': [{dev!r}]}}" if dev else ""
    path = os.path.join(folder, f"{name}.config")
    os.makedirs(os.path.join(folder, name), exist_ok=True)
    with open(path, "w") as f:
        f.write(head + COMMON.format(network=_network(), train=train, dev=dev_line, epochs=epochs,
                                     model=os.path.join(folder, name, "model")))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quality-epochs", type=int, default=8)
    parser.add_argument("--corpus", default=os.path.join(ROOT, "data", "speech"))
    args = parser.parse_args()
    train, dev = corpus_files(args.corpus)
    with h5py.File(train, "r") as f:
        frames = int(f["seqLengths"][:, 0].sum())
    python = returnn_python()
    if python is None:
        print("bench_ctc: no RETURNN found (RETURNN_PYTHON unset, no /tmp/returnn-venv): its rows are "
              "skipped.")
    with tempfile.TemporaryDirectory() as tmp:
        def engine(name: str, ranks: int, threads: int | None):
            env = child_env(threads)
            overrides = ["++use_horovod", "1"] if ranks > 1 else []

            def measure():  # a model folder per run: a run must not meet an earlier run's checkpoints
                config = write_config(tmp, f"engine-{len(os.listdir(tmp))}", train, None, args.epochs)
                return epochs_rate(run_stamped(rnn_command(config, ranks, overrides, env), env), args.epochs)
            return Row(name, measure)

        def ceiling():  # 2 single processes of 1 thread at once, no MPI: what 2 ranks could reach here
            env = child_env(1)

            def measure():
                results: list[Output | BaseException | None] = [None, None]
                configs = [write_config(tmp, f"engine-{len(os.listdir(tmp))}-{i}", train, None, args.epochs)
                           for i in range(2)]

                def one(index: int) -> None:
                    try:
                        command = rnn_command(configs[index], 1, [], env)
                        results[index] = run_stamped(command, env, check=False)
                    except BaseException as exc:  # reported by ceiling_rate, in the main thread
                        results[index] = exc
                threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                return ceiling_rate(results, args.epochs)
            return Row("2 single processes of 1 thread at once (ceiling)", measure)

        def returnn(threads: int):
            env = dict(child_env(threads), DISABLE_CUDA="1")

            def measure():
                config = write_config(tmp, f"returnn-{len(os.listdir(tmp))}", train, None, args.epochs,
                                      returnn_threads=threads)
                output = run_stamped([python, "-m", "returnn", config], env, timeout=3600, check=False)
                if output.returncode != 0:  # RETURNN's own failure: its row has no figure, the rest goes on
                    raise RowFailed(f"RETURNN exited with {output.returncode}: {_first_error(output.text)}")
                return rate(output, frames, args.epochs)
            return Row(f"RETURNN NativeLstm2, 1 process, {threads} thread(s)", measure)

        single = [engine("engine, 1 process, default threading", 1, None),
                  engine("engine, 1 process, 1 thread", 1, 1)]
        theirs = [returnn(1), returnn(2)] if python else []
        parallel = engine("engine, 2 ranks grad, 1 thread each", 2, 1)
        limit = ceiling()
        print(f"corpus: {train} ({frames} frames); epochs 2..{args.epochs} timed, {args.runs} runs per row, "
              "taking turns")
        interleaved(single + theirs + [limit, parallel], args.runs)
        quality = {"engine": _dev_errors(write_config(tmp, "quality-engine", train, dev, args.quality_epochs),
                                         None, child_env(1))}
        if python:
            quality["RETURNN"] = _dev_errors(
                write_config(tmp, "quality-returnn", train, dev, args.quality_epochs, returnn_threads=1),
                python, dict(child_env(1), DISABLE_CUDA="1"))
    ours, best_single = best(single), best(single + theirs)
    print(f"\n{'run':<46} {'frames/s':>9} {'range':>13}")
    for row in single + theirs + [limit, parallel]:
        print(f"{row.name:<46} {row.median:>9.0f} {row.spread():>13}")
    if theirs:
        ratio = ours.median / best(theirs).median
        print(compare(Side.of(ours), Side.of(best(theirs)), f"engine 1 process = {ratio:.2f}x RETURNN's best "
                      f"measured row, frames/s (target >= {SINGLE_TARGET}x)", better="higher",
                      factor=SINGLE_TARGET, fmt="{:.0f}",
                      failed=single + ([] if any(not row.failed for row in theirs) else theirs)))
        for row in theirs:
            if row.failed:
                print(f"info: {row.name} failed: {row.failure}")
    ratio = parallel.median / best_single.median
    print(f"info: the ceiling row = {limit.median / best_single.median:.2f}x the best single process; "
          f"2 ranks = {parallel.median / limit.median:.2f}x the ceiling")
    print(compare(Side.of(parallel), Side.of(best_single), f"engine 2 ranks = {ratio:.2f}x the best single "
                  f"process, frames/s (target >= {PARALLEL_TARGET}x)", better="higher",
                  factor=PARALLEL_TARGET, fmt="{:.0f}", failed=[parallel, *single, *theirs]))
    print(f"\ndev label error by epoch ({args.quality_epochs} epochs, 1 process, 1 thread, one run each):")
    for program, errors in quality.items():
        print(f"{program:<8} " + " ".join(f"{e:.3f}" for e in errors))
    return 0


def _dev_errors(config: str, returnn: str | None, env: dict) -> list[float]:
    cmd = [returnn, "-m", "returnn", config] if returnn else rnn_command(config, 1, [], env)
    output = run_stamped(cmd, env, timeout=3600, check=returnn is None)
    if output.returncode != 0:
        print(f"info: RETURNN's quality run failed: {_first_error(output.text)}")
    return [float(e) for e in DEV_ERROR.findall(output.text)]


def _first_error(text: str) -> str:
    """The line that says what went wrong (RETURNN prints long tracebacks)."""
    lines = [line for line in text.splitlines() if re.search(r"Error|must be|failed", line)
             and not line.startswith(" ")]
    return lines[-1][:300] if lines else text.splitlines()[-1][:300] if text else "no output"


if __name__ == "__main__":
    sys.exit(main())
