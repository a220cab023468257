"""Does the gradient reduction overlap the backward pass? Step time by ``distributed_bucket_mb``.

Two simulated hosts (tests/cluster/simulated_hosts.py), one rank each, the veth link limited by
``tc ... tbf`` to ``--rate``; a 2-layer BLSTM whose gradients (8.8 MB) take about as long to reduce
on 100 Mbit/s as a step takes to compute. Each row trains 2 epochs with rnn.py and reports the second
epoch's time per step (the first one traces the step). The row "unlimited link" is the compute-bound
reference (reduction almost free). bench_multihost.py (``make bench``) is the full benchmark; this
one only chooses the bucket size.

    sudo-less root: python benchmarks/bench_overlap.py [--rate 100mbit] [--buckets 0 1 4 25]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from cluster.simulated_hosts import AGENT, SUBNET, SimulatedHosts  # noqa: E402

CONFIG = """
task = "train"
train = {"class": "DummyDataset", "input_dim": 40, "output_dim": 10, "num_seqs": %(seqs)d, "seq_len": 50}
batch_size = 400
network = {
    "fw1": {"class": "rec", "unit": "nativelstm2", "n_out": 256, "direction": 1},
    "bw1": {"class": "rec", "unit": "nativelstm2", "n_out": 256, "direction": -1},
    "fw2": {"class": "rec", "unit": "nativelstm2", "n_out": 256, "direction": 1, "from": ["fw1", "bw1"]},
    "bw2": {"class": "rec", "unit": "nativelstm2", "n_out": 256, "direction": -1, "from": ["fw1", "bw1"]},
    "output": {"class": "softmax", "loss": "ce", "from": ["fw2", "bw2"]},
}
optimizer = {"class": "adam"}
learning_rate = 0.001
num_epochs = 2
use_horovod = True
distributed_backend = "mpi"
log_verbosity = 3
"""
EPOCH = re.compile(r"train epoch 2, finished after (\d+) steps.*\n.*?([\d.]+) frames/sec \((\d+) frames.*?"
                   r"([\d.]+)% in collectives")


def run(hosts: SimulatedHosts, workdir: Path, bucket_mb: float, steps: int) -> tuple[float, float]:
    """(seconds per step, % of the epoch the step waited in collectives) of epoch 2."""
    config = workdir / "overlap.config"
    config.write_text(CONFIG % {"seqs": 16 * steps})
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
              "++model", str(workdir / "model")]
    result = subprocess.run(hosts.command_on(0, mpirun), cwd=workdir, env=env, capture_output=True, text=True,
                            timeout=900)
    output = result.stdout + result.stderr
    match = EPOCH.search(output)
    if result.returncode != 0 or match is None:
        raise RuntimeError(f"bucket_mb {bucket_mb}: the run failed:\n{output[-3000:]}")
    n, fps, frames, collective = int(match[1]), float(match[2]), int(match[3]), float(match[4])
    return frames / fps / n, collective


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="100mbit", help="tc tbf rate of the link (e.g. 100mbit, 1gbit)")
    parser.add_argument("--buckets", type=float, nargs="+", default=[0, 1, 4, 25])
    parser.add_argument("--steps", type=int, default=6, help="steps per epoch")
    args = parser.parse_args()
    reason = SimulatedHosts.unavailable()
    if reason:
        print(f"bench_overlap: skipped: {reason}")
        return
    with SimulatedHosts.create() as hosts, tempfile.TemporaryDirectory() as tmp:
        seconds, _ = run(hosts, Path(tmp), 0, args.steps)
        print(f"unlimited link, bucket_mb 0: {seconds:.3f} s/step", flush=True)
        for host in hosts.hosts:
            subprocess.run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "add", "dev", host.interface,
                            "root", "tbf", "rate", args.rate, "burst", "64kb", "latency", "50ms"], check=True)
        for bucket_mb in args.buckets:
            seconds, collective = run(hosts, Path(tmp), bucket_mb, args.steps)
            print(f"{args.rate} link, bucket_mb {bucket_mb:g}: {seconds:.3f} s/step, "
                  f"{collective:.1f}% of the epoch waiting in collectives", flush=True)


if __name__ == "__main__":
    main()
