"""Does the gradient reduction overlap the backward pass? Step time by ``distributed_bucket_mb``.

Two simulated hosts (tests/cluster/simulated_hosts.py), one rank each, the veth link limited by
``tc ... tbf`` to ``--rate``; a BLSTM (default 2 layers of 256 units per direction, 8.8 MB of
gradients) whose reduction takes as long as its compute or longer. Each row trains 2 epochs with
rnn.py and reports the second epoch's time per step (the first one traces the step). The row
"unlimited link" is the compute-bound reference (reduction almost free). bench_multihost.py
(``make bench``) is the full benchmark; this one only chooses the bucket size.

    python benchmarks/bench_overlap.py [--rate 100mbit] [--buckets 0 1 4 25] [--layers 2] [--units 256]

As root (namespaces and tc need it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from cluster.simulated_hosts import AGENT, SUBNET, SimulatedHosts  # noqa: E402
from workload import blstm_network  # noqa: E402  (the script's own directory is on sys.path)

CONFIG = """
task = "train"
train = {"class": "DummyDataset", "input_dim": 40, "output_dim": 10, "num_seqs": %(seqs)d, "seq_len": 50}
batch_size = 400
network = %(network)s
optimizer = {"class": "adam"}
learning_rate = 0.001
num_epochs = 2
use_horovod = True
distributed_backend = "mpi"
log_verbosity = 3
"""
EPOCH = re.compile(r"train epoch 2, finished after (\d+) steps.*\n.*?([\d.]+) frames/sec \((\d+) frames.*?"
                   r"([\d.]+)% in collectives")


def run(hosts: SimulatedHosts, workdir: Path, bucket_mb: float, steps: int, layers: int,
        units: int) -> tuple[float, float, float | None]:
    """(seconds per step, % of the epoch the step waited in collectives) of epoch 2, and the share of
    the reduction hidden behind the backward pass (``hidden_share``)."""
    workdir = Path(tempfile.mkdtemp(dir=workdir))  # a fresh model each run
    config = workdir / "overlap.config"
    config.write_text(CONFIG % {"seqs": 16 * steps, "network": blstm_network(layers, units)})
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(ROOT),
               SIMULATED_HOSTS=hosts.agent_map)
    mpirun = [str(Path(sys.executable).parent / "mpirun"), "--oversubscribe", "--bind-to", "none",
              "--host", ",".join(f"{h.address}:1" for h in hosts.hosts), "-np", "2",
              "--prtemca", "plm_ssh_agent", str(AGENT), "--prtemca", "oob_tcp_if_include", SUBNET,
              "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", SUBNET,
              "-x", "PYTHONPATH", "-x", "TF_NUM_INTRAOP_THREADS", "-x", "TF_NUM_INTEROP_THREADS",
              "-x", "TF_CPP_MIN_LOG_LEVEL",
              sys.executable, str(ROOT / "rnn.py"), str(config), "++distributed_bucket_mb", str(bucket_mb),
              "++model", str(workdir / "model"), "++timeline_file", str(workdir / "timeline.json")]
    result = subprocess.run(hosts.command_on(0, mpirun), cwd=workdir, env=env, capture_output=True, text=True,
                            timeout=900)
    output = result.stdout + result.stderr
    match = EPOCH.search(output)
    if result.returncode != 0 or match is None:
        raise RuntimeError(f"bucket_mb {bucket_mb}: the run failed:\n{output[-3000:]}")
    n, fps, frames, collective = int(match[1]), float(match[2]), int(match[3]), float(match[4])
    return frames / fps / n, collective, hidden_share(workdir / "timeline.json")


def hidden_share(path: Path) -> float | None:
    """Of the bucketed reductions' own time (all steps but each rank's first), the share that ran while
    the step still computed (the phase's ``hidden_s`` / ``reduce_s``); None without buckets."""
    events = [e for e in json.loads(path.read_text()) if "hidden_s" in e.get("args", {})]
    seen, hidden, total = set(), 0.0, 0.0
    for event in sorted(events, key=lambda e: e["ts"]):
        if event["pid"] in seen:
            hidden += event["args"]["hidden_s"]
            total += event["args"]["reduce_s"]
        seen.add(event["pid"])
    return hidden / total if total else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="100mbit", help="tc tbf rate of the link (e.g. 100mbit, 1gbit)")
    parser.add_argument("--buckets", type=float, nargs="+", default=[0, 1, 4, 25])
    parser.add_argument("--steps", type=int, default=5, help="steps per epoch")
    parser.add_argument("--layers", type=int, default=2, help="BLSTM layers")
    parser.add_argument("--units", type=int, default=256, help="LSTM units per direction")
    args = parser.parse_args()
    reason = SimulatedHosts.unavailable()
    if reason:
        print(f"bench_overlap: skipped: {reason}")
        return
    with SimulatedHosts.create() as hosts, tempfile.TemporaryDirectory() as tmp:
        seconds, _, _ = run(hosts, Path(tmp), 0, args.steps, args.layers, args.units)
        print(f"unlimited link, bucket_mb 0: {seconds:.3f} s/step", flush=True)
        for host in hosts.hosts:
            subprocess.run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "add", "dev", host.interface,
                            "root", "tbf", "rate", args.rate, "burst", "64kb", "latency", "50ms"], check=True)
        for bucket_mb in args.buckets:
            seconds, collective, hidden = run(hosts, Path(tmp), bucket_mb, args.steps, args.layers,
                                              args.units)
            shown = "" if hidden is None else f", {100 * hidden:.0f}% of the reduction hidden"
            print(f"{args.rate} link, bucket_mb {bucket_mb:g}: {seconds:.3f} s/step, "
                  f"{collective:.1f}% of the epoch waiting in collectives{shown}", flush=True)


if __name__ == "__main__":
    main()
