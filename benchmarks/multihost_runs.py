"""How bench_multihost.py runs things on its 2 simulated hosts: the link (its rate, measured over TCP;
setting it with ``tc``), the ranks (``mpirun`` with one rank on each host and its environment), one
training run of a row timed segment by segment from rank 0's step lines, and the allreduce alone in an
mpirun'd worker. The TCP sender and receiver and the allreduce worker run as bench_multihost.py itself
(its hidden options ``--tcp-receive``, ``--tcp-send``, ``--allreduce-worker``): ``SCRIPT``.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence

from multihost_rows import MODELS, Model, Setting  # the script's own directory is on sys.path
from timing import ROOT, child_env

sys.path.insert(0, os.path.join(ROOT, "tests"))
from cluster.simulated_hosts import AGENT, SUBNET, SimulatedHosts  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_multihost.py")
LINKS = {"100mbit": 100e6, "1gbit": 1e9}
UNLIMITED = "unlimited"
STEP_LINE = re.compile(r"^train epoch 1, step (\d+),")
TCP_PORT = 5201


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
    me = [sys.executable, SCRIPT]
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
    program = [sys.executable, SCRIPT, "--allreduce-worker", ",".join(models),
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
