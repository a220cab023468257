#!/usr/bin/env python3
"""One process of this engine against RETURNN on the same RETURNN-style config and corpus, side by side.

    .venv/bin/python benchmarks/bench_returnn.py [--seqs 600] [--epochs 3] [--runs 3] [--threads 1,2]
        [--units BasicLSTM,NativeLstm2]

RETURNN is not part of this project: the comparison runs only where a Python with RETURNN installed is
found, ``$RETURNN_PYTHON`` or else ``/tmp/returnn-venv/bin/python`` (``pip install returnn
tensorflow-cpu==2.15.1`` in a virtual environment of its own), and says so when there is none.

Both programs train ``workload.py``'s config (2x LSTM-128, 40-dim input, 50 classes, batch_size 5000,
max_seqs 40, random order, Adam) on one corpus written by the engine's HDFWriter, each program with each
of the ``--threads`` TensorFlow thread counts (RETURNN: ``tf_session_opts``, intra- and inter-op; the
engine: the thread variables), and the engine also with its default threading. Each program is judged by
its best row: the verdict is the engine's best row against RETURNN's best row (over units and thread
counts), so RETURNN's 2-thread rows count when they are its fastest. RETURNN runs each
of ``--units``: ``BasicLSTM`` (on TensorFlow 2 RETURNN runs its StandardLSTM cell in a loop) and
``NativeLstm2`` (RETURNN's own C++ LSTM op, its default ``lstm``, compiled on first use). The engine runs
the same LSTM whatever the unit name. RETURNN runs with ``DISABLE_CUDA=1``: without it, a CUDA toolkit
on a machine without GPU makes RETURNN compile its op with CUDA headers that tensorflow-cpu lacks.

frames/s over epochs 2..E, from the end of epoch 1 to the end of the last (the epoch lines of both
programs, ``timing.py``), median of ``--runs`` runs taking turns, with the range.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from typing import Sequence

from returnn_side import DEFAULT_RETURNN_PYTHON, returnn_python
from timing import Output, Row, Side, child_env, compare, interleaved, rnn_command, run_stamped
from workload import make_corpus, write_engine_config, write_returnn_config

TARGET = 1.5


def rate(output: Output, frames_per_epoch: int, epochs: int) -> float:
    seconds = output.seconds_between(r"^train epoch 1, finished after",
                                     rf"^train epoch {epochs}, finished after")
    return frames_per_epoch * (epochs - 1) / seconds


def best(rows: Sequence[Row]) -> Row:
    """The fastest of ``rows`` that were measured (the first row when none was)."""
    return max((row for row in rows if not row.failed), key=lambda row: row.median, default=rows[0])


def verdicts(engine_rows: Sequence[Row], returnn_rows: Sequence[Row], units: Sequence[str]) -> list[str]:
    """The engine's best row against RETURNN's best row (the target), then per unit its best row (info)."""
    ours, theirs = best(engine_rows), best(returnn_rows)
    ratio = ours.median / theirs.median
    lines = [compare(Side.of(ours), Side.of(theirs), f"engine = {ratio:.2f}x RETURNN's best row, frames/s "
                     f"(target >= {TARGET}x)", better="higher", factor=TARGET, fmt="{:.0f}",
                     failed=[*engine_rows, *returnn_rows])]
    for unit in units:
        row = best([r for r in returnn_rows if r.name.startswith(f"RETURNN {unit},")])
        lines.append(f"info: engine = {ours.median / row.median:.2f}x RETURNN {unit}'s best row "
                     f"('{row.name}')")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, default=600)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated TensorFlow thread counts, each a row of each program")
    parser.add_argument("--units", default="BasicLSTM,NativeLstm2", help="RETURNN's LSTM units to run")
    args = parser.parse_args()
    python = returnn_python()
    if python is None:
        print(f"bench_returnn: no RETURNN found (RETURNN_PYTHON is unset and {DEFAULT_RETURNN_PYTHON} "
              "does not exist): the comparison with RETURNN is skipped. Set RETURNN_PYTHON to a Python "
              "that has returnn and tensorflow-cpu 2.15 installed to run it.")
        return 0
    thread_counts = [int(n) for n in args.threads.split(",")]
    units = args.units.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.hdf")
        frames = make_corpus(corpus, args.seqs)
        engine_config = write_engine_config(tmp, corpus, args.epochs)

        def engine(threads: int | None):
            env = child_env(threads)  # None: the engine's default threading
            return lambda: rate(run_stamped(rnn_command(engine_config, 1, [], env), env), frames, args.epochs)

        def returnn(unit: str, threads: int):
            config = write_returnn_config(tmp, corpus, args.epochs, unit, threads)
            returnn_env = dict(child_env(threads), DISABLE_CUDA="1")
            return lambda: rate(run_stamped([python, "-m", "returnn", config], returnn_env, timeout=3600),
                                frames, args.epochs)

        engine_rows = [Row("engine, 1 process, default threading", engine(None))]
        engine_rows += [Row(f"engine, 1 process, {n} thread(s)", engine(n)) for n in thread_counts]
        returnn_rows = [Row(f"RETURNN {unit}, 1 process, {n} thread(s)", returnn(unit, n))
                        for unit in units for n in thread_counts]
        print(f"corpus: {args.seqs} seqs, {frames} frames; RETURNN: {python} "
              f"({returnn_version(python, child_env(1))}); epochs 2..{args.epochs} timed, {args.runs} runs "
              "per row, taking turns")
        interleaved(engine_rows + returnn_rows, args.runs)
    ours = best(engine_rows)
    print(f"\n{'run':<46} {'frames/s':>9} {'range':>13} {'engine best / this':>19}")
    for row in engine_rows + returnn_rows:
        print(f"{row.name:<46} {row.median:>9.0f} {row.spread():>13} {ours.median / row.median:>18.2f}x")
    for line in verdicts(engine_rows, returnn_rows, units):
        print(line)
    return 0


def returnn_version(python: str, env: dict) -> str:
    code = ("import returnn, tensorflow as tf; "
            "print('RETURNN', returnn.__version__, 'TensorFlow', tf.__version__)")
    output = run_stamped([python, "-c", code], env)
    found = re.search(r"^RETURNN .*$", output.text, re.M)
    return found.group(0) if found else "version unknown"


if __name__ == "__main__":
    sys.exit(main())
