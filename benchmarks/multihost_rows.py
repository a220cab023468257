"""What bench_multihost.py measures: its two models (``Model``, ``MODELS``, the rnn.py config they
train) and its rows (``Setting``, ``settings``): rnn.py overrides and environment of each row, which rows
the default set runs and which only ``--full``, and the tags the engine-vs-Horovod verdict compares.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench_allreduce import lstm_shapes  # the script's own directory is on sys.path


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
