#!/usr/bin/env python3
"""RETURNN's LSTM attention system (reduced), trained and searched by this engine and by RETURNN side by
side: training frames/s and beam-12 search sequences/s.

    RETURNN_PYTHON=/tmp/returnn-venv/bin/python \\
        .venv/bin/python benchmarks/bench_returnn_attention_speed.py CHECKOUT
        [--config 2019-librispeech-system/attention/base2.config] [--train-seqs 1200] [--dev-seqs 1000]
        [--epochs 3] [--runs 3] [--classes 20] [--scale 0.0625]

The network, the corpus and the training keys are ``bench_returnn_search.py``'s (the config's network with
every width times ``--scale``, dropout as written, ``pretrain`` not run; adam at a constant learning rate,
``batch_size`` 1000, ``max_seqs`` 40; the synthetic HDF corpus of label prototypes, here 1200 sequences by
default, about 100k frames: epochs of a few seconds made the ratio swing with the machine's other load).
Both programs train it from scratch for ``--epochs`` epochs; frames/s over epochs 2..E
(``bench_returnn.py``'s ``rate``: from the end of epoch 1, graph building and tracing done, to the end of
the last). Then both search the dev
corpus with beam 12 (``task = "search"``, ``search_output_layer`` "decision", an output file, so longest
sequence first, ``batch_size`` 4000 and ``max_seqs`` 20; ``search_do_eval`` False, since RETURNN would
compute its losses and their scores beside the search) from the last RETURNN checkpoint the training
rows left, or from ``--checkpoint`` (a better trained one, whose hypotheses end as a real system's do):
sequences/s from the line that starts the search (after graph building and loading) to the one that ends
it. Each row's median of ``--runs`` runs taking turns, with the range; each program with its
default threading (both cores). Verdicts: training at least ``TRAIN_TARGET`` times RETURNN's frames/s,
search at least ``SEARCH_TARGET`` times its sequences/s.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from bench_returnn import rate, returnn_version
from bench_returnn_ctc_demo import RETURNN_HEAD
from bench_returnn_search import DEFAULT_CONFIG, make_corpus, search_lines, training_lines, write_config
from returnn_attention_side import reduced
from returnn_side import no_returnn, returnn_python
from timing import Row, Side, child_env, compare, interleaved, rnn_command, run_stamped

TRAIN_TARGET = 1.5
SEARCH_TARGET = 1.0
# the lines between which each program searches (after its graph is built and the checkpoint loaded)
SEARCH_SPAN = {"engine": (r"^search: \d+ sequences of", r"^search 'decision', finished after"),
               "returnn": (r"^Will write outputs to", r" search, finished after")}


def search_rate(output, program: str, seqs: int) -> float:
    return seqs / output.seconds_between(*SEARCH_SPAN[program])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the setup's config, under the checkout")
    parser.add_argument("--train-seqs", type=int, default=1200)
    parser.add_argument("--dev-seqs", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--classes", type=int, default=20, help="labels, EOS 0 included")
    parser.add_argument("--scale", type=float, default=0.0625)
    parser.add_argument("--learning-rate", type=float, default=0.002)
    parser.add_argument("--no-search", action="store_true", help="time the training only")
    parser.add_argument("--checkpoint", help="search with this RETURNN checkpoint of the same network (e.g. "
                        "DIR/returnn/epoch.020 of bench_returnn_search.py --keep DIR) instead of the last "
                        "training row's")
    args = parser.parse_args()
    python = returnn_python()
    if python is None:
        return no_returnn("bench_returnn_attention_speed", "nothing is compared")
    from returnn_setups import read_setup

    setup = read_setup(args.checkout, args.config)
    dim = int(setup.namespace.get("num_inputs", 40))
    network = reduced(setup.network, args.scale)
    extern_data = {"data": {"dim": dim}, "classes": {"dim": args.classes, "sparse": True}}
    with tempfile.TemporaryDirectory() as tmp:
        train_hdf, dev_hdf = os.path.join(tmp, "train.hdf"), os.path.join(tmp, "dev.hdf")
        frames = sum(len(f) for _, f, _ in make_corpus(train_hdf, args.train_seqs, 1, args.classes, dim))
        make_corpus(dev_hdf, args.dev_seqs, 2, args.classes, dim)
        models = {program: os.path.join(tmp, program) for program in ("engine", "returnn")}
        configs = {program: write_config(os.path.join(tmp, f"{program}.config"), training_lines(
            network, extern_data, train_hdf, os.path.join(models[program], "epoch"), args.epochs,
            args.learning_rate), RETURNN_HEAD if program == "returnn" else "") for program in models}
        env = child_env()
        returnn_env = dict(env, DISABLE_CUDA="1")
        returnn_env.pop("PYTHONPATH", None)

        def train(program: str, command: list[str], program_env: dict):
            def run() -> float:
                shutil.rmtree(models[program], ignore_errors=True)  # every run trains from scratch
                return rate(run_stamped(command, program_env, timeout=3600), frames, args.epochs)
            return run

        engine = Row("engine, 1 rank", train("engine", rnn_command(configs["engine"], 1), env))
        theirs = Row("RETURNN, 1 process", train("returnn", [python, "-m", "returnn", configs["returnn"]],
                                                 returnn_env))
        print(f"{args.config} at scale {args.scale:g}, {args.classes} classes, dropout as written; corpus "
              f"{args.train_seqs} seqs, {frames} frames; dev {args.dev_seqs} seqs; "
              f"{returnn_version(python, returnn_env)}; epochs 2..{args.epochs} timed, {args.runs} runs per "
              "row, taking turns", flush=True)
        interleaved([engine, theirs], args.runs)
        rows = [("training", "frames/s", engine, theirs, TRAIN_TARGET)]
        if not args.no_search:
            checkpoint = args.checkpoint or os.path.join(models["returnn"], f"epoch.{args.epochs:03d}")
            output = os.path.join(tmp, "search-out.py")

            def search(program: str, command_of, program_env: dict):
                config = write_config(os.path.join(tmp, f"{program}-search.config"), search_lines(
                    network, extern_data, dev_hdf, checkpoint, output, "decision", do_eval=False),
                    RETURNN_HEAD if program == "returnn" else "")
                command = command_of(config)

                def run() -> float:
                    if os.path.exists(output):
                        os.remove(output)
                    return search_rate(run_stamped(command, program_env, timeout=3600), program,
                                       args.dev_seqs)
                return run

            engine_search = Row("engine, 1 rank", search("engine", lambda c: rnn_command(c, 1), env))
            returnn_search = Row("RETURNN, 1 process", search(
                "returnn", lambda c: [python, "-m", "returnn", c], returnn_env))
            interleaved([engine_search, returnn_search], args.runs)
            rows.append(("search, beam 12", "seqs/s", engine_search, returnn_search, SEARCH_TARGET))
    verdicts = []
    for what, unit, ours, other, target in rows:
        print(f"\n{what:<24} {unit:>9} {'range':>15}")
        for row in (ours, other):
            fmt = "{:.0f}" if unit == "frames/s" else "{:.1f}"
            print(f"{row.name:<24} {fmt.format(row.median):>9} {row.spread(fmt):>15}")
        verdicts.append(compare(Side.of(ours), Side.of(other), f"{what}: engine = "
                                f"{ours.median / other.median:.2f}x RETURNN, {unit} (target >= {target}x)",
                                better="higher", factor=target, fmt="{:.1f}", failed=[ours, other]))
    print("\n" + "\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
