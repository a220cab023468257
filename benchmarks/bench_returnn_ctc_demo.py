#!/usr/bin/env python3
"""RETURNN's own BLSTM-CTC demo (``demos/demo-timit-lstm-ctc.config``) as written, on a synthetic corpus:
the dev score and label error per epoch, this engine beside RETURNN.

    .venv/bin/python benchmarks/bench_returnn_ctc_demo.py [--epochs 3] [--seeds 1,2] [--train 600] [--ranks 2]
        [--corpus-seed 1]

Only the dataset is swapped: the demo reads TIMIT (or NLTK's excerpt) through RETURNN's ``TimitDataset``;
here ``--train`` utterances and 60 dev utterances are synthesised and written as HDF, with the demo's
shapes (80 input dims, 61 phone classes) and about TIMIT's utterance length (2-3 s). Each utterance is
15..40 random phones, each phone 4..11 frames of its own random prototype plus noise, with silence (a
prototype of its own) before, between some and after. ``--corpus-seed`` draws another corpus (other
prototypes and utterances; 1, the default, is the corpus of the runs recorded in docs/config-and-cli.md).
``--ranks N`` runs both programs data-parallel under ``mpirun -np N`` with ``use_horovod = True`` and
RETURNN's defaults (grad mode, summed gradients, ``shard``: rank r takes batches r, r+N, ...;
``--reduce-type param`` with ``--sync-step K``: each rank updates alone and the parameters are averaged
every K steps); RETURNN
then needs Horovod in its Python and runs under the ``mpirun`` beside that Python. RETURNN + Horovod ends
every epoch, dev scoring included, when its first rank runs out of batches, so when the dev batches do not
split evenly over the ranks it scores only the first ones (sorted by length: not the longest); a line
says so, since the dev scores then are not over the same utterances.
The demo's ``ler_39`` layer maps the 61 phones to 39 with ``TimitDataset.get_label_map()``; the corpus
has no phonetics, so here the map folds phone ``i`` onto ``i % 39``. Everything else (network, nadam,
``gradient_noise = 0.1``, L2 and darc1, newbob, batching) is the demo's. ``num_epochs`` is ``--epochs``;
``--no-darc1`` and ``--gradient-noise`` change the recipe on both sides (RETURNN 1.20261022 on TensorFlow
2.15 fails to build ``darc1``: its mask does not broadcast against the output).

Each ``--seeds`` value is one run of each program with that ``random_seed`` (the corpus stays the same), so
the spread between seeds shows what a difference between the programs means. As in RETURNN, the seed
changes the initial values and the noise, not the data order. ``--same-start`` takes the random draws out
of the comparison: RETURNN initialises the network once (``task = "initialize_model"``, the first seed)
and both programs start from that checkpoint (``import_model_train_epoch1``); with ``--gradient-noise 0``
and no dropout (the demo has none) they then train on the same batches in the same order from the same
values, and their curves may differ only by float rounding. RETURNN runs where
``$RETURNN_PYTHON`` or ``/tmp/returnn-venv/bin/python`` has it (``bench_returnn.py``); else its rows are
left out with one line. Prints, per program and seed, the dev score and the dev label error of the
``output`` layer (61 phones; RETURNN's ``dev_score_output`` and ``dev_error_output``, the engine's
``dev_score`` and ``dev_error``) after each epoch, read from the learning-rate file each writes.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench_returnn import returnn_python
from engine.config.loader import Config
from engine.datasets import DataKeyInfo, HDFWriter, dataset_from_config
from engine.datasets.batching import BatchOptions, generate_batches
from timing import ROOT, child_env

INPUT_DIM, PHONES = 80, 61

DEMO = """
num_outputs = {{'data': (40*2, 2), 'classes': (61, 1)}}
num_inputs = num_outputs["data"][0]
num_seqs = {{'train': {num_train}, 'dev': 60}}
EpochSplit = 1
SeqOrderTrainBins = num_seqs["train"] // 10
TrainSeqOrder = "laplace:%i" % SeqOrderTrainBins
train = {{"class": "HDFDataset", "files": [{train!r}], "seq_ordering": TrainSeqOrder}}
dev = {{"class": "HDFDataset", "files": [{dev!r}], "seq_ordering": "sorted"}}
cache_size = "0"
window = 1
network = {{
"fwd0": {{"class": "rec", "unit": "nativelstm2", "direction": 1, "L2": 0.01, "dropout": 0., "n_out": 250}},
"bwd0": {{"class": "rec", "unit": "nativelstm2", "direction": -1, "L2": 0.01, "dropout": 0., "n_out": 250}},
"fwd1": {{"class": "rec", "unit": "nativelstm2", "direction": 1, "L2": 0.01, "dropout": 0., "n_out": 250,
          "from": ["fwd0", "bwd0"]}},
"bwd1": {{"class": "rec", "unit": "nativelstm2", "direction": -1, "L2": 0.01, "dropout": 0., "n_out": 250,
          "from": ["fwd0", "bwd0"]}},
"fwd2": {{"class": "rec", "unit": "nativelstm2", "direction": 1, "L2": 0.01, "dropout": 0., "n_out": 250,
          "from": ["fwd1", "bwd1"]}},
"bwd2": {{"class": "rec", "unit": "nativelstm2", "direction": -1, "L2": 0.01, "dropout": 0., "n_out": 250,
          "from": ["fwd1", "bwd1"]}},
"output": {{"class": "softmax", "loss": "ctc", "target": "classes", "from": ["fwd2", "bwd2"]{darc1}}},
"ler_39": {{"class": "copy", "from": ["output"], "only_on_eval": True,
    "loss": "edit_distance", "loss_opts": {{"ctc_decode": True, "label_map": {label_map!r}}}}}
}}
batching = "random"
batch_size = 2000
max_seqs = 64
max_seq_length = batch_size
truncation = -1
num_epochs = {epochs}
model = {model!r}
cleanup_old_models = True
learning_rate_file = {lr_file!r}
optimizer = {{"class": "nadam"}}
gradient_noise = {noise}
learning_rate = 0.001
learning_rate_control = "newbob_multi_epoch"
learning_rate_control_relative_error_relative_lr = True
learning_rate_control_min_num_epochs_per_new_lr = 3
newbob_learning_rate_decay = 0.8
newbob_multi_num_epochs = 6
newbob_multi_update_interval = 1
random_seed = {seed}
log_verbosity = 3
"""
RETURNN_HEAD = """#!rnn.py
use_tensorflow = True
task = "train"
device = "cpu"
"""


def make_corpus(path: str, num_seqs: int, seed: int, prototypes: np.ndarray) -> None:
    rng = np.random.RandomState(seed)
    keys = {"data": DataKeyInfo(dim=INPUT_DIM), "classes": DataKeyInfo(dim=PHONES, sparse=True)}
    with HDFWriter(path, keys) as writer:
        for i in range(num_seqs):
            phones = rng.randint(0, PHONES, rng.randint(15, 41))
            frames = [prototypes[PHONES]] * rng.randint(2, 6)  # leading silence
            for phone in phones:
                frames += [prototypes[phone]] * rng.randint(4, 12)
                if rng.rand() < 0.3:
                    frames += [prototypes[PHONES]] * rng.randint(1, 4)
            frames += [prototypes[PHONES]] * rng.randint(2, 6)
            features = np.array(frames) + 0.5 * rng.standard_normal((len(frames), INPUT_DIM))
            writer.insert(f"seq-{i}", {"data": features.astype(np.float32), "classes": phones})


def write_config(folder: str, name: str, corpus: dict, epochs: int, seed: int, returnn: bool,
                 changes: argparse.Namespace, extra: str = "") -> str:
    run = os.path.join(folder, name)
    os.makedirs(run, exist_ok=True)
    text = DEMO.format(num_train=corpus["num_train"], train=corpus["train"], dev=corpus["dev"], epochs=epochs,
                       model=os.path.join(run, "model"), lr_file=os.path.join(run, "newbob.data"),
                       label_map={i: i % 39 for i in range(PHONES)}, seed=seed,
                       darc1="" if changes.no_darc1 else ', "darc1": 0.001', noise=changes.gradient_noise)
    path = os.path.join(folder, f"{name}.config")
    with open(path, "w") as f:
        f.write((RETURNN_HEAD if returnn else "") + text + extra)
    return path


def program_command(program: str, python: str, ranks: int) -> list[str]:
    """The command that runs ``program`` ("engine" or "returnn", whose Python is ``python``) on ``ranks``
    ranks: each under the ``mpirun`` of its own environment (RETURNN's Horovod is built against the Open
    MPI beside its Python)."""
    command = [python, os.path.join(ROOT, "rnn.py")] if program == "engine" else [python, "-m", "returnn"]
    if ranks == 1:
        return command
    mpirun = os.path.join(os.path.dirname(python), "mpirun")
    return [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(ranks), *command]


def returnn_dev_batches_scored(num_batches: int, ranks: int) -> int:
    """How many of the dev batches RETURNN + Horovod (``shard``) scores: rank r holds batches r, r+N, ...,
    and all ranks stop when the first has none left (``Runner._horovod_signal_broadcast``)."""
    return (num_batches // ranks) * ranks


def dev_batches(dev: str) -> int:
    """The demo's dev batches (``sorted``, ``batch_size`` 2000, ``max_seqs`` 64), as both programs make
    them."""
    spec = {"class": "HDFDataset", "files": [dev], "seq_ordering": "sorted"}
    config = Config.from_sources([], [("dev", repr(spec)), ("batch_size", "2000"), ("max_seqs", "64"),
                                      ("max_seq_length", "2000")])
    dataset = dataset_from_config(config, "dev")
    dataset.init_seq_order(1)
    return sum(1 for _ in generate_batches(dataset, BatchOptions.from_config(config, train=False),
                                           keys=["data", "classes"]))


def curve(lr_file: str, epochs: int) -> list[tuple[float, float]]:
    """(dev score, dev label error) per epoch, from a learning-rate file (both programs write one)."""
    from engine.training.update.lr_history import read_history_file

    history = read_history_file(lr_file)
    rows = []
    for epoch in range(1, epochs + 1):
        errors = history[epoch].scores
        score = errors.get("dev_score", errors.get("dev_score_output"))
        ler = errors.get("dev_error", errors.get("dev_error_output"))
        rows.append((score, ler))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--train", type=int, default=600)
    parser.add_argument("--ranks", type=int, default=1, help="data-parallel ranks of each run (mpirun)")
    parser.add_argument("--corpus-seed", type=int, default=1,
                        help="which synthetic corpus (1: the recorded one)")
    parser.add_argument("--folder", help="keep the corpus and runs here (default: a temporary folder)")
    parser.add_argument("--no-darc1", action="store_true",
                        help="leave out the output layer's darc1 (RETURNN 1.20261022 on TF 2.15 cannot "
                        "build it)")
    parser.add_argument("--gradient-noise", type=float, default=0.1, help="the demo's is 0.1")
    parser.add_argument("--reduce-type", choices=("grad", "param"), default="grad",
                        help="horovod_reduce_type of both programs with --ranks above 1")
    parser.add_argument("--sync-step", type=int, default=1,
                        help="horovod_param_sync_step of both programs with --reduce-type param")
    parser.add_argument("--programs", default="engine,returnn")
    parser.add_argument("--same-start", action="store_true",
                        help="both programs start from one initial checkpoint that RETURNN writes")
    args = parser.parse_args()
    folder = args.folder or tempfile.mkdtemp(prefix="bench-ctc-demo-")
    # corpus seed 1 keeps the corpus of the recorded runs: prototypes from 0, train from 1, dev from 2
    base = 3 * (args.corpus_seed - 1)
    prototypes = np.random.RandomState(base).standard_normal((PHONES + 1, INPUT_DIM))
    corpus = {"num_train": args.train, "train": os.path.join(folder, "train.hdf"),
              "dev": os.path.join(folder, "dev.hdf")}
    if not os.path.exists(corpus["train"]):
        make_corpus(corpus["train"], args.train, base + 1, prototypes)
        make_corpus(corpus["dev"], 60, base + 2, prototypes)
    if args.ranks > 1:
        batches = dev_batches(corpus["dev"])
        scored = returnn_dev_batches_scored(batches, args.ranks)
        if scored != batches:
            print(f"note: the dev set makes {batches} batches; RETURNN + Horovod on {args.ranks} ranks "
                  f"scores only the first {scored}, so its dev scores are not over the same utterances"
                  " as the engine's.")
    returnn = returnn_python()
    if returnn is None:
        print("RETURNN: not found ($RETURNN_PYTHON or /tmp/returnn-venv/bin/python); its rows are left out.")
    programs = [("engine", program_command("engine", sys.executable, args.ranks))]
    if returnn:
        programs.append(("returnn", program_command("returnn", returnn, args.ranks)))
    programs = [(name, command) for name, command in programs if name in args.programs.split(",")]
    start = "\nuse_horovod = True\n" if args.ranks > 1 else ""
    if args.ranks > 1 and args.reduce_type == "param":
        start += f'horovod_reduce_type = "param"\nhorovod_param_sync_step = {args.sync_step}\n'
    if args.same_start:
        if returnn is None:
            print("--same-start needs RETURNN, which was not found.")
            return 2
        init = os.path.join(folder, "init", "model")
        seed = int(args.seeds.split(",")[0])
        config = write_config(folder, "init", corpus, args.epochs, seed, True, args,
                              '\ntask = "initialize_model"\n')
        done = subprocess.run([returnn, "-m", "returnn", config], env=child_env(extra={"DISABLE_CUDA": "1"}),
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            print(f"RETURNN could not initialise the network (exit {done.returncode}): {config}")
            return 1
        start += f"\nimport_model_train_epoch1 = {init!r}\n"
        print(f"both programs start from {init} (RETURNN's initial values, random_seed {seed})")
    results = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for program, command in programs:
            name = f"{program}-seed{seed}"
            config = write_config(folder, name, corpus, args.epochs, seed, program == "returnn", args, start)
            env = child_env(extra={"DISABLE_CUDA": "1"} if program == "returnn" else None)
            if program == "returnn":  # its mpirun's daemons and Open MPI first
                env["PATH"] = os.path.dirname(command[0]) + os.pathsep + env["PATH"]
            with open(os.path.join(folder, f"{name}.log"), "w") as log:
                done = subprocess.run(command + [config], env=env, stdout=log, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                print(f"{name}: FAILED (exit {done.returncode}); see {log.name}")
                continue
            results[name] = curve(os.path.join(folder, name, "newbob.data"), args.epochs)
            epochs = [f"epoch {e + 1}: score {s:.3f} ler {100 * err:.1f} %"
                      for e, (s, err) in enumerate(results[name])]
            print(f"{name}: " + "  ".join(epochs), flush=True)
    print(f"\nfolder: {folder}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
