#!/usr/bin/env python3
"""Beam search (``task = "search"``) on 1 rank against 2 ranks, side by side: ``configs/speech_attention.py``
(the attention encoder-decoder, beam 12) on the spoken-digit corpus with end-of-sequence labels.

    .venv/bin/python benchmarks/bench_search_ranks.py [--runs 3] [--epochs 5] [--dev-seqs 1500] [--data DIR]

The corpus is made by ``demos/make_speech_corpus.py --eos --num_dev N`` (in a temporary folder, or in
``--data DIR`` when it has none yet; an existing one there is reused as it is). The model trains
``--epochs`` epochs first with 2 ranks (as ``make demo-attention``), so its hypotheses end where a
trained model's end. Then every run searches the whole dev set into a file of its own.

A run's figure is the engine's own: each rank's search loop reports its frames and frames/sec
(``log_all_ranks`` prints every rank's lines), so its seconds are frames / frames/sec; the run's
speed is the dev set's frames over the slowest rank's seconds (the ranks start together, after the
model is loaded and traced on each). Start-up and writing the file are left out of it alike for every row;
the whole run's wall time is shown beside it, and how many cores the run kept busy on average (CPU time
of its processes over its wall time), and the machine's load average before and after: other jobs
share the cores. Rows: 1 rank with the engine's default threading, 1 rank with one thread (the faster
of the two is the best single process), 2 ranks by mpirun with one thread each (the Makefile's
RANK_ENV), and per rank of the 2-rank row its batches, frames and seconds. Median of ``--runs`` runs
taking turns, with the range. The ceiling of 2 ranks on this machine: twice the one-thread process's
speed. Verdicts: 2 ranks faster than the best single process; 2 ranks >= 90% of the ceiling; every
2-rank output file byte-identical to the one-thread single process's file.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import re
import statistics
import sys
import tempfile

import h5py

from bench_ctc import corpus_files
from bench_forward import _children_cpu_seconds
from bench_returnn import best
from timing import ROOT, Output, Row, RowFailed, Side, child_env, compare, interleaved, rnn_command, \
    run_stamped, verdict

CONFIG = os.path.join(ROOT, "configs", "speech_attention.py")
# appended to the config: its datasets and model in the benchmark's folders, every rank's lines printed
OVERRIDES = """
train = {{"class": "HDFDataset", "files": [{train!r}], "seq_ordering": "laplace:.100"}}
dev = {{"class": "HDFDataset", "files": [{dev!r}]}}
model = {model!r}
num_epochs = {epochs}
log_all_ranks = True
"""
# a rank's closing lines of its search loop ("[rank 1] " before rank 1's)
STEPS_LINE = re.compile(r"^(?:\[rank (\d+)\] )?search '.*', finished after (\d+) steps", re.M)
FRAMES_LINE = re.compile(r"^(?:\[rank (\d+)\] )?search '.*': ([\d.]+) frames/sec \((\d+) frames, "
                         r"([\d.]+)s computing\)", re.M)
CEILING_SHARE = 0.9  # the verdict: 2 ranks reach at least this share of the ceiling


def write_config(folder: str, train: str, dev: str, epochs: int) -> str:
    with open(CONFIG) as f:
        text = f.read()
    path = os.path.join(folder, "speech_attention.py")
    with open(path, "w") as f:
        f.write(text + OVERRIDES.format(train=train, dev=dev, model=os.path.join(folder, "model"),
                                        epochs=epochs))
    return path


def rank_figures(output: Output) -> dict[int, tuple[int, int, float, float]]:
    """rank -> (batches, frames, seconds of its search loop, seconds computing), from its closing lines."""
    steps = {int(rank or 0): int(n) for rank, n in STEPS_LINE.findall(output.text)}
    figures = {}
    for rank, rate, frames, computing in FRAMES_LINE.findall(output.text):
        rank = int(rank or 0)
        figures[rank] = (steps.get(rank, 0), int(frames), int(frames) / float(rate), float(computing))
    return figures


class Searcher:
    def __init__(self, config: str, folder: str, frames: int) -> None:
        self.config, self.folder, self.frames = config, folder, frames
        self.ranks: dict[str, list[dict]] = {}  # row -> per run, rank_figures
        self.wall: dict[str, list[float]] = {}  # row -> the whole run's seconds (start-up included)
        self.files: dict[str, list[str]] = {}  # row -> the output files of its runs
        self.busy: dict[str, list[float]] = {}  # row -> CPU seconds of all its processes / wall seconds

    def row(self, name: str, ranks: int, threads: int | None) -> Row:
        """``threads``: both TensorFlow pools of every rank (None: the engine's automatic choice)."""
        def measure() -> float:
            env = child_env(threads)
            out = os.path.join(self.folder, f"hyps-{len(os.listdir(self.folder))}.txt")
            overrides = ["++task", "search", "++search_output_file", out] + \
                (["++use_horovod", "1"] if ranks > 1 else [])
            before = _children_cpu_seconds()
            output = run_stamped(rnn_command(self.config, ranks, overrides, env), env)
            self.busy.setdefault(name, []).append((_children_cpu_seconds() - before) / output.stamps[-1][0])
            figures = rank_figures(output)
            if sorted(figures) != list(range(ranks)) or sum(f[1] for f in figures.values()) != self.frames:
                raise RowFailed(f"the search lines of {ranks} rank(s) are missing or do not add up to the "
                                f"dev set's {self.frames} frames: {figures}")
            self.ranks.setdefault(name, []).append(figures)
            self.wall.setdefault(name, []).append(output.stamps[-1][0])
            self.files.setdefault(name, []).append(out)
            return self.frames / max(f[2] for f in figures.values())

        return Row(name, measure)

    def rank_lines(self, row: Row) -> list[str]:
        """Per rank, the medians over the runs: batches, frames, seconds searching and computing."""
        lines = []
        for rank in sorted(self.ranks[row.name][0]):
            runs = self.ranks[row.name]
            batches, frames, seconds, computing = (statistics.median(run[rank][i] for run in runs)
                                                   for i in range(4))
            lines.append(f"  {row.name}, rank {rank}: {batches:.0f} batches, {frames:.0f} frames, "
                         f"{seconds:.2f} s searching ({computing:.2f} s computing)")
        return lines


def _load() -> str:
    """The machine's load averages (1, 5, 15 minutes): other jobs share the cores."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5, help="training epochs before the search [5]")
    parser.add_argument("--dev-seqs", type=int, default=1500,
                        help="dev utterances of a corpus made here (1 rank searches them in ~20 s) [1500]")
    parser.add_argument("--data", help="the corpus folder: reused when it has train.hdf and dev.hdf, else "
                                       "made there [a temporary folder]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        train, dev = corpus_files(args.data or os.path.join(tmp, "data"),
                                  ["--eos", "--num_dev", str(args.dev_seqs)])
        with h5py.File(dev, "r") as f:
            lengths = f["seqLengths"][:, 0]
        frames, seqs = int(lengths.sum()), len(lengths)
        config = write_config(tmp, train, dev, args.epochs)
        env = child_env(1)
        trained = run_stamped(rnn_command(config, 2, ["++use_horovod", "1"], env), env)
        errors = re.findall(r"^dev: score \S+ error (\S+)", trained.text, re.M)
        hyps = os.path.join(tmp, "hyps")
        os.makedirs(hyps)
        print(f"search: {seqs} dev seqs, {frames} frames ({dev}); model trained {args.epochs} epochs on 2 "
              f"ranks (dev error by epoch: {' '.join(f'{float(e):.3f}' for e in errors)}); {args.runs} runs "
              f"per row, taking turns; load average {_load()}")
        searcher = Searcher(config, hyps, frames)
        single = [searcher.row("1 rank", 1, None), searcher.row("1 rank, 1 thread", 1, 1)]
        ranks = searcher.row("2 ranks, 1 thread each", 2, 1)
        interleaved(single + [ranks], args.runs)
        one_thread_file = searcher.files.get(single[1].name, [""])[0]
        same = {row.name: all(filecmp.cmp(path, one_thread_file, shallow=False) for path in
                              searcher.files.get(row.name, [])) for row in single + [ranks]}
        with open(one_thread_file or os.devnull) as f:
            hyp_words = sum(len(line.split()) for line in f) / seqs
    top = best(single)
    print(f"\n{'run':<24} {'frames/s':>9} {'range':>13} {'seconds':>8} {'whole run s':>12} {'speed-up':>9} "
          f"{'cores busy':>11}")
    for row in single + [ranks]:
        if row.failed:
            print(f"{row.name:<24} FAIL: {row.failure}")
            continue
        print(f"{row.name:<24} {row.median:>9.0f} {row.spread():>13} {frames / row.median:>8.2f} "
              f"{statistics.median(searcher.wall[row.name]):>12.1f} {row.median / top.median:>8.2f}x "
              f"{statistics.median(searcher.busy[row.name]):>11.2f}")
    print(f"(seconds: the search loop, the slowest rank's; whole run: start-up, loading and writing "
          f"included; speed-up: over the best single process, '{top.name}'; {len(os.sched_getaffinity(0))} "
          f"cores here; cores busy: CPU seconds of the run's processes over its wall time, start-up "
          f"included; hypotheses: {hyp_words:.2f} words on average)")
    for line in searcher.rank_lines(ranks) if not ranks.failed else []:
        print(line)
    ceiling = 2 * single[1].median
    print(f"info: 2 ranks = {ranks.median / top.median:.2f}x the best single process, "
          f"{ranks.median / ceiling:.2f} of the ceiling (2x the one-thread process: {ceiling:.0f} frames/s)")
    print(compare(Side.of(ranks), Side.of(top), f"search on 2 ranks is faster than the best single "
                  f"process ({ranks.median / top.median:.2f}x), frames/s", better="higher", fmt="{:.0f}",
                  failed=single))
    print(compare(Side.of(ranks), Side.of(single[1]), f"search on 2 ranks reaches >= {CEILING_SHARE:.0%} "
                  f"of the ceiling (>= {2 * CEILING_SHARE:.1f}x the one-thread process), frames/s",
                  better="higher", factor=2 * CEILING_SHARE, fmt="{:.0f}", failed=single))
    print(verdict(same[ranks.name], "every 2-rank output file is byte-identical to the one-thread single "
                  "process's", failed=[ranks, single[1]]))
    print(f"info: load average at the end {_load()}")
    print(f"info: the default-threading process's files are {'' if same[single[0].name] else 'NOT '}"
          "byte-identical to the one-thread process's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
