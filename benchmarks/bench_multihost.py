#!/usr/bin/env python3
"""Data-parallel training where the network is the bottleneck: 2 simulated hosts (network namespaces
joined by a veth pair, ``tests/cluster/simulated_hosts.py``), one rank each, on a link limited by
``tc tbf`` to 100 Mbit/s and 1 Gbit/s. Run as root (namespaces and tc need it):

    .venv/bin/python benchmarks/bench_multihost.py [--links 100mbit,1gbit] [--models small,large]
        [--runs 3] [--rows REGEX] [--quick] [--allreduce-only] [--full]

Models: "small", 2 LSTM layers of 128 units (0.9 MB of gradients), and "large", 4 BLSTM layers of 512
units (85 MB), input dim 40, 50 classes, generated data (``DummyDataset``), Adam. The batch keeps a
step of the large model near a second on one core.

How a row is timed. rnn.py runs with ``log_verbosity 5``, so rank 0 prints a line after every step;
the benchmark stamps the lines as they arrive. One run of a row covers every link in turn: after a
warm-up (the first steps trace the graph) the benchmark sets the link's rate (``tc qdisc replace``)
when step b's line arrives and takes the wall time from line b to line b+S as S steps on that link
(the rate changes while step b+1 computes, before it sends anything). Segments are multiples of the
row's period (accumulation groups, parameter syncs), so each holds the same share of reductions. The
first segment is on the unlimited veth link: its step time is the row's compute-only time (both ranks
computing on this machine, with a reduction that costs little there). Bytes on the wire: what each
host's end of the link sent during the segment (``ip -s link``), per step, the mean of the two hosts.
Every row runs ``--runs`` times (rows take turns); each figure is the median with the range.

Speed-up: 2 ranks each train on a batch of their own, so speed-up = 2 x (best single-process step
time) / (2-rank step time); the single process trains the same per-rank batch with 1 and 2 threads.
The allreduce alone: the engine's mpi communicator reduces the model's gradient shapes (a
``tf.function`` around ``allreduce_tensors``, as the training step does) in a small mpirun'd worker;
bus bandwidth = bytes x 2(n-1)/n / time.

A row whose config key the engine refuses (a feature not in this checkout) prints "n/a" with the
engine's reason. Verdicts (``timing.compare``): both sides' medians and ranges; PASS or MISS only where
the ranges are apart, else INCONCLUSIVE; FAIL, naming the row, where a row the verdict needs failed or
was refused (for engine vs Horovod: any tagged row of either side).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from timing import ROOT, Row, Side, child_env, compare  # the script's own directory is on sys.path

sys.path.insert(0, os.path.join(ROOT, "tests"))
from cluster.simulated_hosts import AGENT, SUBNET, SimulatedHosts  # noqa: E402

from bench_allreduce import lstm_shapes  # noqa: E402

LINKS = {"100mbit": 100e6, "1gbit": 1e9}
UNLIMITED = "unlimited"
STEP_LINE = re.compile(r"^train epoch 1, step (\d+),")
TCP_PORT = 5201


@dataclass(frozen=True)
class Model:
    title: str
    layers: int
    units: int
    directions: int
    seq_len: int
    max_seqs: int
    segment: int  # steps per link segment in grad mode

    @property
    def shapes(self) -> list[tuple]:
        return lstm_shapes(40, self.units, self.layers, 50, self.directions)

    @property
    def grad_bytes(self) -> int:
        return 4 * sum(int(np.prod(s)) for s in self.shapes)

    def config(self, num_seqs: int) -> str:
        return CONFIG.format(num_seqs=num_seqs, seq_len=self.seq_len, max_seqs=self.max_seqs,
                             layers=self.layers, units=self.units,
                             directions=[1] if self.directions == 1 else [1, -1])


MODELS = {
    "small": Model("2-layer LSTM 128", 2, 128, 1, seq_len=100, max_seqs=20, segment=10),
    "large": Model("4-layer BLSTM 512", 4, 512, 2, seq_len=50, max_seqs=2, segment=3),
}
CONFIG = """
task = "train"
train = {{"class": "DummyDataset", "input_dim": 40, "output_dim": 50, "num_seqs": {num_seqs},
          "seq_len": {seq_len}}}
batch_size = 1000000
max_seqs = {max_seqs}
network = {{}}
_src = "data"
for _i in range({layers}):
    _names = []
    for _d in {directions}:
        _names.append(f"lstm{{_i}}_{{_d}}")
        network[_names[-1]] = {{"class": "rec", "unit": "NativeLstm2", "n_out": {units}, "direction": _d,
                                "from": _src}}
    _src = _names
network["output"] = {{"class": "softmax", "loss": "ce", "from": _src}}
optimizer = {{"class": "adam"}}
learning_rate = 0.001
num_epochs = 1
log_verbosity = 5
"""


@dataclass(frozen=True)
class Setting:
    """One row: rnn.py overrides and environment; ``period``: steps between reductions."""

    name: str
    overrides: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    period: int = 1
    ranks: int = 2
    threads: int | None = 1  # None: the engine's default threading
    backend: str = "mpi"
    tag: str = ""  # "engine" or "horovod": the rows the 100 Mbit/s verdict compares

    def argv(self) -> list[str]:
        if self.ranks == 1:
            return list(self.overrides)
        mode = [] if "++horovod_reduce_type" in self.overrides else ["++horovod_reduce_type", "grad"]
        return ["++use_horovod", "1", "++distributed_backend", self.backend, *mode, *self.overrides]


NO_OVERLAP = ("++distributed_bucket_mb", "0")
BUCKET_1 = ("++distributed_bucket_mb", "1")
FP16 = ("++distributed_wire_format", "fp16")
BF16 = ("++distributed_wire_format", "bf16")
ACCUM = ("++accum_grad_multiple_step", "4")
PARAM_OVERLAP = ("++distributed_param_sync_overlap", "1")
# Horovod tuned: its background thread wakes every 1 ms (default 5) and fuses up to 128 MB (default 64);
# HVD_CYCLE alone keeps the fusion threshold the engine sets from distributed_bucket_mb (buckets.py)
HVD_CYCLE = (("HOROVOD_CYCLE_TIME", "1"),)
HVD_TUNED = (("HOROVOD_FUSION_THRESHOLD", str(128 * 2**20)), *HVD_CYCLE)


def param(sync: int) -> tuple[str, ...]:
    return ("++horovod_reduce_type", "param", "++horovod_param_sync_step", str(sync))


def settings(model: str, full: bool) -> list[Setting]:
    """The rows of one model; ``full``: also the ones marked ``extra``. The default set keeps the
    benchmark near 30 minutes: every feature alone and combined on the large model (the targets are
    about it), the backends and param mode on the small one. Param mode: a sync every 10 steps on the
    large model, 20 on the small one (10, 20 and 50 with ``full``), with and without overlap.
    Tags: "engine" and "horovod" mark the synchronous grad-mode rows without accumulation, which the
    engine-vs-Horovod verdict compares (like for like: the same update every step). Each side gets the
    same choices: buckets (the engine's Horovod backend reduces each bucket in a grouped allreduce of its
    own, overlapped with the backward pass), fp16 on the wire, and for Horovod its tuned cycle time and
    fusion threshold; the verdict takes each side's best row."""
    large = model == "large"
    rows = [
        (Setting("1 process, engine default threading", ranks=1, threads=None), False),
        (Setting("1 process, 1 thread", ranks=1, threads=1), not large),
        (Setting("grad, mpi, no overlap (bucket 0)", NO_OVERLAP, tag="engine"), False),
        (Setting("grad, mpi, default (25 MB buckets)", tag="engine"), False),
        (Setting("grad, mpi, bucket 1 MB", BUCKET_1, tag="engine"), False),
        (Setting("grad, mpi, fp16", FP16, tag="engine"), not large),
        (Setting("grad, mpi, fp16, bucket 1 MB", FP16 + BUCKET_1, tag="engine"), not large),
        (Setting("grad, mpi, bf16", BF16, tag="engine"), True),
        (Setting("grad, horovod, no overlap (bucket 0)", NO_OVERLAP, backend="horovod", tag="horovod"), True),
        (Setting("grad, horovod, default (25 MB buckets)", backend="horovod", tag="horovod"), False),
        (Setting("grad, horovod, bucket 1 MB, cycle 1ms", BUCKET_1, backend="horovod", env=HVD_CYCLE,
                 tag="horovod"), True),
        (Setting("grad, horovod, no overlap, fusion 128MB cycle 1ms + fp16", NO_OVERLAP + FP16,
                 backend="horovod", env=HVD_TUNED, tag="horovod"), not large),
        (Setting("grad, horovod, 25 MB buckets, cycle 1ms + fp16", FP16, backend="horovod", env=HVD_CYCLE,
                 tag="horovod"), not large),
        (Setting("grad, horovod, bucket 1 MB, cycle 1ms + fp16", BUCKET_1 + FP16, backend="horovod",
                 env=HVD_CYCLE, tag="horovod"), not large),
        (Setting("grad, mpi, accum 4", ACCUM, period=4), not large),
        (Setting("grad, mpi, fp16 + accum 4", FP16 + ACCUM, period=4), not large),
    ]
    syncs = {s: False for s in ((10,) if large else (20,))}
    syncs.update({s: True for s in (10, 20, 50) if s not in syncs})
    for s, extra in sorted(syncs.items()):
        rows += [(Setting(f"param, sync every {s}", param(s), period=s), extra),
                 (Setting(f"param, sync every {s}, overlapped", param(s) + PARAM_OVERLAP, period=s), extra)]
    return [setting for setting, extra in rows if full or not extra]


# ----------------------------------------------------------------------------------------------------
# The link: its measured rate


def tcp_receive(port: int) -> None:
    """Accept one connection, read to its end, answer with the byte count (run in host 1)."""
    with socket.create_server(("", port)) as server:
        print("listening", flush=True)
        conn, _ = server.accept()
        with conn:
            received = 0
            while chunk := conn.recv(1 << 20):
                received += len(chunk)
            conn.sendall(str(received).encode())


def tcp_send(address: str, port: int, count: int) -> None:
    """Send ``count`` bytes and print bits/s, timed until the receiver confirms them all (host 0)."""
    block = b"\0" * (1 << 20)
    with socket.create_connection((address, port), timeout=60) as conn:
        start = time.perf_counter()
        for offset in range(0, count, len(block)):
            conn.sendall(block[:count - offset])
        conn.shutdown(socket.SHUT_WR)
        received = int(conn.recv(64).decode())
        seconds = time.perf_counter() - start
    print(json.dumps({"bytes": received, "seconds": seconds, "bits_per_s": received * 8 / seconds}))


def measure_link(hosts: SimulatedHosts, count: int) -> float:
    """The link's rate in bits/s: ``count`` bytes over TCP from host 0 to host 1."""
    me = [sys.executable, os.path.abspath(__file__)]
    receiver = subprocess.Popen(hosts.command_on(1, me + ["--tcp-receive", str(TCP_PORT)]),
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        receiver.stdout.readline()  # "listening"
        sent = subprocess.run(hosts.command_on(0, me + ["--tcp-send", hosts.hosts[1].address, str(TCP_PORT),
                                                        str(count)]), capture_output=True, text=True,
                              timeout=300)
        if sent.returncode != 0:
            raise RuntimeError(f"the TCP sender failed: {sent.stderr.strip()}")
        return float(json.loads(sent.stdout)["bits_per_s"])
    finally:
        receiver.wait(timeout=60)


def set_link(hosts: SimulatedHosts, link: str) -> None:
    if link == UNLIMITED:
        hosts.unlimit_rate()
    else:
        hosts.limit_rate(LINKS[link])


# ----------------------------------------------------------------------------------------------------
# Running the ranks


def mpirun_two_hosts(hosts: SimulatedHosts, program: list[str], env_names: Sequence[str]) -> list[str]:
    """``mpirun`` of ``program`` with one rank on each simulated host, MPI's traffic on their link."""
    forwarded = [arg for name in env_names for arg in ("-x", name)]
    mpirun = [os.path.join(os.path.dirname(sys.executable), "mpirun"), "-np", "2", "--host",
              ",".join(f"{h.address}:1" for h in hosts.hosts), "--bind-to", "none", "--map-by", "slot",
              "--prtemca", "plm_ssh_agent", str(AGENT), "--prtemca", "oob_tcp_if_include", SUBNET,
              "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", SUBNET,
              *forwarded, *program]
    return hosts.command_on(0, mpirun)


def rank_env(hosts: SimulatedHosts | None, threads: int | None,
             extra: Sequence[tuple[str, str]] = ()) -> dict:
    env = child_env(threads, dict(extra))
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if hosts is not None:
        env["SIMULATED_HOSTS"] = hosts.agent_map
    return env


def forwarded_names(env: dict) -> list[str]:
    return [name for name in env if name in ("PYTHONPATH", "PYTHONUNBUFFERED", "TF_CPP_MIN_LOG_LEVEL")
            or name.startswith(("TF_NUM_", "HOROVOD_", "OMPI_MCA_"))]


@dataclass
class Segment:
    link: str
    seconds: float
    steps: int
    sent: float  # bytes per host, the mean of the two hosts


class Refused(Exception):
    """rnn.py refused the row's config (a key this checkout does not know): the row is n/a."""


class Failed(Exception):
    """A run failed otherwise: the row is FAIL."""


def unknown_key(line: str, setting: Setting) -> bool:
    """Whether ``line`` is the engine's warning that one of the row's keys is not a key it knows."""
    # [^:]*: the engine's hint for a near name, "(did you mean 'distributed_backend'?)"
    match = re.search(r"config key '(\w+)'[^:]*: not a key of this engine", line, re.I)
    return bool(match) and f"++{match.group(1)}" in setting.overrides


def engine_reason(text: str) -> str:
    """The engine's one-line reason for refusing a config: its error line."""
    for line in text.splitlines():
        if re.search(r"(ConfigError|error:)", line):
            return line.strip()[:300]
    return text.strip().splitlines()[-1][:300] if text.strip() else "no output"


def segment_plan(setting: Setting, model: Model, links: int) -> tuple[int, int, int]:
    """(warm-up steps, steps per link segment, steps in all): whole periods of the row (accumulation
    groups, parameter syncs), so every segment holds the same number of reductions."""
    steps = setting.period * max(1, -(-model.segment // setting.period))
    warmup = setting.period * max(1, -(-2 // setting.period))  # at least 2: the first step traces
    return warmup, steps, warmup + steps * links


def train_segments(setting: Setting, model: Model, links: list[str], hosts: SimulatedHosts,
                   tmp: str) -> list[Segment]:
    """One run of ``setting``: a warm-up, then one segment per link (``links``, the first one the
    compute-only link). Raises Refused or Failed."""
    warmup, steps, total = segment_plan(setting, model, len(links))
    config = os.path.join(tmp, f"{model.title.replace(' ', '_')}-{total}.py")
    with open(config, "w") as f:
        f.write(model.config(total * model.max_seqs * setting.ranks))
    env = rank_env(hosts if setting.ranks > 1 else None, setting.threads, setting.env)
    program = [sys.executable, os.path.join(ROOT, "rnn.py"), config, *setting.argv()]
    cmd = program if setting.ranks == 1 else mpirun_two_hosts(hosts, program, forwarded_names(env))
    starts = {warmup + i * steps: link for i, link in enumerate(links)}
    ends = {warmup + (i + 1) * steps for i in range(len(links))}
    segments, lines, opened = [], [], None
    set_link(hosts, links[0]) if setting.ranks > 1 else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=tmp, start_new_session=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if unknown_key(line, setting):  # the engine warns and would train without the feature
                raise Refused(line.strip())
            match = STEP_LINE.match(line)
            if not match:
                continue
            step, now = int(match.group(1)), time.perf_counter()
            if step in ends and opened is not None:
                link, t0, sent0 = opened
                sent = hosts.tx_bytes() if setting.ranks > 1 else [0, 0]
                segments.append(Segment(link, now - t0, steps, statistics.mean(sent) -
                                        statistics.mean(sent0)))
                opened = None
            if step in starts:
                if setting.ranks > 1:
                    set_link(hosts, starts[step])
                sent0 = hosts.tx_bytes() if setting.ranks > 1 else [0, 0]
                opened = (starts[step], now, sent0)  # from the line: the next step runs during the switch
            elif step == max(ends) and setting.ranks > 1:
                set_link(hosts, UNLIMITED)  # the epoch's end (final syncs) on the fast link
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: mpirun or rnn.py and their children
            proc.wait()
        if setting.ranks > 1:
            hosts.kill_processes()
            hosts.unlimit_rate()
    text = "\n".join(lines)
    if proc.returncode != 0:
        if any(f"'{key[2:]}'" in text for key in setting.overrides if key.startswith("++")) and \
                re.search(r"ConfigError|config key", text, re.I):
            raise Refused(engine_reason(text))
        raise Failed(f"exit {proc.returncode}: {text[-1500:]}")
    if len(segments) != len(links):
        raise Failed(f"{len(segments)} of {len(links)} segments timed:\n{text[-1500:]}")
    return segments


# ----------------------------------------------------------------------------------------------------
# The allreduce alone


def allreduce_worker(models: list[str], reps: int, wires: list[str]) -> None:
    """In each of the 2 ranks: the engine's mpi communicator reduces each model's gradient shapes in
    float32, fp16 and bf16 on the wire; rank 0 prints one JSON line per (model, wire)."""
    import numpy as np
    import tensorflow as tf

    from engine.distributed import create_communicator

    comm = create_communicator("mpi")  # first: it sets Open MPI's defaults before MPI starts (ring.py)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    for key in models:
        model = MODELS[key]
        rng = np.random.default_rng(world.Get_rank())
        tensors = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in model.shapes]
        fns, results = {}, {}
        for wire in wires:
            kwargs = {} if wire == "float32" else {"wire": wire}
            results[wire] = {"model": key, "wire": wire, "bytes": model.grad_bytes}
            try:
                fns[wire] = tf.function(lambda kw=kwargs: comm.allreduce_tensors(tensors, "sum", **kw))
                fns[wire]()  # warm-up: tracing, buffers
            except TypeError as exc:
                last = str(exc).strip().splitlines()[-1]  # autograph's message ends with the TypeError
                results[wire]["refused"] = f"allreduce_tensors refuses wire={wire!r}: {last}"
                fns.pop(wire, None)
        for rep in range(reps):  # interleaved: each repetition runs every wire, the order reversed
            for wire in (list(fns) if rep % 2 == 0 else list(fns)[::-1]):
                world.Barrier()
                start = time.perf_counter()
                fns[wire]()
                results[wire].setdefault("times", []).append(
                    world.allreduce(time.perf_counter() - start, op=MPI.MAX))
        if world.Get_rank() == 0:
            for result in results.values():
                print("ALLREDUCE " + json.dumps(result), flush=True)


# Between hosts the engine reduces around a ring of its own (engine/distributed/ring.py); this information
# row is Open MPI's MPI_Allreduce instead, in the same 1 MiB segments as on one host
OPEN_MPI_ALLREDUCE = (("ENGINE_ALLREDUCE", "mpi"),)


def allreduce_alone(hosts: SimulatedHosts, link: str, models: list[str], reps: int,
                    mpi_env: Sequence[tuple[str, str]] = (), wires: str = "float32,fp16,bf16") -> list[dict]:
    set_link(hosts, link)
    env = rank_env(hosts, 1, mpi_env)
    program = [sys.executable, os.path.abspath(__file__), "--allreduce-worker", ",".join(models),
               "--reps", str(reps), "--wires", wires]
    try:
        done = subprocess.run(mpirun_two_hosts(hosts, program, forwarded_names(env)), env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
    finally:
        hosts.kill_processes()
        hosts.unlimit_rate()
    results = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
               if line.startswith("ALLREDUCE ")]
    if done.returncode != 0 or not results:
        sys.exit(f"the allreduce worker failed (exit {done.returncode}):\n"
                 f"{(done.stdout + done.stderr)[-3000:]}")
    return results


# ----------------------------------------------------------------------------------------------------
# The benchmark


@dataclass
class Measured:
    setting: Setting
    runs: list[list[Segment]] = field(default_factory=list)
    refused: str = ""
    failure: str = ""

    def row(self, link: str, what: str = "seconds") -> Row:
        """The figures of one link as a ``timing.Row``: step seconds or bytes sent per step."""
        row = Row(f"{self.setting.name} @ {link}", lambda: 0.0, failure=self.failure or self.refused)
        for segments in self.runs:
            for s in segments:
                if s.link == link:
                    row.values.append(s.seconds / s.steps if what == "seconds" else s.sent / s.steps)
        if not row.values and not row.failed:
            row.failure = "no run"
        return row

    def status(self) -> str:
        return f"n/a: {self.refused}" if self.refused else f"FAIL: {self.failure}" if self.failure else ""


def run_rows(model_key: str, rows: list[Setting], links: list[str], runs: int, hosts: SimulatedHosts,
             tmp: str) -> dict[str, Measured]:
    model = MODELS[model_key]
    measured = {s.name: Measured(s) for s in rows}
    for round_ in range(runs):
        order = rows if round_ % 2 == 0 else list(reversed(rows))
        for setting in order:
            m = measured[setting.name]
            if m.refused or m.failure:
                continue
            row_links = [UNLIMITED] if setting.ranks == 1 else [UNLIMITED, *links]
            t0 = time.perf_counter()
            try:
                m.runs.append(train_segments(setting, model, row_links, hosts, tmp))
                note = "  ".join(f"{s.link} {s.seconds / s.steps:.3f}s" for s in m.runs[-1])
            except Refused as exc:
                m.refused, note = str(exc), f"n/a: {exc}"
            except Failed as exc:
                m.failure, note = str(exc).splitlines()[0], f"FAIL: {exc}"
            print(f"  round {round_ + 1}/{runs}: {model_key}: {setting.name}: {note} "
                  f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    return measured


def fmt_range(row: Row, scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    if row.failed:
        return "-"
    low, high = (fmt.format(v * scale) for v in (min(row.values), max(row.values)))
    return f"{fmt.format(row.median * scale)} ({low}..{high})"


def best_single(measured: dict[str, Measured]) -> tuple[str, float]:
    singles = [(m.row(UNLIMITED).median, name) for name, m in measured.items()
               if m.setting.ranks == 1 and not m.status()]
    if not singles:
        return "none", float("nan")
    seconds, name = min(singles)
    return name, seconds


def report_model(model_key: str, measured: dict[str, Measured], links: list[str]) -> None:
    model = MODELS[model_key]
    single_name, single = best_single(measured)
    print(f"\n{model.title} ({model.grad_bytes / 1e6:.1f} MB of gradients, {model.max_seqs} seqs x "
          f"{model.seq_len} frames per rank and step); best single process: {single_name}, "
          f"{single:.3f} s/step")
    print("  s/step: wall time between rank 0's step lines on that link, median of the runs (min..max);\n"
          "  compute-only: the same runs' steps on the unlimited veth link (both ranks computing, the "
          "reduction nearly free);\n  speed-up: 2 x best single / 2-rank step; MB sent: per host and step, "
          "from the link's byte counters")
    print(f"  {'row':44} {'link':9} {'s/step median (min..max)':>27} {'compute-only s/step':>20} "
          f"{'speed-up':>8} {'MB sent/step/host':>18}")
    for name, m in measured.items():
        if m.status():
            print(f"  {name:44} {m.status()}")
            continue
        compute = m.row(UNLIMITED)
        for link in ([UNLIMITED] if m.setting.ranks == 1 else links):
            row = m.row(link)
            speedup = m.setting.ranks * single / row.median
            print(f"  {name:44} {link:9} {fmt_range(row):>27} {fmt_range(compute):>20} {speedup:>7.2f}x "
                  f"{fmt_range(m.row(link, 'bytes'), 1e-6, '{:.2f}'):>18}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", default="100mbit,1gbit", help="comma-separated: " + ", ".join(LINKS))
    parser.add_argument("--models", default="small,large", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--runs", type=int, default=3, help="runs per row (rows take turns), and "
                        "repetitions of each allreduce; default 3, the fewest a verdict decides on")
    parser.add_argument("--rows", default="", help="only rows whose name matches this regular expression "
                        "(the single-process rows always run)")
    parser.add_argument("--full", action="store_true", help="all rows (bf16, more Horovod settings, "
                        "param sync 10/20/50 on both models, every feature alone on the small model)")
    parser.add_argument("--quick", action="store_true", help="1 run per row, the allreduce 1 repetition "
                        "(every verdict then says INCONCLUSIVE)")
    parser.add_argument("--no-allreduce", action="store_true", help="skip the allreduce-alone rows")
    parser.add_argument("--no-quality", action="store_true", help="skip the wire-format quality runs")
    parser.add_argument("--allreduce-only", action="store_true", help="only the link rates and the "
                        "allreduce-alone rows (no training rows, no quality runs)")
    parser.add_argument("--allreduce-worker", help=argparse.SUPPRESS)
    parser.add_argument("--wires", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--tcp-receive", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tcp-send", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.allreduce_worker:
        return allreduce_worker(args.allreduce_worker.split(","), args.reps, args.wires.split(","))
    if args.tcp_receive:
        return tcp_receive(args.tcp_receive)
    if args.tcp_send:
        return tcp_send(args.tcp_send[0], int(args.tcp_send[1]), int(args.tcp_send[2]))

    reason = ("it needs root (network namespaces and tc)" if os.geteuid() != 0 else
              SimulatedHosts.unavailable() or SimulatedHosts.tc_unavailable())
    if reason:
        print(f"bench_multihost: skipped: {reason}")
        return
    links = [link for link in args.links.split(",") if link]
    models = [m for m in args.models.split(",") if m]
    runs = 1 if args.quick else args.runs
    started = time.perf_counter()
    with SimulatedHosts.create() as hosts, tempfile.TemporaryDirectory(prefix="bench_multihost-") as tmp:
        rates = {}
        for link in [UNLIMITED, *links]:
            set_link(hosts, link)
            count = 50_000_000 if link == "100mbit" else 200_000_000
            rates[link] = measure_link(hosts, count)
            limit = (f"; tc tbf rate {LINKS[link] / 1e6:.0f} Mbit/s, "
                     f"{100 * rates[link] / LINKS[link]:.1f}% of it)" if link in LINKS else ")")
            print(f"link {link}: measured {rates[link] / 1e6:.1f} Mbit/s (TCP, {count / 1e6:.0f} MB from "
                  f"host 0 to host 1{limit}", flush=True)
        hosts.unlimit_rate()
        alone = {}
        if not args.no_allreduce:
            for link in links:
                reps = runs
                for result in allreduce_alone(hosts, link, models, reps):
                    alone[(result["model"], link, result["wire"])] = result
                for result in allreduce_alone(hosts, link, models, reps, OPEN_MPI_ALLREDUCE, "float32"):
                    alone[(result["model"], link, "float32, Open MPI's MPI_Allreduce")] = result
            report_allreduce(alone, rates)
        measured = {}
        for key in ([] if args.allreduce_only else models):
            rows = [s for s in settings(key, args.full) if s.ranks == 1 or re.search(args.rows, s.name)]
            measured[key] = run_rows(key, rows, links, runs, hosts, tmp)
            report_model(key, measured[key], links)
    print()
    for line in verdicts(measured, alone, rates, links):
        print(line)
    if not (args.no_quality or args.allreduce_only):
        quality(args.quick)
    print(f"\nbench_multihost: {(time.perf_counter() - started) / 60:.1f} min")


def report_allreduce(alone: dict, rates: dict) -> None:
    print("\nallreduce alone (engine mpi communicator, tf.function around allreduce_tensors, 2 ranks on 2 "
          "hosts): median (min..max) s, bus bandwidth = bytes x 2(n-1)/n / time (fp16, bf16: the float32 "
          "bytes they stand for)")
    for (model, link, wire), r in alone.items():
        if "refused" in r:
            print(f"  {MODELS[model].title:20} {link:8} {wire:38} n/a: {r['refused']}")
            continue
        t = statistics.median(r["times"])
        bus = r["bytes"] * 8 / t  # 2(n-1)/n = 1 for n = 2
        print(f"  {MODELS[model].title:20} {link:8} {wire:38} {t:.3f} ({min(r['times']):.3f}.."
              f"{max(r['times']):.3f}) s  bus {bus / 1e6:.1f} Mbit/s = {100 * bus / rates[link]:.1f}% "
              "of the link")


def alone_side(alone: dict, model: str, link: str, wire: str) -> Side | None:
    """The allreduce-alone times of (model, link, wire) as a verdict side; None when not measured (a
    wire the communicator refuses is a failed side)."""
    r = alone.get((model, link, wire))
    if r is None:
        return None
    name = f"allreduce {wire} s"
    return Side(name, tuple(r["times"])) if "times" in r else Side(name, (), r.get("refused", "no run"))


def verdicts(measured: dict, alone: dict, rates: dict, links: list[str]) -> list[str]:
    """One line per target of issue 20 (the quality target is ``quality``'s), each by ``timing.compare``:
    medians with ranges, INCONCLUSIVE where the ranges overlap."""
    large = measured.get("large", {})
    out = [allreduce_verdict(alone, rates, link) for link in links]
    out.append(overlap_verdict(large, alone, links))
    for link in links:
        f32, f16 = alone_side(alone, "large", link, "float32"), alone_side(alone, "large", link, "fp16")
        if f32 is None or f16 is None:
            out.append(f"n/a: fp16 on the wire, {link}: not measured (--models/--no-allreduce)")
            continue
        ratio = f32.median / f16.median if not (f32.failed or f16.failed) else float("nan")
        out.append(compare(f32, f16, f"fp16 on the wire, {link}, large model: the allreduce {ratio:.2f}x "
                           "faster than float32 (target >= 1.8x: float32's time >= 1.8 x fp16's)",
                           better="higher", factor=1.8))
    if "100mbit" in links and large:
        out.append(horovod_verdict(large))
    for key, rows in measured.items():
        single_name, _ = best_single(rows)
        for name, m in rows.items():
            if not name.startswith("param") or "100mbit" not in links:
                continue
            if m.refused:
                out.append(f"n/a: {key}: {name} at 100mbit: {m.status()}")
                continue
            step = Side.of(m.row("100mbit"), name=f"'{name}' s/step")
            single = Side.of(rows[single_name].row(UNLIMITED), name=f"'{single_name}' s/step") \
                if single_name in rows else Side("best single process", (), "no single-process row")
            speedup = 2 * single.median / step.median if not (step.failed or single.failed) else float("nan")
            out.append(compare(step, single, f"{MODELS[key].title}: {name} at 100mbit: {speedup:.2f}x the "
                               "best single process (target >= 1.8x: the step <= 2/1.8 x the single "
                               "process's)", better="lower", factor=2 / 1.8))
    return out


def allreduce_verdict(alone: dict, rates: dict, link: str) -> str:
    """The 100 MB allreduce reaches >= 85% of the link's measured rate (bus bandwidth): its times against
    the time that 85% would take."""
    side = alone_side(alone, "large", link, "float32")
    if side is None:
        return f"n/a: allreduce of the large model on {link}: not measured (--models/--no-allreduce)"
    mb, bits = MODELS["large"].grad_bytes / 1e6, MODELS["large"].grad_bytes * 8
    bus = f"{100 * bits / side.median / rates[link]:.1f}%" if not side.failed else "FAIL"
    low_high = f" ({100 * bits / side.high / rates[link]:.1f}..{100 * bits / side.low / rates[link]:.1f}%)" \
        if not side.failed else ""
    return compare(side, Side.target("85% of the link's time s", bits / (0.85 * rates[link])),
                   f"allreduce of {mb:.0f} MB on {link}: bus bandwidth {bus}{low_high} of the measured "
                   f"{rates[link] / 1e6:.1f} Mbit/s (target >= 85%)", better="lower")


def overlap_verdict(large: dict, alone: dict, links: list[str]) -> str:
    """On the link where the reduction alone takes about as long as the compute: a bucketed grad step
    takes at most 1.15 x max(compute, reduction)."""
    grad = large.get("grad, mpi, no overlap (bucket 0)")
    buckets = [m for name, m in large.items() if name.startswith("grad, mpi, ") and "bucket" in name
               and "fp16" not in name and m is not grad and not m.refused]
    if grad is None or not buckets or grad.refused:
        return "n/a: overlap target: needs the large model's 'no overlap' row and a bucket row"
    if grad.failure:
        return compare(Side.of(grad.row(UNLIMITED)), Side("-", (0.0,)), "overlap target")
    compute = Side.of(grad.row(UNLIMITED), name="compute-only s/step")
    sides = {link: alone_side(alone, "large", link, "float32") for link in links}
    sides = {link: side for link, side in sides.items() if side is not None and not side.failed}
    if not sides:
        return "n/a: overlap target: no allreduce-alone time"
    link = min(sides, key=lambda k: abs(sides[k].median / compute.median - 1))
    reduction = sides[link]
    larger = max(compute, reduction, key=lambda side: side.median)
    failed = [m for m in buckets if m.failure]
    if failed:  # a bucket row that failed is not left out of "the best bucket row"
        return compare(Side.of(failed[0].row(link)), larger, f"overlap on {link}", better="lower",
                       factor=1.15)
    bucket = min(buckets, key=lambda m: m.row(link).median)
    step = Side.of(bucket.row(link), name=f"'{bucket.setting.name}' s/step")
    return compare(step, larger, f"overlap on {link}, large model: the bucketed step "
                   f"{step.median / larger.median:.2f}x the larger of compute-only ({compute.median:.3f}s) "
                   f"and the reduction alone ({reduction.median:.3f}s) (target <= 1.15x); without buckets "
                   f"{grad.row(link).median:.3f}s/step", better="lower", factor=1.15)


def horovod_verdict(large: dict) -> str:
    """100 Mbit/s, large model: the engine's best row is faster than Horovod's best row. Every tagged row
    counts: one that failed or was refused makes the verdict FAIL, naming it (a side's best row is only
    its best when every row of it was measured)."""
    tagged = {tag: [m for m in large.values() if m.setting.tag == tag] for tag in ("engine", "horovod")}
    if not (tagged["engine"] and tagged["horovod"]):
        return "n/a: engine vs Horovod at 100mbit, large model: a side has no row (--rows)"
    unmeasured = [m for rows in tagged.values() for m in rows if m.status()]
    if unmeasured:
        return ("FAIL: engine vs Horovod at 100mbit, large model: "
                + "; ".join(f"'{m.setting.name}' {m.status()}" for m in unmeasured))
    best = {tag: min(rows, key=lambda m: m.row("100mbit").median) for tag, rows in tagged.items()}
    ours, theirs = (Side.of(best[tag].row("100mbit"), name=f"{tag} '{best[tag].setting.name}' s/step")
                    for tag in ("engine", "horovod"))
    return compare(ours, theirs, f"100mbit, large model: engine best vs Horovod best = "
                   f"{theirs.median / ours.median:.2f}x (target > 1x: the engine's step shorter)",
                   better="lower")


def quality(quick: bool) -> None:
    """fp16/bf16's dev score against float32's seed-to-seed spread: helper "wire"'s
    ``benchmarks/wire_quality.py``, when this checkout has it."""
    try:
        from wire_quality import quality_lines, wire_format_quality
    except ImportError:
        print("n/a: fp16 quality (dev score within the seed-to-seed spread of float32): needs "
              "benchmarks/wire_quality.py (wire_format_quality), not in this checkout")
        return
    epochs = 2 if quick else 5
    runs = wire_format_quality(formats=(None, "fp16"), seeds=(1, 2) if quick else (1, 2, 3), epochs=epochs)
    print("\n".join(quality_lines(runs, epochs)))


if __name__ == "__main__":
    main()
