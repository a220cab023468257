#!/usr/bin/env python3
"""``make gpu-check``: what a user runs first on a GPU node, beside ``make sanity``. One line per check.

    .venv/bin/python benchmarks/gpu_check.py [--dry] [--runs 3] [--keep DIR]

First, where it runs (``gpu_node.py``): on the GPU when TensorFlow sees one; in the dry mode when the node
has no GPU at all (no ``nvidia-smi``, no ``/dev/nvidiaN``); on a node with a GPU that TensorFlow does not
see, it stops at once with one FAIL line naming the cause (a CPU-only TensorFlow, a CUDA/driver mismatch,
TensorFlow not importing, ``CUDA_VISIBLE_DEVICES`` hiding the GPUs), exit 1.

Every speed check trains through ``rnn.py`` on a generated corpus (40-dim features, 50 classes, lengths
50-250) and reads frames/s from the epoch line of the last epoch (the first builds and traces the graph):

- frames/s on the GPU against the 2-core CPU, for configs/12ax.py (information; a failed run is a FAIL)
  and for a 4x512 BLSTM (4 layers of 512 units each way; target: at least 10x);
- the LSTM through cuDNN against the engine's own kernel (BlockLSTM) on the GPU (target: at least 3x);
- mixed precision (bf16 where the GPU has it, else fp16) against float32: speed (target: at least 1.5x)
  and dev score (target: within the spread of float32's seeds);
- cuDNN's layout (``lstm_layout_probe.py``): the engine's LSTM through ``CudnnRNNV3`` against Keras' LSTM
  given the same weights in Keras' layout, and the engine's parameter vector against Keras' own;
- the ``tf`` backend's reduction (``collective_probe.py``), its result checked on every rank: with NCCL
  between every GPU TensorFlow sees (one rank per GPU; a node with one GPU cannot check NCCL between
  ranks, and the last line says so), and with its ring between 2 ranks sharing one GPU;
- 2 ranks sharing one GPU train, with the ``mpi`` backend and with the ``tf`` backend (ring);
- peak GPU memory of the 4x512 BLSTM (information).

Speed verdicts take medians of ``--runs`` interleaved runs and their ranges (``timing.compare``); the
others are PASS/MISS/FAIL. Without a GPU (or with ``--dry``) the same checks run on the CPU with a small
model, so that the script cannot rot (CI runs it). Each line that the CPU cannot judge says DRY: the speed
targets (printed with the CPU's ratio), cuDNN's kernel (the vector and the CPU twin against Keras are
still compared), NCCL and the ring on GPU tensors (the ring between 2 CPU ranks is checked instead), peak
GPU memory; the last line names what was not checked. Exits non-zero when a check that ran is not PASS.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile

import numpy as np

from engine.datasets import DataKeyInfo, HDFWriter
from gpu_node import NodeFacts, decide, read_facts
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


class Check:
    """Runs ``rnn.py`` on one config with overrides and reads what its output says."""

    def __init__(self, config: str, workdir: str, name: str, overrides: list[str], ranks: int = 1,
                 cpu: bool = False, env: dict | None = None) -> None:
        self.name, self.config, self.workdir = name, config, workdir
        self.overrides, self.ranks, self.cpu, self.env = overrides, ranks, cpu, env or {}
        self.outputs: list[str] = []

    def run(self) -> str:
        extra = {"CUDA_VISIBLE_DEVICES": ""} if self.cpu else self.env
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


BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
COLLECTIVE_PROBE = os.path.join(BENCHMARKS, "collective_probe.py")
LAYOUT_PROBE = os.path.join(BENCHMARKS, "lstm_layout_probe.py")
PROBE_LINE = re.compile(r"^(?:\[rank \d+\] )?collective-probe: rank (\d+) of (\d+): (.*)$", re.M)
EXACT = re.compile(  # the rest of a rank's line when its sum was exact: (device kind, communication hint)
    r"[1-9]\d* CollectiveReduceV2 on \S+/device:(\w+):\d+ \(communication_hint ([\w, ]+)\): sum exact")


def run_probe(program: str, args: list[str], ranks: int, extra: dict | None = None) -> tuple[str, int]:
    """(output, exit code) of a probe, under mpirun when ``ranks`` says so (``rnn_command`` puts the
    program's first argument where it puts a config)."""
    env = child_env(extra=extra)
    cmd = rnn_command(args[0], ranks, args[1:], env, program=program, mpirun=ranks > 1 or program ==
                      COLLECTIVE_PROBE)
    out = run_stamped(cmd, env, timeout=600, check=False)
    if out.returncode != 0:
        print(out.text[-3000:], file=sys.stderr, flush=True)
    return out.text, out.returncode


def reduction_verdict(name: str, text: str, returncode: int, ranks: int, kind: str, hint: str,
                      nccl: bool = False) -> str:
    """PASS only when every one of ``ranks`` ranks printed that its reduction ran on the ``kind`` device
    with communication hint ``hint`` and gave the exact sum, and, with ``nccl``, NCCL printed its version
    (``NCCL_DEBUG=VERSION``: NCCL says so when it sets up a communicator, i.e. when it ran)."""
    exact, other = set(), []
    for rank, size, rest in PROBE_LINE.findall(text):
        exact_here = EXACT.fullmatch(rest)
        if int(size) == ranks and exact_here and exact_here.groups() == (kind, hint):
            exact.add(int(rank))
        else:
            other.append(f"rank {rank} of {size}: {rest}")
    missing = sorted(set(range(ranks)) - exact)
    if missing or returncode != 0:
        said = f"; {'; '.join(other)}" if other else ""
        return (f"FAIL: {name}: exit {returncode}, no exact sum on the {kind} with {hint} from rank(s) "
                f"{', '.join(map(str, missing)) or 'none'}{said} (the end of its output is above)")
    version = re.search(r"NCCL version ([\w.+-]+)", text)
    if nccl and not version:
        return (f"FAIL: {name}: every rank got the exact sum, but NCCL printed no version line "
                "(NCCL_DEBUG=VERSION), so NCCL did not run: the reduction went another way")
    ran = f"; NCCL {version.group(1)} ran" if version else ""
    return f"PASS: {name}: each of {ranks} rank(s) got the exact sum on its {kind} ({hint}{ran})"


def layout_verdict(text: str, returncode: int, on_gpu: bool) -> str:
    """The cuDNN layout line: on a GPU a PASS needs both comparisons equal; on the CPU cuDNN's kernel
    does not run, so the line is DRY when both are equal (and FAIL when not)."""
    found = dict(re.findall(r"^lstm-layout: (vector|outputs) (.*)$", text, re.M))
    if returncode != 0 or len(found) != 2 or not all(v.startswith("equal") for v in found.values()):
        shown = "; ".join(f"{k} {v}" for k, v in found.items()) or "no result (its output is above)"
        return f"FAIL: cuDNN's layout: exit {returncode}: {shown}"
    if on_gpu:
        return (f"PASS: the LSTM through cuDNN (CudnnRNNV3) computes Keras' LSTM given the same weights in "
                f"Keras' layout: {found['outputs'][len('equal: '):]}; its parameter vector is Keras' own")
    return ("DRY: cuDNN's kernel (no GPU). Checked on the CPU instead: the engine's parameter vector for "
            "cuDNN equals the one Keras builds from the same weights, and the CPU twin reading it computes "
            "Keras' LSTM. The twin reads the vector as the engine writes it, so twin against the engine's "
            "own kernel cannot see a layout error; Keras' vector can")


def mode_of(args: argparse.Namespace) -> tuple[str, NodeFacts, str]:
    if args.dry:
        return "dry", NodeFacts(), "--dry"
    facts = read_facts()
    mode, why = decide(facts)
    return mode, facts, why


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="the CPU dry mode even where a GPU is visible")
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs per speed row")
    parser.add_argument("--keep", help="keep corpora and models in this directory")
    args = parser.parse_args()
    mode, facts, why = mode_of(args)
    if mode == "fail":
        print(f"FAIL: {why}", flush=True)
        print("gpu-check: 1 check(s) not PASS (the GPU cannot be used)", flush=True)
        return 1
    on_gpu, gpus, capability = mode == "gpu", facts.tf_gpus, facts.capability
    workdir = args.keep or tempfile.mkdtemp(prefix="gpu-check-")
    os.makedirs(workdir, exist_ok=True)
    layers, units, seqs, cpu_seqs = (4, 512, 400, 40) if on_gpu else (2, 32, 30, 30)
    runs = args.runs if on_gpu else 1
    print(f"gpu-check: {f'on the GPU ({why})' if on_gpu else f'DRY mode on the CPU ({why})'}; "
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

    failures, unchecked = 0, []

    def say(line: str) -> None:
        """A judged line: anything but PASS is a failure."""
        nonlocal failures
        failures += not line.startswith("PASS")
        print(line, flush=True)

    def dry(line: str, what: str) -> None:
        """A line nothing judged here (``what``: named in the last line)."""
        unchecked.append(what)
        print(line, flush=True)

    side = {name: Side.of(row) for name, row in rows.items()}

    def speed_target(ours: str, theirs: str, factor: float, text: str) -> None:
        """A GPU's speed target: judged on a GPU (medians and ranges, ``timing.compare``); in dry mode the
        ratio is printed and nothing judged."""
        if on_gpu or side[ours].failed or side[theirs].failed:
            say(compare(side[ours], side[theirs], text, factor=factor, fmt="{:.0f}"))
            return
        ratio = side[ours].median / side[theirs].median
        dry(f"DRY: {text}: {ratio:.2f}x on the CPU [{side[ours].describe('{:.0f}')}; "
            f"{side[theirs].describe('{:.0f}')}] (the target is for a GPU: nothing judged)",
            "the speed targets")

    failed_ax = [name for name in ("12ax_compute", "12ax_cpu") if side[name].failed]
    if failed_ax:
        say(f"FAIL: 12AX frames/s on the {compute} against the 2-core CPU: "
            + "; ".join(f"{name}: {side[name].failure}" for name in failed_ax))
    else:
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

    text, code = run_probe(LAYOUT_PROBE, [compute], 1)
    line = layout_verdict(text, code, on_gpu)
    if line.startswith("DRY"):
        dry(line, "cuDNN's kernel")
    else:
        say(line)

    # the tf backend's reduction, its result checked on every rank (collective_probe.py)
    one_gpu = {"CUDA_VISIBLE_DEVICES": (facts.visible_devices or "0").split(",")[0]} if on_gpu else {}
    if on_gpu:
        text, code = run_probe(COLLECTIVE_PROBE, ["--device", "gpu", "--gpu-reduction", "nccl"], gpus,
                               extra={"NCCL_DEBUG": "VERSION"})
        between = f"NCCL between the {gpus} GPUs TensorFlow sees (one rank per GPU)" if gpus > 1 else \
            "its GPU reduction on 1 rank (communication hint nccl)"
        say(reduction_verdict(f"tf backend, {between}", text, code, gpus, "GPU", "nccl", nccl=gpus > 1))
        if gpus == 1:
            unchecked.append("NCCL between ranks (this node has 1 GPU; NCCL takes one rank per GPU)")
            print("NOT CHECKED: NCCL between ranks: this node has 1 GPU, and NCCL takes one rank per GPU "
                  "(run gpu-check on a node with 2 or more)", flush=True)
        text, code = run_probe(COLLECTIVE_PROBE, ["--device", "gpu", "--gpu-reduction", "ring"], 2,
                               extra=one_gpu)
        say(reduction_verdict("tf backend, its ring between 2 ranks sharing one GPU", text, code, 2, "GPU",
                              "ring"))
    else:
        dry("DRY: the tf backend with NCCL, and its ring on GPU tensors (no GPU)", "NCCL")
        text, code = run_probe(COLLECTIVE_PROBE, ["--device", "cpu"], 2)
        say(reduction_verdict("tf backend, its ring between 2 CPU ranks", text, code, 2, "CPU", "ring"))

    collective = ["++use_horovod", "1", "++distributed_backend"]
    where = "sharing one GPU" if on_gpu else "on the CPU"
    for name, check, expect in (  # a reduction's result is the probe's to check; these show training runs
            (f"2 ranks {where} trained with the mpi backend",
             Check(configs["blstm"], workdir, "mpi_2ranks", [*collective, "mpi"], ranks=2, env=one_gpu),
             "using the mpi backend"),
            (f"2 ranks {where} trained with the tf backend (ring)",
             Check(configs["blstm"], workdir, "tf_2ranks",
                   [*collective, "tf", "++distributed_tf_gpu_reduction", "ring"], ranks=2, env=one_gpu),
             "using the tf backend")):
        try:
            text = check.run()
            finished = re.search(r"^train epoch 2: [0-9.]+ frames/sec", text, re.M)
            ok = expect in text and finished
            say(f"{'PASS' if ok else 'MISS'}: {name}"
                f"{'' if ok else f' (its log lacks {expect!r} or the last epoch line)'}")
        except RowFailed as exc:
            say(f"FAIL: {name}: {exc}")
    peaks = [peak_gpu_mib(text) for text in checks["blstm_cudnn"].outputs]
    peak = max((p for p in peaks if p is not None), default=None)
    if not on_gpu:
        dry("DRY: peak GPU memory (no GPU)", "peak GPU memory")
    elif peak is None:
        say(f"FAIL: the {layers}x{units} BLSTM reported no peak GPU memory: it did not compute on the GPU")
    else:
        print(f"INFO: peak GPU memory of the {layers}x{units} BLSTM: {peak:.0f} MiB", flush=True)
    verdict = "all checks PASS" if not failures else f"{failures} check(s) not PASS"
    if not on_gpu:
        verdict = f"DRY mode, {verdict}" + (" (on the CPU)" if not failures else "")
    not_checked = f"; not checked: {', '.join(dict.fromkeys(unchecked))}" if unchecked else ""
    print(f"gpu-check: {verdict}{not_checked}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
