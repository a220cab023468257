#!/usr/bin/env python3
"""A published Conformer hybrid, reduced, trained by this engine and by RETURNN side by side: frames/s.

    RETURNN_PYTHON=/tmp/returnn-venv/bin/python \\
        .venv/bin/python benchmarks/bench_returnn_conformer_speed.py CHECKOUT
        [--config 2021-swb-conformer-hybrid/baseline_12l.config] [--blocks 4] [--dim 256]
        [--seqs 30] [--epochs 3] [--runs 3]

CHECKOUT is a checkout of ``rwth-i6/returnn-experiments`` (the project holds none of its files). The
config's network is read as ``bench_returnn_coverage.py`` reads it and reduced (``reduced``) to its
first ``--blocks`` Conformer blocks of ``--dim`` units (the issue's 4 blocks of 256: the blocks behind
them and their auxiliary loss dropped, every width scaled by dim / 512, 64 units per attention head
kept). Both programs train it as written otherwise: the config's top-level functions (SpecAugment),
dropout, its ``batch_size``, ``batching``, ``chunking``, ``max_seqs`` and optimizer keys, at the first
epoch's learning rate, on one HDF corpus of the config's dims (40 features, 9001 frame labels; its RASR
corpus replaced) of ``--seqs`` sequences of 300-700 frames.

frames/s over epochs 2..E (``bench_returnn.py``'s ``rate``: from the end of epoch 1, graph building and
tracing done, to the end of the last), median of ``--runs`` runs taking turns, with the range; each
program with its default threading (TensorFlow's: both cores). Verdict: the engine's median against
``TARGET`` times RETURNN's (the issue's 1.5x). ``--ranks 2 --engine-only --blocks 12 --dim 512``: the
network as written, trained by the engine on 2 ranks (``mpirun``, ``use_horovod``), its frames/s.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile

import numpy as np

from bench_returnn import rate, returnn_version
from bench_returnn_conformer import UPDATER_KEYS, for_returnn
from bench_returnn_ctc_demo import RETURNN_HEAD
from engine.datasets import DataKeyInfo, HDFWriter
from returnn_side import no_returnn, returnn_python
from timing import Row, Side, child_env, compare, interleaved, rnn_command, run_stamped

TARGET = 1.5
DEFAULT_CONFIG = "2021-swb-conformer-hybrid/baseline_12l.config"
TRAINING_KEYS = ("batch_size", "batching", "chunking", "max_seqs") + UPDATER_KEYS
WIDTH_KEYS = ("n_out", "total_key_dim", "groups")
BLOCK_NUMBER = re.compile(r"(?:conformer_block_|transposed_conv_|block_|tconv_|transposedconv_)(\d+)")


def reduced(network: dict, blocks: int, dim: int, full_dim: int = 512) -> dict:
    """The Conformer hybrid's ``network`` with its first ``blocks`` blocks of ``dim`` units.

    Layers named after a later block (``conformer_block_NN_*``, ``transposed_conv_N_res``, the
    auxiliary loss ``*_block_N``, ``transposedconv_N``, ``masked_tconv_N``) are dropped, the ``encoder``
    reads the last kept block's residual; every width that is a multiple of ``full_dim`` / 2 is scaled by
    ``dim / full_dim`` and the heads follow (64 units each)."""
    def number(name: str) -> int:
        found = BLOCK_NUMBER.search(name)
        return int(found.group(1)) if found else 0

    scale = dim / full_dim
    result = {}
    for name, layer in network.items():
        if number(name) > blocks:
            continue
        layer = dict(layer)
        for key in WIDTH_KEYS:
            if isinstance(layer.get(key), int) and layer[key] % (full_dim // 2) == 0:
                layer[key] = int(layer[key] * scale)
        if "num_heads" in layer:
            layer["num_heads"] = layer["total_key_dim"] // 64
        result[name] = layer
    last = f"transposed_conv_{blocks}_res"
    if last not in result or "encoder" not in result:
        sys.exit(f"bench_returnn_conformer_speed: the network has no '{last}' or 'encoder' layer to reduce")
    result["encoder"]["from"] = last
    dangling = {src for layer in result.values() for src in _sources(layer) if src not in result}
    if dangling:
        sys.exit(f"bench_returnn_conformer_speed: the reduced network reads layers it no longer has: "
                 f"{sorted(dangling)}")
    return result


def _sources(layer: dict) -> list[str]:
    sources = layer.get("from", [])
    sources = [sources] if isinstance(sources, str) else list(sources)
    return [s for s in sources + [layer.get("key_shift"), layer.get("size_base")]
            if isinstance(s, str) and not s.startswith("data")]


def make_corpus(path: str, num_seqs: int, input_dim: int, classes: int) -> int:
    """Random features and frame labels; returns the corpus's number of frames."""
    rng = np.random.RandomState(0)
    keys = {"data": DataKeyInfo(dim=input_dim), "classes": DataKeyInfo(dim=classes, sparse=True)}
    frames = 0
    with HDFWriter(path, keys) as writer:
        for i in range(num_seqs):
            length = int(rng.randint(300, 701))
            writer.insert(f"seq-{i}", {"data": rng.standard_normal((length, input_dim)).astype(np.float32),
                                       "classes": rng.randint(0, classes, length)})
            frames += length
    return frames


def write_config(path: str, lines: list[str], returnn: bool) -> str:
    with open(path, "w") as f:
        f.write((RETURNN_HEAD if returnn else "") + "\n".join(lines) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the setup's config, under the checkout")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seqs", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=1, help="the engine's ranks (mpirun, use_horovod)")
    parser.add_argument("--engine-only", action="store_true", help="no RETURNN row (e.g. with --ranks 2)")
    args = parser.parse_args()
    python = returnn_python()
    if python is None and not args.engine_only:
        return no_returnn("bench_returnn_conformer_speed", "nothing is compared")
    from bench_returnn_coverage import config_functions, streams  # the engine's side only: RETURNN's
    from returnn_setups import read_setup  # Python imports this file without the engine

    setup = read_setup(args.checkout, args.config)
    dims = streams(setup.namespace)
    if setup.network is None or dims is None:
        sys.exit(f"bench_returnn_conformer_speed: {args.config} leaves no network dict or stream dims")
    network = reduced(setup.network, args.blocks, args.dim)
    rates = setup.namespace.get("learning_rates")
    training = {k: setup.namespace[k] for k in TRAINING_KEYS if k in setup.namespace}
    training["learning_rate"] = float(rates[0] if rates else setup.namespace.get("learning_rate", 0.001))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.hdf")
        frames = make_corpus(corpus, args.seqs, dims["data"][0], dims["classes"][0])
        extern_data = {k: {"dim": d, "sparse": s} for k, (d, s) in dims.items()}
        common = config_functions(args.checkout, args.config) + [
            f"network = {network!r}", f"extern_data = {extern_data!r}", f"num_epochs = {args.epochs}",
            "log_verbosity = 3"]
        models = {program: os.path.join(tmp, program) for program in ("engine", "returnn")}
        dataset = {"class": "HDFDataset", "files": [corpus], "seq_ordering": "random"}
        engine_config = write_config(os.path.join(tmp, "engine.py"), common + [
            f"train = {dataset!r}", "cache_size = '0'", *(f"{k} = {v!r}" for k, v in training.items()),
            f"model = {os.path.join(models['engine'], 'epoch')!r}"], returnn=False)
        returnn_config = write_config(os.path.join(tmp, "returnn.config"), common + [
            f"train = {dict(dataset, cache_byte_size=0)!r}",
            *(f"{k} = {v!r}" for k, v in for_returnn(training).items()),
            f"model = {os.path.join(models['returnn'], 'epoch')!r}"], returnn=True)
        env = child_env(1 if args.ranks > 1 else None)  # default threading; 1 thread per rank of several
        returnn_env = dict(env, DISABLE_CUDA="1")
        overrides = ["++use_horovod", "1"] if args.ranks > 1 else []

        def measure(program: str, command: list[str], program_env: dict):
            def run() -> float:
                shutil.rmtree(models[program], ignore_errors=True)  # every run trains from scratch
                return rate(run_stamped(command, program_env, timeout=3600), frames, args.epochs)
            return run

        engine = Row(f"engine, {args.ranks} rank(s)", measure(
            "engine", rnn_command(engine_config, args.ranks, overrides, env), env))
        theirs = Row("RETURNN, 1 process", measure(
            "returnn", [python, "-m", "returnn", returnn_config], returnn_env))
        rows = [engine] if args.engine_only else [engine, theirs]
        versions = "" if args.engine_only else f"; {returnn_version(python, child_env(1))}"
        print(f"{args.config} reduced to {args.blocks} blocks of {args.dim}: {len(network)} layers; corpus "
              f"{args.seqs} seqs, {frames} frames{versions}; epochs 2..{args.epochs} timed, {args.runs} "
              "runs per row, taking turns")
        interleaved(rows, args.runs)
    print(f"\n{'run':<24} {'frames/s':>9} {'range':>13}")
    for row in rows:
        print(f"{row.name:<24} {row.median:>9.0f} {row.spread():>13}")
    if args.engine_only:
        return 0
    print(compare(Side.of(engine), Side.of(theirs), f"engine = {engine.median / theirs.median:.2f}x RETURNN, "
                  f"frames/s (target >= {TARGET}x)", better="higher", factor=TARGET, fmt="{:.0f}",
                  failed=[engine, theirs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
