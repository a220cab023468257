#!/usr/bin/env python3
"""``make gpu-check``: what a user runs first on a GPU node, beside ``make sanity``. One line per check.

    .venv/bin/python benchmarks/gpu_check.py [--dry] [--runs 3] [--keep DIR]

Every check trains through ``rnn.py`` on a generated corpus (40-dim features, 50 classes, lengths 50-250)
and reads frames/s from the epoch line of the last epoch (the first epoch builds and traces the graph):

- frames/s on the GPU against the 2-core CPU, for configs/12ax.py (information) and for a 4x512 BLSTM
  (4 layers of 512 units each way; target: at least 10x);
- the LSTM through cuDNN against the engine's own kernel (BlockLSTM) on the GPU (target: at least 3x);
- mixed precision (bf16 where the GPU has it, else fp16) against float32: speed (target: at least 1.5x)
  and dev score (target: within the spread of float32's seeds);
- the ``tf`` backend on 1 rank (NCCL), and 2 ranks sharing the GPU with the ``mpi`` backend and with the
  ``tf`` backend (its ring: NCCL takes one rank per GPU);
- peak GPU memory of the 4x512 BLSTM (information).

Speed verdicts take medians of ``--runs`` interleaved runs and their ranges (``timing.compare``); the
others are PASS/MISS. Without a GPU (or with ``--dry``) the same checks run on the CPU with a small
model, so that the script cannot rot (CI runs it): each check must run, but the speed targets, which are
for a GPU (an H100 or H200), are printed as DRY lines with the measured ratio and judge nothing.
Exits non-zero when a check that applies is not PASS.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from engine.datasets import DataKeyInfo, HDFWriter
from timing import ROOT, Row, RowFailed, Side, child_env, compare, interleaved, rnn_command, run_stamped
from workload import blstm_network

LSTM_IMPLEMENTATION = "lstm_implementation"  # "cudnn" | "native"
MIXED_PRECISION = "tf_amp"  # "bfloat16" | "float16" (RETURNN's key)

BLSTM_CONFIG = """
train = {{"class": "HDFDataset", "files": [{train!r}], "seq_ordering": "laplace:.10"}}
dev = {{"class": "HDFDataset", "files": [{dev!r}]}}
cache_size = "0"
batch_size = {batch_size}
max_seqs = 64
network = {network}
optimizer = {{"class": "adam"}}
learning_rate = 0.001
num_epochs = {epochs}
log_verbosity = 3
"""


def write_corpus(path: str, num_seqs: int, seed: int) -> None:
    rng = np.random.RandomState(seed)
    mapping = np.random.RandomState(0).standard_normal((40, 50))
    keys = {"data": DataKeyInfo(dim=40), "classes": DataKeyInfo(dim=50, sparse=True)}
    with HDFWriter(path, keys) as writer:
        for i in range(num_seqs):
            features = rng.standard_normal((rng.randint(50, 251), 40)).astype(np.float32)
            writer.insert(f"seq-{i}", {"data": features, "classes": (features @ mapping).argmax(1)})


def visible_gpu() -> tuple[int, int]:
    """(GPUs TensorFlow sees, the first one's compute capability major), asked in a child so that this
    process holds no GPU memory."""
    probe = ("import tensorflow as tf; gpus = tf.config.list_physical_devices('GPU'); "
             "cc = tf.config.experimental.get_device_details(gpus[0]).get('compute_capability', (0, 0)) "
             "if gpus else (0, 0); print(len(gpus), cc[0])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=child_env())
    if out.returncode != 0 or not out.stdout.strip():
        return 0, 0
    count, major = out.stdout.split()[-2:]
    return int(count), int(major)


class Check:
    """Runs ``rnn.py`` on one config with overrides and reads what its output says."""

    def __init__(self, config: str, workdir: str, name: str, overrides: list[str], ranks: int = 1,
                 cpu: bool = False) -> None:
        self.name, self.config, self.workdir = name, config, workdir
        self.overrides, self.ranks, self.cpu = overrides, ranks, cpu
        self.outputs: list[str] = []

    def run(self) -> str:
        extra = {"CUDA_VISIBLE_DEVICES": ""} if self.cpu else {}
        env = child_env(threads=2 if self.cpu else None, extra=extra)
        model = os.path.join(self.workdir, f"{self.name}-{len(self.outputs)}", "model")
        cmd = rnn_command(self.config, self.ranks, ["++model", model, *self.overrides], env,
                          mpirun=self.ranks > 1 or "++use_horovod" in self.overrides)
        out = run_stamped(cmd, env, check=False)
        if out.returncode != 0:
            print(out.text[-3000:], file=sys.stderr, flush=True)
            raise RowFailed(f"{self.name} exited {out.returncode} (the end of its output is above): "
                            f"{' '.join(cmd)}")
        self.outputs.append(out.text)
        return out.text

    def frames_per_second(self) -> float:
        text = self.run()
        rates = re.findall(r"^train epoch \d+: ([0-9.]+) frames/sec", text, re.M)
        return float(rates[-1])


def last_dev_score(text: str) -> float:
    return float(re.findall(r"^dev: score ([0-9.eE+-]+)", text, re.M)[-1])


def peak_gpu_mib(text: str) -> float | None:
    found = re.findall(r"peak GPU memory rank 0: ([0-9.]+) MiB", text)
    return float(found[-1]) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="the CPU dry mode even where a GPU is visible")
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs per speed row")
    parser.add_argument("--keep", help="keep corpora and models in this directory")
    args = parser.parse_args()
    gpus, capability = (0, 0) if args.dry else visible_gpu()
    on_gpu = gpus > 0
    workdir = args.keep or tempfile.mkdtemp(prefix="gpu-check-")
    os.makedirs(workdir, exist_ok=True)
    layers, units, seqs, cpu_seqs = (4, 512, 400, 40) if on_gpu else (2, 32, 30, 30)
    runs = args.runs if on_gpu else 1
    print(f"gpu-check: {'on the GPU' if on_gpu else 'DRY mode on the CPU (no GPU visible)'}; "
          f"BLSTM {layers}x{units}, {runs} run(s) per speed row; files in {workdir}", flush=True)

    configs = {}
    for name, train_seqs in (("blstm", seqs), ("blstm_cpu", cpu_seqs)):
        train = os.path.join(workdir, f"{name}-train.hdf")
        dev = os.path.join(workdir, "dev.hdf")
        write_corpus(train, train_seqs, seed=1)
        if not os.path.exists(dev):
            write_corpus(dev, 20 if on_gpu else 10, seed=2)
        configs[name] = os.path.join(workdir, f"{name}.py")
        with open(configs[name], "w") as f:
            f.write(BLSTM_CONFIG.format(train=train, dev=dev, batch_size=20000 if on_gpu else 2000, epochs=2,
                                        network=blstm_network(layers, units)))
    ax = os.path.join(ROOT, "configs", "12ax.py")
    ax_args = ["++num_epochs", "2", "++train", '{"class": "Task12AXDataset", "num_seqs": 1000, '
               '"fixed_random_seed": 1}']
    # bf16 where the GPU computes it (Ampere and newer), else fp16; the CPU has bf16 but no fp16 arithmetic
    precision = "float16" if on_gpu and capability < 8 else "bfloat16"
    compute = "gpu" if on_gpu else "cpu"

    def blstm(name: str, *overrides: str, ranks: int = 1) -> Check:
        return Check(configs["blstm"], workdir, name, list(overrides), ranks=ranks)

    cudnn = ["++" + LSTM_IMPLEMENTATION, "cudnn"]  # on the CPU its twin: float32 and mixed on one kernel
    checks = {
        "12ax_compute": Check(ax, workdir, "12ax_compute", ax_args),
        "12ax_cpu": Check(ax, workdir, "12ax_cpu", ax_args + ["++device", "cpu"], cpu=True),
        "blstm_cudnn": blstm("blstm_cudnn", *cudnn),
        "blstm_cpu": Check(configs["blstm_cpu"], workdir, "blstm_cpu", ["++device", "cpu"], cpu=True),
        "blstm_native": blstm("blstm_native", "++" + LSTM_IMPLEMENTATION, "native"),
        "blstm_mixed": blstm("blstm_mixed", *cudnn, "++" + MIXED_PRECISION, precision),
    }
    rows = {name: Row(name, check.frames_per_second) for name, check in checks.items()}
    interleaved(list(rows.values()), runs)
    seed_scores = [last_dev_score(text) for text in checks["blstm_cudnn"].outputs[:1]]
    for seed in range(1, 3 if on_gpu else 2):  # float32's spread over seeds: the first run's and these
        try:
            seed_run = blstm(f"blstm_seed{seed}", *cudnn, "++random_seed", str(seed))
            seed_scores.append(last_dev_score(seed_run.run()))
        except RowFailed as exc:
            print(f"  {exc}", file=sys.stderr, flush=True)
    mixed_scores = [last_dev_score(text) for text in checks["blstm_mixed"].outputs]

    failures = 0

    def say(line: str) -> None:
        nonlocal failures
        failures += not line.startswith("PASS")
        print(line, flush=True)

    side = {name: Side.of(row) for name, row in rows.items()}

    def speed_target(ours: str, theirs: str, factor: float, text: str) -> None:
        """A GPU's speed target: judged on a GPU (medians and ranges, ``timing.compare``); in dry mode the
        ratio is printed and nothing judged."""
        if on_gpu or side[ours].failed or side[theirs].failed:
            say(compare(side[ours], side[theirs], text, factor=factor, fmt="{:.0f}"))
            return
        ratio = side[ours].median / side[theirs].median
        print(f"DRY: {text}: {ratio:.2f}x on the CPU [{side[ours].describe('{:.0f}')}; "
              f"{side[theirs].describe('{:.0f}')}] (the target is for a GPU: nothing judged)", flush=True)

    ratio = side["12ax_compute"].median / side["12ax_cpu"].median
    print(f"INFO: 12AX frames/s on the {compute} {side['12ax_compute'].describe('{:.0f}')} against the "
          f"2-core CPU {side['12ax_cpu'].describe('{:.0f}')}: {ratio:.2f}x", flush=True)
    speed_target("blstm_cudnn", "blstm_cpu", 10, f"{layers}x{units} BLSTM frames/s on the {compute} at least "
                 "10x the 2-core CPU's")
    speed_target("blstm_cudnn", "blstm_native", 3, "the LSTM through cuDNN at least 3x the engine's own "
                 "kernel")
    speed_target("blstm_mixed", "blstm_cudnn", 1.5, f"{precision} mixed precision at least 1.5x float32")
    # the seeds' spread, at least 2% of the score (the dry mode's 2 seeds of a small model can agree closely)
    if len(seed_scores) < 2 or not mixed_scores:
        say(f"FAIL: {precision} dev score against float32's seeds: a run failed (its output is above)")
    else:
        mixed_score, low, high = statistics.median(mixed_scores), min(seed_scores), max(seed_scores)
        margin = max(0.0, 0.02 * high - (high - low)) / 2
        within = low - margin <= mixed_score <= high + margin
        say(f"{'PASS' if within else 'MISS'}: {precision} dev score {mixed_score:.4f} within float32's seed "
            f"spread {low:.4f}..{high:.4f} ({len(seed_scores)} seeds{', widened to 2%' if margin else ''})")
    collective = ["++use_horovod", "1", "++distributed_backend"]
    for name, check, expect in (  # the tf backend's log line names how it reduces CPU and GPU tensors
            ("the tf backend on 1 rank (NCCL on a GPU)", blstm("tf_1rank", *collective, "tf"),
             "GPU tensors by NCCL"),
            ("2 ranks sharing the device, mpi backend", blstm("mpi_2ranks", *collective, "mpi", ranks=2),
             "using the mpi backend"),
            ("2 ranks sharing the device, tf backend (ring)", blstm(
                "tf_2ranks", *collective, "tf", "++distributed_tf_gpu_reduction", "ring", ranks=2),
             "GPU tensors by RING")):
        try:
            text = check.run()
            ok = expect in text
            say(f"{'PASS' if ok else 'MISS'}: {name} trained"
                f"{'' if ok else f' but its log does not say {expect!r}'}")
        except RowFailed as exc:
            say(f"FAIL: {name}: {exc}")
    peaks = [peak_gpu_mib(text) for text in checks["blstm_cudnn"].outputs]
    peak = max((p for p in peaks if p is not None), default=None)
    print(f"INFO: peak GPU memory of the {layers}x{units} BLSTM: "
          f"{f'{peak:.0f} MiB' if peak is not None else 'none measured (no GPU)'}", flush=True)
    print(f"gpu-check: {'all checks PASS' if not failures else f'{failures} check(s) not PASS'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
