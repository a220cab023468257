#!/usr/bin/env python3
"""Training throughput on one machine: what a user can choose for one process against N ranks, on both
backends, in grad mode and in param mode with syncs inside the epoch; and each rank's peak memory.

    .venv/bin/python benchmarks/bench_train.py [--seqs 1000] [--epochs 3] [--runs 3] [--ranks N]
        [--backends auto,horovod] [--rows all|monitoring]

The RETURNN-style workload of ``workload.py`` (2x LSTM-128, batch_size 5000, max_seqs 40, random order,
``cache_size = "0"``), ``--epochs`` epochs per run through ``rnn.py``; frames/s over epochs 2..E, timed
from rank 0's output lines (``timing.py``). Every row is the median of ``--runs`` runs (rows take turns)
with the range. Rows:

- 1 process with the engine's default threading (no thread variable, no thread key), with 1 thread, and
  with as many threads as cores (TensorFlow's own default);
- N single processes of 1 thread at once, no MPI: the ceiling of N ranks on this machine when
  communication and coordination cost nothing (they still share caches and memory bandwidth);
- 1 rank under mpirun (``use_horovod``: MPI loaded, nothing to reduce);
- N ranks (N = the cores of this machine) with the engine's default threading, per backend: grad;
  param with ``horovod_param_sync_step`` 5 and 20 (syncs inside the epoch: at 1000 sequences a rank
  takes about 25 steps an epoch) and with syncs only at the end of each epoch;
- monitoring: N ranks grad on the default backend with everything of monitoring on at its defaults
  (TensorBoard beside the model, a timeline file, progress lines, the summary), with TensorBoard off and
  no timeline, and that "off" row again (the noise of identical runs); all write checkpoints.

Speed-ups are against the best single-process row. The verdicts check the targets of issue 13:
- a run is timed from the line that ends epoch 1 to the line that ends the last epoch, the epoch's
  frames/sec line (``engine/training/report.py``); the plain progress line of a long epoch
  (``engine/report/progress.py``: ``train epoch 1: step 1200 of 5000 ...``) starts alike and must not
  match, or the timing would start inside epoch 1;
- the ceiling row is FAIL (no figure) when any of its processes fails: a sum over fewer processes
  would read as a lower ceiling;
- monitoring: everything on / everything off >= 0.98 (a fixed target, at most 2% slower); the "off
  again" / "off" ratio, the noise of identical runs, is printed beside it, not mixed into the target;
- memory, per parallel row: its peaks (``VmHWM``, the largest of its ranks) at most one rank under
  mpirun's peaks + the fused buffers, by the ranges rule (``timing.compare``: PASS or MISS only when the
  two ranges are apart).
A row that failed makes every verdict that needs it FAIL, and the benchmark exit with status 1.
Peak memory: the kernel's high-water mark of each rank's process (``peak_memory.py``), medians.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import itertools
import sys
import tempfile
import threading
from typing import Sequence

from bench_timeline import in_graph_cost, span_costs  # the script's own directory is on sys.path
from timing import Output, Row, RowFailed, Side, child_env, compare, interleaved, rnn_command, run_stamped
from workload import make_corpus, write_engine_config

FRAMES_LINE = re.compile(r"^train epoch (\d+): [\d.]+ frames/sec \((\d+) frames", re.M)
MONITORING_TARGET = 0.98  # everything on / everything off: at most 2% slower
BACKEND_LINE = re.compile(r"^distributed: using the (\w+) backend", re.M)
THREADS_LINE = re.compile(r"^threads: (.*?) \(", re.M)
MEMORY_LINE = re.compile(r"^peak memory rank (\d+): ([\d.]+) MiB peak, ([\d.]+) MiB anonymous, ([\d.]+) MiB",
                         re.M)
PARAM_BYTES = 4 * ((40 + 128) * 512 + 512 + (128 + 128) * 512 + 512 + 128 * 50 + 50)
FUSED_BUFFERS = 2  # the mpi backend pools two fusion buffers per dtype (engine/distributed/fusion.py)


class Trainer:
    """Runs training and remembers what each row's runs printed besides their speed."""

    def __init__(self, config: str, epochs: int) -> None:
        self.config, self.epochs = config, epochs
        # row name -> per run, (peak, anonymous, file-backed) MiB of the rank with the largest peak
        self.memory: dict[str, list[tuple[float, float, float]]] = {}
        self.notes: dict[str, set[str]] = {}
        self.timelines: dict[str, list[str]] = {}

    def rate(self, output: Output) -> float:
        return epochs_rate(output, self.epochs)

    def row(self, name: str, ranks: int, overrides: list[str], threads: int | None = None,
            mpirun: bool | None = None) -> Row:
        def measure() -> float:
            env = child_env(threads)
            output = run_stamped(rnn_command(self.config, ranks, overrides, env, mpirun=mpirun), env)
            self._remember(name, output)
            return self.rate(output)

        return Row(name, measure)

    def independent_row(self, name: str, processes: int) -> Row:
        """``processes`` single-process trainings of 1 thread at once; their rates add up. A run that
        fails makes the row FAIL (``ceiling_rate``): in a thread, ``run_stamped``'s exit would end only
        that thread, and the sum would be over fewer processes."""
        def measure() -> float:
            env = child_env(1)
            results: list[Output | BaseException | None] = [None] * processes

            def one(index: int) -> None:
                try:
                    results[index] = run_stamped(rnn_command(self.config, 1, [], env), env, check=False)
                except BaseException as exc:  # SystemExit too: reported by ceiling_rate, in the main thread
                    results[index] = exc

            threads = [threading.Thread(target=one, args=(i,)) for i in range(processes)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return ceiling_rate(results, self.epochs)

        return Row(name, measure)

    def monitored_row(self, name: str, ranks: int, backend: str, monitoring: bool, tmp: str) -> Row:
        """``ranks`` ranks in grad mode, each run with a model folder of its own (checkpoints every
        epoch): with everything of monitoring on at its defaults and a timeline file, or with TensorBoard
        off and no timeline (progress lines stay: a pipe gets one a minute). ``self.timelines[name]``:
        the runs' timeline files."""
        runs = itertools.count()
        timelines = self.timelines.setdefault(name, [])

        def measure() -> float:
            out = os.path.join(tmp, re.sub(r"\W+", "-", name), str(next(runs)))
            overrides = parallel_overrides(backend, "grad") + ["++model", os.path.join(out, "model")]
            if monitoring:
                timelines.append(os.path.join(out, "timeline.json"))
                overrides += ["++timeline_file", timelines[-1]]
            else:
                overrides += ["++tensorboard", "0"]
            env = child_env()
            output = run_stamped(rnn_command(self.config, ranks, overrides, env), env)
            self._remember(name, output)
            return self.rate(output)

        return Row(name, measure)

    def _remember(self, name: str, output: Output) -> None:
        ranks = [tuple(map(float, values)) for _, *values in MEMORY_LINE.findall(output.text)]
        if not ranks:
            raise RowFailed(f"no peak memory line in the output:\n{output.text[-2000:]}")
        self.memory.setdefault(name, []).append(max(ranks))
        notes = self.notes.setdefault(name, set())
        notes.update(f"{b} backend" for b in BACKEND_LINE.findall(output.text))
        notes.update(f"threads {t}" for t in THREADS_LINE.findall(output.text))


def epoch_end_pattern(epoch: int) -> str:
    """The line that ends a train epoch and gives its throughput (``EpochReport.finish``), and no other:
    a progress line starts with ``train epoch N: step`` (the module docstring)."""
    return rf"^train epoch {epoch}: [\d.]+ frames/sec \("


def epochs_rate(output: Output, epochs: int) -> float:
    """frames/s of epochs 2..E, timed from the end of epoch 1 to the end of the last; RowFailed when an
    epoch's line is missing (a run that ended early has no rate)."""
    frames = {int(epoch): int(n) for epoch, n in FRAMES_LINE.findall(output.text)}
    missing = [epoch for epoch in range(1, epochs + 1) if epoch not in frames]
    if missing:
        raise RowFailed(f"no frames/sec line for epoch(s) {missing} in the output:\n{output.text[-2000:]}")
    seconds = output.seconds_between(epoch_end_pattern(1), epoch_end_pattern(epochs))
    return sum(frames[epoch] for epoch in range(2, epochs + 1)) / seconds


def ceiling_rate(results: Sequence[Output | BaseException | None], epochs: int) -> float:
    """The sum of the rates of processes run at once; RowFailed naming every process that failed (an
    exception, no result, a non-zero exit, or no rate in its output)."""
    failures = []
    for number, result in enumerate(results, 1):
        if not isinstance(result, Output):
            failures.append(f"process {number}: {result!r}")
        elif result.returncode != 0:
            failures.append(f"process {number} exited with {result.returncode}")
    if failures:
        raise RowFailed(f"{len(failures)} of {len(results)} processes failed: {'; '.join(failures)}")
    rates = []
    for number, result in enumerate(results, 1):
        try:
            rates.append(epochs_rate(result, epochs))
        except RowFailed as exc:
            raise RowFailed(f"process {number}: {exc}") from None
    return sum(rates)


def parallel_overrides(backend: str, mode: str) -> list[str]:
    overrides = ["++use_horovod", "1", "++distributed_backend", backend]
    if mode == "grad":
        return overrides + ["++horovod_reduce_type", "grad"]
    sync = {"param sync 5": "5", "param sync 20": "20", "param, sync at epoch end": "1000000"}[mode]
    return overrides + ["++horovod_reduce_type", "param", "++horovod_param_sync_step", sync]


MODES = ("grad", "param sync 5", "param sync 20", "param, sync at epoch end")


def report(single: list[Row], ceiling: Row, under_mpirun: Row, parallel: dict[str, dict[str, Row]],
           trainer: Trainer, ranks: int) -> None:
    measured = [row for row in single if not row.failed]
    best = max(measured, key=lambda row: row.median) if measured else single[0]
    print(f"\n{'run':<58} {'frames/s':>9} {'range':>13} {'vs best 1-process':>18}")
    for row in [*single, ceiling, under_mpirun, *[r for rows in parallel.values() for r in rows.values()]]:
        notes = ", ".join(sorted(trainer.notes.get(row.name, ())))
        figures = f"{'FAIL':>9} {'':>13} {'':>18}" if row.failed else \
            f"{row.median:>9.0f} {row.spread():>13} {row.median / best.median:>17.2f}x"
        print(f"{row.name:<58} {figures}{'   (' + notes + ')' if notes else ''}")
        if row.failed:
            print(f"  FAIL: {row.failure}")
    default_backend = next(iter(parallel))
    rows = parallel[default_backend]
    print(f"\nverdicts (best single-process row: '{best.name}', {best.median:.0f} frames/s; "
          f"default backend: {default_backend}):")
    default = single[0]
    print(compare(Side.of(default), Side.of(best), f"1 process with the default threading is "
                  f"{default.median / best.median:.3f}x the best single-process row, frames/s "
                  "(target >= 0.95)",
                  better="higher", factor=0.95, fmt="{:.0f}", failed=single))
    grad = rows["grad"].median / best.median
    ceiling_ratio = "FAIL" if ceiling.failed else f"{ceiling.median / best.median:.2f}x"
    print(compare(Side.of(rows["grad"]), Side.of(best), f"{ranks} ranks grad, default backend and threading: "
                  f"{grad:.2f}x the best single-process row, frames/s (target >= 1.8x; ceiling "
                  f"{ceiling_ratio})", better="higher", factor=1.8, fmt="{:.0f}", failed=single))
    for mode in ("param sync 5", "param sync 20"):
        ratio = rows[mode].median / best.median
        print(compare(Side.of(rows[mode]), Side.of(best), f"{ranks} ranks {mode} (syncs inside the epoch): "
                      f"{ratio:.2f}x, frames/s (target >= 1.85x)", better="higher", factor=1.85, fmt="{:.0f}",
                      failed=single))
    if len(parallel) > 1:
        for backend, other in list(parallel.items())[1:]:
            ratios = ", ".join(f"{mode} {other[mode].median / rows[mode].median:.2f}x" for mode in MODES)
            print(f"info: {backend} against {default_backend}: {ratios}")
    memory_report(single[0], under_mpirun, parallel, trainer)


def memory_report(alone: Row, under_mpirun: Row, parallel: dict[str, dict[str, Row]],
                  trainer: Trainer) -> None:
    """Medians over the runs, and a verdict per parallel row (``memory_verdict``)."""
    fused = FUSED_BUFFERS * PARAM_BYTES / 2**20
    print("\npeak resident memory per rank, MiB (the rank with the largest peak; medians; "
          "cache_size = \"0\"):")
    print(f"  {'run':<56} {'peak':>7} {'anonymous':>10} {'files':>7}  (anonymous and files: at the end)")
    for row in [alone, under_mpirun] + [r for rows in parallel.values() for r in rows.values()]:
        runs = trainer.memory.get(row.name, [])
        if runs:
            columns = [statistics.median(run[column] for run in runs) for column in range(3)]
            print(f"  {row.name:<56} {columns[0]:>7.1f} {columns[1]:>10.1f} {columns[2]:>7.1f}")
        else:
            print(f"  {row.name:<56} {'FAIL':>7}")
    for rows in parallel.values():
        for row in rows.values():
            print(memory_verdict(row, trainer.memory.get(row.name, []), under_mpirun,
                                 trainer.memory.get(under_mpirun.name, []), fused))


def memory_verdict(row: Row, runs: list[tuple[float, float, float]], base: Row,
                   base_runs: list[tuple[float, float, float]], fused: float) -> str:
    """A rank of several holds no more at its peak than one rank under mpirun plus the fused buffers.
    ``runs``: per run, (peak, anonymous, files) MiB of the rank with the largest peak. The peak, not the
    memory at the end: a buffer freed before the end still had to fit. Decided by the ranges rule of
    every measured verdict (``timing.compare``): this row's peaks against the 1-rank row's peaks plus the
    buffers, PASS or MISS only when the two ranges are apart, else INCONCLUSIVE; no row's noise widens
    the limit."""
    peaks = Side(row.name, tuple(run[0] for run in runs), row.failure)
    limit = Side(f"{base.name} + fused buffers {fused:.1f} MiB", tuple(run[0] + fused for run in base_runs),
                 base.failure)
    return compare(peaks, limit, f"{row.name}: peak memory per rank, MiB (at most one rank under mpirun + "
                   "the fused buffers)", better="lower", fmt="{:.1f}")


def monitoring_verdict(on: Row, off: Row, off_again: Row) -> str:
    """Everything on / everything off against the fixed target; the "off again" / "off" ratio (the noise
    of identical runs) is printed beside it and does not move the target: a disturbed run must not
    lower the bar."""
    ratio, noise = on.median / off.median, off_again.median / off.median
    text = (f"everything on / everything off: {ratio:.3f} (target >= {MONITORING_TARGET}: at most "
            f"{100 * (1 - MONITORING_TARGET):.0f}% slower); noise of identical runs, off again / off: "
            f"{noise:.3f}")
    if abs(1 - noise) > 1 - MONITORING_TARGET:
        text += " (beyond the target's margin: a disturbed run, repeat it)"
    return compare(Side.of(on), Side.of(off), text + ", frames/s", better="higher", factor=MONITORING_TARGET,
                   fmt="{:.0f}", failed=[off_again])


def monitoring_report(on: Row, off: Row, off_again: Row, trainer: Trainer, backend: str, tmp: str) -> None:
    """The cost of watching a run: everything on against off, with a second "off" row beside it as the
    noise of identical runs; then, from the first "on" run's timeline, the spans a step and what they
    cost at the price per span that bench_timeline.py measures in this process."""
    print(f"\nmonitoring, {on.name.split(',')[0]}, {backend} backend (medians and ranges, frames/s):")
    for row in (on, off, off_again):
        figure = "FAIL" if row.failed else f"{row.median:.0f}"
        print(f"  {row.name:<56} {figure:>9} {row.spread():>13}")
    print(monitoring_verdict(on, off, off_again))
    if not trainer.timelines.get(on.name) or not os.path.exists(trainer.timelines[on.name][0]):
        print("  timeline: no timeline file of an 'on' run")
        return
    spans_per_step, step_ms = timeline_load(trainer.timelines[on.name][0])
    costs = {state: micros for state, body, micros in span_costs(20000, 3)[0] if body == "record"}
    per_step = spans_per_step * (costs["on"] - costs["off"])
    in_graph = ""
    if backend == "horovod":  # the allreduce's span leaves the compiled step through a numpy_function
        graph = in_graph_cost(1000, 3, tmp)
        per_step += graph["on"] - graph["off"]
        in_graph = f" + {graph['on'] - graph['off']:.1f} us for the in-graph span"
    print(f"  timeline: {spans_per_step:.1f} spans a step on rank 0, steps of {step_ms:.1f} ms (median); "
          f"{spans_per_step:.1f} x {costs['on'] - costs['off']:.1f} us a span{in_graph}: "
          f"{100 * per_step / (1000 * step_ms):.3f}% of a step (target < 1%)")


def timeline_load(path: str) -> tuple[float, float]:
    """(spans per train step, median milliseconds from one step's start to the next) of rank 0, from a
    run's merged timeline."""
    with open(path) as f:
        spans = [e for e in json.load(f) if e["ph"] == "X" and e["pid"] == 0]
    starts = sorted(e["ts"] for e in spans if e["cat"] == "step")
    return len(spans) / len(starts), statistics.median(b - a for a, b in zip(starts, starts[1:])) / 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--backends", default="auto,horovod",
                        help="comma-separated; the first is the default backend the verdicts use")
    parser.add_argument("--rows", choices=["all", "monitoring"], default="all",
                        help="monitoring: only the three monitoring rows")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.hdf")
        frames = make_corpus(corpus, args.seqs)
        trainer = Trainer(write_engine_config(tmp, corpus, args.epochs), args.epochs)
        print(f"corpus: {args.seqs} seqs, {frames} frames; 2x LSTM-128, batch_size 5000, max_seqs 40, Adam; "
              f"{cores} cores; epochs 2..{args.epochs} timed; {args.runs} runs per row, taking turns")
        single = [trainer.row("1 process, engine default threading", 1, []),
                  trainer.row("1 process, 1 thread", 1, [], threads=1),
                  trainer.row(f"1 process, {cores} threads (as many as cores)", 1, [], threads=cores)]
        ceiling = trainer.independent_row(f"{args.ranks} single processes of 1 thread at once (ceiling)",
                                          args.ranks)
        under_mpirun = trainer.row("1 rank under mpirun (use_horovod, mpi backend)", 1,
                                   ["++use_horovod", "1", "++distributed_backend", "mpi"], mpirun=True)
        parallel = {b: {m: trainer.row(f"{args.ranks} ranks {m}, {b} backend", args.ranks,
                                       parallel_overrides(b, m)) for m in MODES}
                    for b in args.backends.split(",")}
        default_backend = args.backends.split(",")[0]
        monitored = [trainer.monitored_row(f"{args.ranks} ranks grad, {what}", args.ranks, default_backend,
                                           what.endswith(" on"), tmp)
                     for what in ("monitoring on", "monitoring off", "monitoring off, again")]
        rows = [*single, ceiling, under_mpirun, *[r for rs in parallel.values() for r in rs.values()]]
        interleaved(rows + monitored if args.rows == "all" else monitored, args.runs)
        if args.rows == "all":
            report(single, ceiling, under_mpirun, parallel, trainer, args.ranks)
        monitoring_report(*monitored, trainer, default_backend, tmp)
        measured = rows + monitored if args.rows == "all" else monitored
    failed = [row.name for row in measured if row.failed]
    if failed:
        print(f"\nFAIL: {len(failed)} row(s) failed: {'; '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
