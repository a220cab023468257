#!/usr/bin/env python3
"""The ``forward`` task on 1 rank against N ranks, side by side: the BLSTM benchmark model (4 layers of
512 units per direction, 40-dim input, 4501 classes, as ``bench_allreduce.py``'s large model).

    .venv/bin/python benchmarks/bench_forward.py [--seqs 48] [--runs 3] [--ranks N] [--layers 4]
        [--units 512] [--classes 4501]

A checkpoint of the model is trained first (one step on two sequences), then ``rnn.py`` forwards an HDF
corpus (``--seqs`` sequences of 200-600 frames) into ``output_file``: every rank its shard, and the
result is one HDF file in corpus order. A run's time is from rank 0's ``forward: N sequences`` line (the
model loaded and traced on every rank, the output file laid out) to its ``forward: wrote`` line: the
forward passes and the output written, not the start-up (left out of the training benchmarks alike).
Also shown per run: what came after the forward pass (rank 0's report line), and how many cores
the run kept busy on average (CPU time of its processes over its wall time).
Rows: 1 rank with the engine's default threading, 1 rank with one thread, N ranks (default threading).
Median of ``--runs`` runs taking turns, with the range. Target (issue 13): N = 2 ranks >= 1.9x the best
single process. Also printed: the per-core scaling, N ranks against 1 rank with one thread.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile

import numpy as np

from timing import Output, Row, Side, child_env, compare, interleaved, rnn_command, run_stamped

from engine.datasets import DataKeyInfo, HDFWriter

CONFIG = """
network = {network!r}
eval = {{"class": "HDFDataset", "files": [{corpus!r}]}}
train = {{"class": "HDFDataset", "files": [{train!r}]}}
cache_size = "0"
batch_size = 5000
max_seqs = 40
optimizer = {{"class": "adam"}}
learning_rate = 0.001
num_epochs = 1
model = {model!r}
output_file = {output!r}
log_verbosity = 3
"""
TARGET = 1.9


def blstm(layers: int, units: int) -> dict:
    network, sources = {}, ["data"]
    for i in range(layers):
        network[f"fw{i}"] = {"class": "rec", "unit": "nativelstm2", "n_out": units, "from": sources}
        network[f"bw{i}"] = {"class": "rec", "unit": "nativelstm2", "n_out": units, "direction": -1,
                             "from": sources}
        sources = [f"fw{i}", f"bw{i}"]
    network["output"] = {"class": "softmax", "loss": "ce", "from": sources}
    return network


def make_corpus(path: str, num_seqs: int, classes: int, seed: int, lengths: tuple[int, int]) -> int:
    rng = np.random.RandomState(seed)
    keys = {"data": DataKeyInfo(dim=40), "classes": DataKeyInfo(dim=classes, sparse=True)}
    frames = 0
    with HDFWriter(path, keys) as writer:
        for i in range(num_seqs):
            n = rng.randint(*lengths)
            writer.insert(f"seq-{i}", {"data": rng.standard_normal((n, 40)).astype(np.float32),
                                       "classes": rng.randint(0, classes, n)})
            frames += n
    return frames


class Forwarder:
    def __init__(self, config: str) -> None:
        self.config = config
        self.after: dict[str, list[float]] = {}  # row -> seconds from the end of the forward pass to the end
        self.busy: dict[str, list[float]] = {}  # row -> CPU seconds of all its processes / wall seconds

    def row(self, name: str, ranks: int, threads: int | None = None) -> Row:
        """``threads``: both TensorFlow pools of every rank (None: the engine's automatic choice)."""
        def measure() -> float:
            env = child_env(threads)
            overrides = ["++task", "forward"] + (["++use_horovod", "1"] if ranks > 1 else [])
            before = _children_cpu_seconds()
            output = run_stamped(rnn_command(self.config, ranks, overrides, env), env)
            cpu = _children_cpu_seconds() - before
            total = output.seconds_between(r"^forward: \d+ sequences", r"^forward: wrote")
            self.after.setdefault(name, []).append(_after_forward_pass(output))
            self.busy.setdefault(name, []).append(cpu / output.stamps[-1][0])
            return total

        return Row(name, measure)


def _children_cpu_seconds() -> float:
    """User and system CPU of the finished child processes (mpirun waits for its ranks: theirs too)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _after_forward_pass(output: Output) -> float:
    """Seconds from rank 0's forward report line to the end (the output file put together)."""
    return output.seconds_between(r"^forward '.*': [\d.]+ frames/sec", r"^forward: wrote")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--classes", type=int, default=4501)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus, train = os.path.join(tmp, "eval.hdf"), os.path.join(tmp, "train.hdf")
        frames = make_corpus(corpus, args.seqs, args.classes, 1, (200, 601))
        make_corpus(train, 2, args.classes, 2, (20, 21))
        config = os.path.join(tmp, "forward.py")
        with open(config, "w") as f:
            f.write(CONFIG.format(network=blstm(args.layers, args.units), corpus=corpus, train=train,
                                  model=os.path.join(tmp, "model"), output=os.path.join(tmp, "out.hdf")))
        env = child_env()
        run_stamped(rnn_command(config, 1, [], env), env)  # the checkpoint model.001
        print(f"forward: {args.seqs} seqs, {frames} frames, BLSTM {args.layers}x{args.units}, {args.classes} "
              f"classes ({frames * args.classes * 4 / 1e6:.0f} MB of output); {args.runs} runs per row")
        forwarder = Forwarder(config)
        single = [forwarder.row("1 rank", 1), forwarder.row("1 rank, 1 thread", 1, threads=1)]
        ranks = forwarder.row(f"{args.ranks} ranks", args.ranks)
        interleaved(single + [ranks], args.runs)
    best = min(single, key=lambda row: row.median)
    print(f"\n{'run':<17} {'seconds':>8} {'range':>12} {'frames/s':>9} {'speed-up':>9} "
          f"{'after the forward pass':>23} {'cores busy':>11}")
    for row in single + [ranks]:
        after = statistics.median(forwarder.after[row.name])
        busy = statistics.median(forwarder.busy[row.name])
        print(f"{row.name:<17} {row.median:>8.2f} {row.spread('{:.2f}'):>12} {frames / row.median:>9.0f} "
              f"{best.median / row.median:>8.2f}x {after:>22.2f}s {busy:>11.2f}")
    print(f"(speed-up: over the best single process, '{best.name}'; cores busy: CPU seconds of all the "
          f"run's processes over its wall time, start-up included; {len(os.sched_getaffinity(0))} cores "
          "here)")
    per_core = single[1].median / ranks.median
    print(f"per-core scaling: {args.ranks} ranks of one core each are {per_core:.2f}x 1 rank on one core "
          f"(what each rank's own core or device adds; ESPnet's 1.76x is this figure for 2 GPUs)")
    speedup = best.median / ranks.median
    print(compare(Side.of(ranks), Side.of(best), f"forward on {args.ranks} ranks is {speedup:.2f}x the best "
                  f"single process (target >= {TARGET}x: its seconds <= the single process's / {TARGET})",
                  better="lower", factor=1 / TARGET, fmt="{:.2f}", failed=single))
    return 0


if __name__ == "__main__":
    sys.exit(main())
