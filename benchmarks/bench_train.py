#!/usr/bin/env python3
"""Training throughput: 1 rank against 2 ranks in grad and param mode, on the horovod and mpi backends;
and the cost of watching a run (TensorBoard, timeline, progress, summary), everything on against off.

    .venv/bin/python benchmarks/bench_train.py [--seqs 600] [--epochs 3] [--backends horovod,mpi]
        [--rows all|scaling|monitoring] [--monitoring-runs 3]

A generated HDF corpus (40-dim features, 50 classes, lengths 50-250), a 2-layer LSTM of 128 units,
batch_size 5000, max_seqs 40, Adam, one TensorFlow thread per rank. Every run trains ``--epochs``
epochs through ``rnn.py``; the first epoch (graph tracing) is left out and the rest are summed. Prints
frames/s, the speed-up over 1 rank and the computing-time share, all from this one invocation. The
"ceiling" row runs two unrelated single-process trainings at the same time: what two ranks could reach
on this machine if communication and coordination cost nothing (they still share caches and memory).

Monitoring rows, per backend: 2 ranks in grad mode, ``--monitoring-runs`` runs with everything on at
its defaults (TensorBoard beside the model, a timeline file, progress lines, the summary) and as many
with everything off that can be (``tensorboard = False``, no timeline; progress lines stay, as the
epoch lines this benchmark reads stay, and a pipe gets one a minute), and as many "off" runs again as a
control: the ratio of two identical sets shows the noise of the machine. The three take turns so that
a busy machine slows all alike. Prints the median frames/s of each with its range and the ratios, then
from the first "on" run's timeline the spans a step and the step time, and what the timeline's spans
cost at the price per span that bench_timeline.py measures, in this process (with Horovod, plus the
numpy_function that hands the allreduce's span out of the compiled step).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from engine.datasets import DataKeyInfo, HDFWriter

from bench_timeline import in_graph_cost, span_costs  # the script's own directory is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = """
train = {{"class": "HDFDataset", "files": [{corpus!r}], "seq_ordering": "random"}}
cache_size = "0"
network = {{
    "lstm0": {{"class": "rec", "unit": "NativeLstm2", "n_out": 128}},
    "lstm1": {{"class": "rec", "unit": "NativeLstm2", "n_out": 128, "from": "lstm0"}},
    "output": {{"class": "softmax", "loss": "ce", "from": "lstm1"}},
}}
batch_size = 5000
max_seqs = 40
optimizer = {{"class": "adam"}}
learning_rate = 0.001
num_epochs = {epochs}
log_verbosity = 3
log_all_ranks = True
"""

RUNS = [  # (name, ranks, ++ overrides)
    ("grad", 2, ["++horovod_reduce_type", "grad"]),
    ("param, sync 100, random_seed_offset", 2,
     ["++horovod_reduce_type", "param", "++horovod_param_sync_step", "100",
      "++horovod_dataset_distribution", "random_seed_offset"]),
]

EPOCH_LINE = re.compile(r"^(?:\[rank (\d+)\] )?train epoch (\d+), finished after (\d+) steps, \S+ elapsed "
                        r"\(([\d.]+)% computing time\)$", re.M)
FRAMES_LINE = re.compile(r"^(?:\[rank (\d+)\] )?train epoch (\d+): ([\d.]+) frames/sec \((\d+) frames, "
                         r"([\d.]+)s computing\)", re.M)


def make_corpus(path: str, num_seqs: int) -> None:
    rng = np.random.RandomState(0)
    mapping = rng.standard_normal((40, 50))
    keys = {"data": DataKeyInfo(dim=40), "classes": DataKeyInfo(dim=50, sparse=True)}
    with HDFWriter(path, keys) as writer:
        for i in range(num_seqs):
            features = rng.standard_normal((rng.randint(50, 251), 40)).astype(np.float32)
            writer.insert(f"seq-{i}", {"data": features, "classes": (features @ mapping).argmax(1)})


ENV = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1")


def command(config: str, ranks: int, overrides: list[str], backend: str) -> list[str]:
    cmd = [sys.executable, os.path.join(ROOT, "rnn.py"), config]
    if ranks > 1:
        mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
        cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "--map-by", "slot", "-np", str(ranks),
               "-x", "TF_NUM_INTRAOP_THREADS", "-x", "TF_NUM_INTEROP_THREADS", *cmd,
               "++use_horovod", "1", "++distributed_backend", backend, *overrides]
    return cmd


def finished(proc: subprocess.Popen, cmd: list[str]) -> str:
    stdout, stderr = proc.communicate(timeout=1200)
    if proc.returncode != 0:
        sys.exit(f"bench_train: run failed ({' '.join(cmd)}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return stdout


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def run(config: str, ranks: int, overrides: list[str], backend: str) -> tuple[float, float]:
    """(frames/s summed over ranks, computing-time %) over the epochs after the first."""
    cmd = command(config, ranks, overrides, backend)
    return parse(finished(start(cmd), cmd), per_rank_scores="random_seed_offset" in overrides)


def run_two_independent(config: str) -> tuple[float, float]:
    """Two single-process trainings at once, no MPI: what sharing the machine alone costs."""
    cmd = command(config, 1, [], "local")
    procs = [start(cmd) for _ in range(2)]
    results = [parse(finished(p, cmd), per_rank_scores=False) for p in procs]
    return sum(r[0] for r in results), float(np.mean([r[1] for r in results]))


def parse(stdout: str, per_rank_scores: bool) -> tuple[float, float]:
    frames: dict[int, float] = {}
    seconds: dict[int, float] = {}
    percents = []
    for rank, epoch, _, percent in EPOCH_LINE.findall(stdout):
        if int(epoch) > 1:
            percents.append(float(percent))
    for rank, epoch, per_sec, n, _ in FRAMES_LINE.findall(stdout):
        if int(epoch) > 1:
            r = int(rank or 0)
            frames[r] = frames.get(r, 0.0) + float(n)
            seconds[r] = seconds.get(r, 0.0) + float(n) / float(per_sec)
    # Train scores (and frames) are global in grad and shard mode, so rank 0 speaks for all; in
    # param + random_seed_offset each rank reports its own, so the ranks' rates add up.
    rate = sum(frames[r] / seconds[r] for r in frames) if per_rank_scores else frames[0] / seconds[0]
    return rate, float(np.mean(percents))


def scaling_rows(config: str, backends: list[str]) -> None:
    rows = []
    base_rate, base_pct = run(config, 1, [], "local")
    rows.append(("1 rank", "-", base_rate, base_pct))
    rate, pct = run_two_independent(config)
    rows.append(("2 independent 1-rank runs at once (ceiling)", "-", rate, pct))
    for backend in backends:
        for name, ranks, overrides in RUNS:
            rate, pct = run(config, ranks, overrides, backend)
            rows.append((f"{ranks} ranks {name}", backend, rate, pct))
    print(f"{'run':<42} {'backend':<8} {'frames/s':>10} {'speed-up':>9} {'computing':>10}")
    for name, backend, rate, pct in rows:
        print(f"{name:<42} {backend:<8} {rate:>10.0f} {rate / base_rate:>8.2f}x {pct:>9.1f}%")


def monitoring_rows(config: str, backend: str, runs: int, tmp: str) -> None:
    """Everything on against everything off (module docstring), ``runs`` of each, taking turns; and a
    second set of "off" runs, whose ratio to the first shows how far identical runs differ here."""
    states = ("on", "off", "off again")
    rates: dict[str, list[float]] = {state: [] for state in states}
    for i in range(runs):
        for state in states[i % 3:] + states[:i % 3]:  # each state first, second and third in turn
            out = os.path.join(tmp, f"{backend}-{state.replace(' ', '-')}-{i}")
            overrides = ["++horovod_reduce_type", "grad", "++model", os.path.join(out, "model")]
            if state == "on":
                overrides += ["++timeline_file", os.path.join(out, "timeline.json")]
            else:
                overrides += ["++tensorboard", "0"]
            rates[state].append(run(config, 2, overrides, backend)[0])
    print(f"2 ranks grad, {backend} backend, {runs} runs each, frames/s:")
    for state, what in zip(states, ("everything on (defaults)", "everything off", "everything off, again")):
        print(f"  {what:<26} median {np.median(rates[state]):>8.0f}   range {min(rates[state]):.0f}-"
              f"{max(rates[state]):.0f}")
    for state, baseline, what in (("on", "off", "on / off"), ("off again", "off", "off again / off (noise)")):
        pairs = [a / b for a, b in zip(rates[state], rates[baseline])]
        print(f"  {what}: {np.median(rates[state]) / np.median(rates[baseline]):.3f} (medians); run by run "
              f"median {np.median(pairs):.3f}, range {min(pairs):.3f}-{max(pairs):.3f}")
    spans_per_step, step_ms = timeline_load(os.path.join(tmp, f"{backend}-on-0", "timeline.json"))
    costs = {state: micros for state, body, micros in span_costs(20000, 3)[0] if body == "record"}
    extra = costs["on"] - costs["off"]
    per_step = spans_per_step * extra
    in_graph = ""
    if backend == "horovod":  # the allreduce's span leaves the compiled step through a numpy_function
        graph_costs = in_graph_cost(1000, 3, tmp)
        per_step += graph_costs["on"] - graph_costs["off"]
        in_graph = f" + {graph_costs['on'] - graph_costs['off']:.1f} us for the in-graph span"
    print(f"  timeline: {spans_per_step:.1f} spans a step on rank 0, steps of {step_ms:.1f} ms (median); "
          f"{spans_per_step:.1f} x {extra:.1f} us a span more than with it off{in_graph}: "
          f"{100 * per_step / (1000 * step_ms):.3f}% of a step")


def timeline_load(path: str) -> tuple[float, float]:
    """(spans per train step, median milliseconds from one step's start to the next) of rank 0, from a
    run's merged timeline."""
    with open(path) as f:
        spans = [e for e in json.load(f) if e["ph"] == "X" and e["pid"] == 0]
    starts = sorted(e["ts"] for e in spans if e["cat"] == "step")
    return len(spans) / len(starts), float(np.median(np.diff(starts))) / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, default=600)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--backends", default="horovod,mpi")
    parser.add_argument("--rows", choices=["all", "scaling", "monitoring"], default="all")
    parser.add_argument("--monitoring-runs", type=int, default=3)
    args = parser.parse_args()
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.hdf")
        make_corpus(corpus, args.seqs)
        config = os.path.join(tmp, "bench.py")
        with open(config, "w") as f:
            f.write(CONFIG.format(corpus=corpus, epochs=args.epochs))
        print(f"corpus: {args.seqs} seqs, {os.path.getsize(corpus) / 1e6:.1f} MB; 2x128 LSTM, "
              f"batch_size 5000, max_seqs 40, Adam, 1 TF thread per rank; epochs 2..{args.epochs} measured")
        if args.rows in ("all", "scaling"):
            scaling_rows(config, backends)
        if args.rows in ("all", "monitoring"):
            for backend in backends:
                monitoring_rows(config, backend, args.monitoring_runs, tmp)


if __name__ == "__main__":
    main()
