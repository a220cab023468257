#!/usr/bin/env python3
"""A hybrid BLSTM acoustic-model recipe, this engine beside RETURNN: dev scores per epoch, each program
with several seeds, and whether each epoch's scores lie within the other side's seed-to-seed spread.

    .venv/bin/python benchmarks/bench_returnn_hybrid.py [--epochs 3] [--seeds 1,2,3] [--units 64]

The recipe is the one of ``tests/recipes/quaero.dropout01.l2_1e_2.6l.n500.max_seqs40.adam.lr1e_3.config``
(RWTH's 2016 LSTM paper, Quaero English): 6 BLSTM layers, dropout 0.1 and ``L2`` 0.01 on each, frame-wise
CE, ``chunking`` 50:25, ``batch_size`` 5000, ``max_seqs`` 40, random order, ``gradient_clip`` 10, Adam at
0.001, newbob. Changed: the layers have ``--units`` units (the recipe's 500 would take hours on 2 cores),
the optimizer is the dict ``{"class": "adam"}`` (RETURNN refuses the recipe's ``adam = True`` without an
old ``behavior_version``; the two mean the same optimizer), and the Sprint corpus is replaced by a
synthetic one: 50-dim features, 12 classes, each frame's class given by its neighbourhood (frames
-2..+2), so that both directions help. A seed changes the initial values and the dropout masks in both
programs, not the data order. RETURNN runs where ``$RETURNN_PYTHON`` or ``/tmp/returnn-venv/bin/python``
has it. One PASS or MISS line per epoch; any MISS makes the exit status 1."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench_returnn_ctc_demo import RETURNN_HEAD, curve
from engine.datasets import DataKeyInfo, HDFWriter
from returnn_side import no_returnn, returnn_python
from returnn_verdicts import seed_spread_verdict
from timing import ROOT, child_env

INPUT_DIM, CLASSES, CONTEXT = 50, 12, 2

RECIPE = """
train = {{"class": "HDFDataset", "files": [{train!r}]}}
dev = {{"class": "HDFDataset", "files": [{dev!r}]}}
cache_size = "0"
batching = "random"
batch_size = 5000
max_seqs = 40
max_seq_length = 7000
chunking = "50:25"
window = 1
network = {network!r}
truncation = -1
num_epochs = {epochs}
gradient_clip = 10
optimizer = {{"class": "adam"}}
learning_rate = 0.001
learning_rate_control = "newbob"
learning_rate_file = {lr_file!r}
model = {model!r}
random_seed = {seed}
log_verbosity = 3
"""


def recipe_network(units: int) -> dict:
    """The recipe's 6 BLSTM layers (``lstmp``, dropout 0.1, L2 0.01) and its softmax."""
    network = {}
    for i in range(6):
        for name, direction in (("fw", 1), ("bw", -1)):
            layer = {"class": "rec", "unit": "lstmp", "n_out": units, "dropout": 0.1, "L2": 0.01,
                     "direction": direction}
            if i:
                layer["from"] = [f"lstm{i - 1}_fw", f"lstm{i - 1}_bw"]
            network[f"lstm{i}_{name}"] = layer
    network["output"] = {"class": "softmax", "loss": "ce", "from": ["lstm5_fw", "lstm5_bw"]}
    return network


def make_corpus(path: str, num_seqs: int, seed: int) -> None:
    rng = np.random.RandomState(seed)
    mapping = np.random.RandomState(0).standard_normal((INPUT_DIM * (2 * CONTEXT + 1), CLASSES))
    keys = {"data": DataKeyInfo(dim=INPUT_DIM), "classes": DataKeyInfo(dim=CLASSES, sparse=True)}
    with HDFWriter(path, keys) as writer:
        for i in range(num_seqs):
            features = rng.standard_normal((rng.randint(80, 301), INPUT_DIM)).astype(np.float32)
            padded = np.pad(features, ((CONTEXT, CONTEXT), (0, 0)))
            window = np.concatenate([padded[k:k + len(features)] for k in range(2 * CONTEXT + 1)], axis=1)
            writer.insert(f"seq-{i}", {"data": features, "classes": (window @ mapping).argmax(1)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--train", type=int, default=400, help="train sequences (dev: a quarter)")
    parser.add_argument("--folder", help="keep the corpus and runs here (default: a temporary folder)")
    args = parser.parse_args()
    returnn = returnn_python()
    if returnn is None:
        return no_returnn("bench_returnn_hybrid.py", "there is nothing to compare with")
    folder = args.folder or tempfile.mkdtemp(prefix="bench-hybrid-")
    os.makedirs(folder, exist_ok=True)
    train, dev = os.path.join(folder, "train.hdf"), os.path.join(folder, "dev.hdf")
    if not os.path.exists(train):
        make_corpus(train, args.train, 1)
        make_corpus(dev, args.train // 4, 2)
    programs = {"engine": [sys.executable, os.path.join(ROOT, "rnn.py")],
                "returnn": [returnn, "-m", "returnn"]}
    scores: dict[str, list[list[float]]] = {name: [] for name in programs}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for program, command in programs.items():
            name = f"{program}-seed{seed}"
            run = os.path.join(folder, name)
            os.makedirs(run, exist_ok=True)
            config = os.path.join(folder, f"{name}.config")
            with open(config, "w") as f:
                f.write((RETURNN_HEAD if program == "returnn" else "") + RECIPE.format(
                    train=train, dev=dev, network=recipe_network(args.units), epochs=args.epochs, seed=seed,
                    lr_file=os.path.join(run, "newbob.data"), model=os.path.join(run, "model")))
            env = child_env(extra={"DISABLE_CUDA": "1"} if program == "returnn" else None)
            with open(os.path.join(folder, f"{name}.log"), "w") as log:
                done = subprocess.run(command + [config], env=env, stdout=log, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                print(f"{name}: FAILED (exit {done.returncode}); see {log.name}", flush=True)
                return 1
            rows = curve(os.path.join(run, "newbob.data"), args.epochs)
            scores[program].append([score for score, _ in rows])
            print(f"{name}: dev score per epoch " + " / ".join(f"{s:.4f}" for s, _ in rows)
                  + f"; dev frame error, last epoch {100 * rows[-1][1]:.1f} %", flush=True)
    print(f"folder: {folder}\n")
    return verdicts(scores, args.epochs)


def verdicts(scores: dict[str, list[list[float]]], epochs: int) -> int:
    """One PASS or MISS line per epoch (``seed_spread_verdict``); the exit status: 1 when any missed."""
    missed = 0
    for epoch in range(epochs):
        inside, line = seed_spread_verdict(epoch + 1, [run[epoch] for run in scores["engine"]],
                                           [run[epoch] for run in scores["returnn"]])
        print(line)
        missed += not inside
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
