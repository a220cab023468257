#!/usr/bin/env python3
"""What a mid-epoch checkpoint costs: seconds per save, and the share of an hour of training it takes at
the default ``checkpoint_interval`` (30 min, i.e. 2 saves per hour).

    .venv/bin/python benchmarks/bench_checkpoint.py [--saves 5] [--dir /path/on/the/checkpoint/disk]

Models (built with the engine's network dict, Adam, so the checkpoint holds the parameters and two
optimizer slots per parameter):
- ``blstm``: the 4-layer BLSTM of 512 units per direction, 40-dim input, 4501 classes, the "large" model
  of benchmarks/bench_allreduce.py (25.8 M parameters, about 310 MB per checkpoint with Adam's slots);
- ``lstm``: the 2-layer LSTM of 128 units, 40-dim input, 50 classes of benchmarks/bench_train.py.

Each save goes through ``Checkpointer.at_step_boundary`` in one process as training runs it: the
position in the batch plan (its fingerprint), the HDF5 file written under a temp name, fsynced, renamed,
the directory fsynced, and the previous mid-epoch checkpoint removed. With 2 ranks in grad mode the
other ranks only wait for rank 0 meanwhile; in param mode rank 0 first gathers every rank's parameters
and optimizer state (not measured here). Writes to ``--dir`` (default: a temp directory): measure on the
file system the checkpoints really go to.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from engine.config.loader import Config  # noqa: E402
from engine.datasets import BatchOptions, DummyDataset  # noqa: E402
from engine.distributed.local_backend import LocalCommunicator  # noqa: E402
from engine.distributed.protocol import SCORE_NAMES  # noqa: E402
from engine.distributed.strategy import StepPlan, Strategy  # noqa: E402
from engine.model import build_model  # noqa: E402
from engine.runtime import log  # noqa: E402
from engine.training.checkpoints.interval import CheckpointInterval  # noqa: E402
from engine.training.checkpoints.policy import Checkpointer  # noqa: E402
from engine.training.update.lr_control import LearningRateControl  # noqa: E402
from engine.training.update.updater import Updater, optimizer_from_config  # noqa: E402


def blstm(layers: int = 4, units: int = 512) -> dict:
    network, sources = {}, "data"
    for i in range(layers):
        for direction, name in ((1, f"fw{i}"), (-1, f"bw{i}")):
            network[name] = {"class": "rec", "unit": "nativelstm2", "n_out": units, "direction": direction,
                             "from": sources}
        sources = [f"fw{i}", f"bw{i}"]
    network["output"] = {"class": "softmax", "loss": "ce", "from": sources}
    return network


MODELS = {  # name: (description, network, classes)
    "blstm": ("4-layer BLSTM 512 (in 40, out 4501)", blstm(), 4501),
    "lstm": ("2-layer LSTM 128 (in 40, out 50)", {
        "lstm1": {"class": "rec", "unit": "nativelstm2", "n_out": 128},
        "lstm2": {"class": "rec", "unit": "nativelstm2", "n_out": 128, "from": "lstm1"},
        "output": {"class": "softmax", "loss": "ce", "from": "lstm2"}}, 50),
}


def measure(name: str, folder: str, saves: int) -> tuple[str, int, int, list[float]]:
    title, network, classes = MODELS[name]
    model = build_model(network, input_dim=40, input_sparse=False, target_dims={"classes": classes})
    updater = Updater(model.named_trainable_variables(), optimizer_from_config("adam"), learning_rate=1e-3)
    config = Config({"model": os.path.join(folder, name), "checkpoint_interval": 1})
    checkpoints = Checkpointer(config, Strategy(LocalCommunicator()), model, updater,
                               LearningRateControl.from_config(config))
    dataset = DummyDataset(input_dim=40, output_dim=classes, num_seqs=20000, seq_len=100)
    dataset.init_seq_order(1)
    checkpoints.begin_epoch(1, 0)
    checkpoints.epoch_start(dataset, BatchOptions(batch_size=5000, max_seqs=40))
    seconds = []
    for step in range(1, saves + 1):
        start = time.perf_counter()
        checkpoints.at_step_boundary(StepPlan(checkpoint=True), step, np.zeros(len(SCORE_NAMES)))
        seconds.append(time.perf_counter() - start)
    path = [f for f in os.listdir(folder) if f.startswith(f"{name}.001.step")]
    size = os.path.getsize(os.path.join(folder, path[0]))
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return title, parameters, size, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp directory)")
    parser.add_argument("--models", default="blstm,lstm")
    args = parser.parse_args()
    log.init(verbosity=2)
    default = CheckpointInterval.parse("30 min")
    per_hour = 3600 / default.seconds
    print(f"default checkpoint_interval: {default.describe()} ({per_hour:g} saves per hour)")
    print(f"{'model':<38} {'params':>8} {'file':>9} {'s/save':>8} {'MB/s':>6} {'% of 1 h':>9}")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            title, parameters, size, seconds = measure(name, folder, args.saves)
        median = statistics.median(seconds)
        print(f"{title:<38} {parameters / 1e6:>7.1f}M {size / 1e6:>7.1f}MB {median:>8.3f} "
              f"{size / 1e6 / median:>6.0f} {100 * per_hour * median / 3600:>8.3f}%")


if __name__ == "__main__":
    main()
