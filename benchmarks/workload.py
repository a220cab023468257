"""The RETURNN-style workload of the training benchmarks, as files: a corpus and the configs that train on
it, for this engine and for RETURNN.

Corpus: 40-dim features, 50 classes, lengths 50-250 (a generated HDF file written by the engine's
``HDFWriter``, which RETURNN's ``HDFDataset`` reads too). Model: 2 LSTM layers of 128 units, softmax;
batch_size 5000, max_seqs 40, random order, Adam, learning rate 0.001, no checkpoints, no dev set.
"""
from __future__ import annotations

import os

import h5py
import numpy as np

from engine.datasets import DataKeyInfo, HDFWriter

COMMON = """
network = {{
    "lstm0": {{"class": "rec", "unit": "{unit}", "n_out": 128, "from": "data"}},
    "lstm1": {{"class": "rec", "unit": "{unit}", "n_out": 128, "from": "lstm0"}},
    "output": {{"class": "softmax", "loss": "ce", "from": "lstm1"}},
}}
batch_size = 5000
max_seqs = 40
optimizer = {{"class": "adam"}}
learning_rate = 0.001
num_epochs = {epochs}
log_verbosity = 3
"""
ENGINE_CONFIG = """
train = {{"class": "HDFDataset", "files": [{corpus!r}], "seq_ordering": "random"}}
cache_size = "0"
""" + COMMON
RETURNN_CONFIG = """#!rnn.py
use_tensorflow = True
task = "train"
device = "cpu"
train = {{"class": "HDFDataset", "files": [{corpus!r}], "seq_ordering": "random", "cache_byte_size": 0}}
extern_data = {{"data": {{"dim": 40}}, "classes": {{"dim": 50, "sparse": True}}}}
tf_session_opts = {{"intra_op_parallelism_threads": {threads}, "inter_op_parallelism_threads": {threads}}}
""" + COMMON


def make_corpus(path: str, num_seqs: int) -> int:
    """Write the corpus; returns its number of frames."""
    rng = np.random.RandomState(0)
    mapping = rng.standard_normal((40, 50))
    keys = {"data": DataKeyInfo(dim=40), "classes": DataKeyInfo(dim=50, sparse=True)}
    frames = 0
    with HDFWriter(path, keys) as writer:
        for i in range(num_seqs):
            features = rng.standard_normal((rng.randint(50, 251), 40)).astype(np.float32)
            writer.insert(f"seq-{i}", {"data": features, "classes": (features @ mapping).argmax(1)})
            frames += len(features)
    return frames


def corpus_frames(path: str) -> int:
    with h5py.File(path, "r") as f:
        return int(f["seqLengths"][:, 0].sum())


def write_engine_config(folder: str, corpus: str, epochs: int, unit: str = "NativeLstm2",
                        extra: str = "") -> str:
    path = os.path.join(folder, f"engine-{unit}.py")
    with open(path, "w") as f:
        f.write(ENGINE_CONFIG.format(corpus=corpus, epochs=epochs, unit=unit) + extra)
    return path


def write_returnn_config(folder: str, corpus: str, epochs: int, unit: str, threads: int) -> str:
    path = os.path.join(folder, f"returnn-{unit}-{threads}threads.config")  # one file per row
    with open(path, "w") as f:
        f.write(RETURNN_CONFIG.format(corpus=corpus, epochs=epochs, unit=unit, threads=threads))
    return path


def blstm_network(layers: int, units: int) -> dict:
    """A network dict: ``layers`` BLSTM layers of ``units`` units per direction, then a softmax with ce."""
    network, source = {}, "data"
    for i in range(layers):
        for name, direction in ((f"fw{i}", 1), (f"bw{i}", -1)):
            network[name] = {"class": "rec", "unit": "NativeLstm2", "n_out": units, "direction": direction,
                             "from": source}
        source = [f"fw{i}", f"bw{i}"]
    network["output"] = {"class": "softmax", "loss": "ce", "from": source}
    return network
