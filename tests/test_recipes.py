"""RETURNN's own 12AX demos and two classic hybrid BLSTM acoustic-model recipes run as written.

The fixtures in tests/recipes/ name their origin (repository, path, commit) at the top: the same keys
with the same values, sizes trimmed, the Sprint datasets of the hybrid recipes replaced by HDF corpora
written here. Each recipe: ``--check`` gives every key a verdict and none stops the run, and one epoch
trains with no key ignored: on 1 rank on the newest TensorFlow, on 2 ranks (real mpirun) on TensorFlow
2.15 with Horovod. The epoch is short, to keep the suite's time: the 12AX demos' 1000 training sequences
are split into 5 epochs on the command line (the dataset's own ``partition_epoch``), and the HDF corpora
of the hybrid recipes are small. What the runs computed is checked too: 1 and 2 ranks (grad mode) agree
on the loss of the first step over the same sequences, and a recipe's chunking gives the steps and frames
that RETURNN's chunk arithmetic says.
"""
import math
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from engine.config.key_check import _Logged
from engine.config.loader import Config
from engine.datasets import DataKeyInfo, HDFWriter
from engine.main import main
from helpers import ROOT, run_mpi, run_rnn
from test_report_tensorboard import read_curves

RECIPES = ROOT / "tests" / "recipes"
DEMOS = ["chunking-blstm", "contribrnn-lstm", "maxgradnorm-lstm", "native-lstm-lowmem", "native-lstm",
         "native-lstm2", "vanilla-lstm"]
TUNED = "demo-tf-native-lstm2.12ax.tuned.config"  # gradient_clip_norm, gradient_noise, decouple_constraints
VANILLA = "demo-tf-vanilla-lstm.12ax.config"
SWB = "swb.dropout01.l2_1e_2.6l.n500.inpstddev3.fl2.config"
QUAERO = "quaero.dropout01.l2_1e_2.6l.n500.max_seqs40.adam.lr1e_3.config"
# recipe file -> (its config-code variables, which are no keys; the HDF corpus it reads: dim, train seqs)
CASES = {**{f"demo-tf-{demo}.12ax.config": ({"demo_name"}, None) for demo in DEMOS},
         TUNED: ({"demo_name"}, None),
         SWB: ({"EpochSplit"}, (40, 240)),  # partitionEpoch 6: 40 sequences an epoch
         QUAERO: (set(), (50, 60))}
NUM_CLASSES = 12


def write_corpus(path: Path, dim: int, num_seqs: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = {"data": DataKeyInfo(dim=dim), "classes": DataKeyInfo(dim=NUM_CLASSES, sparse=True)}
    with HDFWriter(str(path), keys) as writer:
        for i in range(num_seqs):
            frames = int(rng.integers(30, 120))
            data = rng.standard_normal((frames, dim)).astype(np.float32)
            classes = rng.integers(0, NUM_CLASSES, frames).astype(np.int32)
            writer.insert(f"corpus/seq-{i}", {"data": data, "classes": classes})


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """data/train.hdf and data/cv.hdf for each corpus shape, written once."""
    root = tmp_path_factory.mktemp("corpora")
    for dim, num_seqs in {corpus for _, corpus in CASES.values() if corpus}:
        data = root / f"{dim}x{num_seqs}" / "data"
        data.mkdir(parents=True)
        write_corpus(data / "train.hdf", dim, num_seqs, seed=1)
        write_corpus(data / "cv.hdf", dim, 20, seed=2)
    return root


def workdir(tmp_path: Path, corpora: Path, recipe: str) -> Path:
    """Where the recipe runs: its relative paths (data/, net-model/, log/) resolve here."""
    corpus = CASES[recipe][1]
    if corpus:
        (tmp_path / "data").symlink_to(corpora / f"{corpus[0]}x{corpus[1]}" / "data")
    return tmp_path


# A recipe asks for a GPU (device = "gpu"); the test machines may have none. TensorBoard gets every
# step's score (float32), which the checks below compare.
TRAIN_ARGS = ["++num_epochs", "1", "++device", "cpu", "++tensorboard_step_interval", "1"]
# epoch 1 of a 12AX demo: 200 of its 1000 sequences (20 batches of max_seqs 10)
SHORT_12AX_EPOCH = ["++train", repr({"class": "Task12AXDataset", "num_seqs": 1000, "partition_epoch": 5})]


STEPS_LINE = re.compile(r"^train epoch 1, finished after (\d+) steps", re.M)
FRAMES_LINE = re.compile(r"^train epoch 1: [\d.]+ frames/sec \((\d+) frames", re.M)


def train_args(recipe: str) -> list[str]:
    return TRAIN_ARGS + (SHORT_12AX_EPOCH if recipe.startswith("demo-tf-") else [])


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpora):
    """``get(recipe, ranks, *overrides)``: one epoch of the recipe on 1 rank (rnn.py) or more (real
    mpirun, grad mode), run once per module; returns (the finished process, its working directory, where
    ``tensorboard/`` holds its curves)."""
    runs = {}

    def get(recipe: str, ranks: int, *overrides: str):
        key = (recipe, ranks, overrides)
        if key not in runs:
            folder = workdir(tmp_path_factory.mktemp("run"), corpora, recipe)
            args = [str(RECIPES / recipe), *train_args(recipe), "++tensorboard_dir",
                    str(folder / "tensorboard"), *overrides]
            if ranks == 1:
                r = run_rnn(args, cwd=folder, timeout=300)
            else:
                r = run_mpi(ranks, [str(ROOT / "rnn.py"), *args, "++use_horovod", "1"], cwd=folder,
                            timeout=300)
            runs[key] = r, folder
        return runs[key]

    return get


def assert_trained(r, recipe):
    output = r.stdout + r.stderr
    assert r.returncode == 0, output
    steps = STEPS_LINE.search(output)
    assert steps and int(steps.group(1)) > 0, output
    assert "finished training after epoch 1" in output and "Ignored as ignore_keys" not in output
    unknown = set(re.findall(r"config key '(\w+)'[^\n]*: not a key of this engine", output))
    assert unknown == CASES[recipe][0], output  # the only warnings: the recipe's own variables


def epoch_steps_and_frames(r) -> tuple[int, int]:
    """From the epoch's lines: its train steps and the frames it trained on."""
    output = r.stdout + r.stderr
    assert r.returncode == 0, output
    steps, frames = STEPS_LINE.search(output), FRAMES_LINE.search(output)
    assert steps and frames, output
    return int(steps.group(1)), int(frames.group(1))


def first_step_score(folder: Path) -> float:
    (step, score), *_ = read_curves(folder / "tensorboard")["train/score"]
    assert step == 1
    return score


@pytest.mark.tf_latest
@pytest.mark.parametrize("recipe", CASES)
def test_check_gives_every_key_a_verdict_and_none_stops_training(recipe, tmp_path, corpora, capsys,
                                                                 monkeypatch):
    monkeypatch.chdir(workdir(tmp_path, corpora, recipe))
    _Logged.messages.clear()
    status = main([str(RECIPES / recipe), "--check"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.rstrip().splitlines()[-1].startswith("Training would start"), out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    keys = Config.from_sources([str(RECIPES / recipe)], []).keys()
    assert set(keys) <= {row[0] for row in rows}  # every top-level key has its line
    verdicts = {row[0]: " ".join(row[1:]) for row in rows}
    assert {key for key in keys if verdicts[key].startswith("unknown")} == CASES[recipe][0]
    assert "NOT IMPLEMENTED" not in out and "UNKNOWN" not in out


@pytest.mark.slow
@pytest.mark.tf_latest
@pytest.mark.newest_tf_only  # on TensorFlow 2.15: the 2-rank run below (and 1 rank in the tests after it)
@pytest.mark.parametrize("recipe", CASES)
def test_one_epoch_on_one_rank(recipe, trained):
    assert_trained(trained(recipe, 1)[0], recipe)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("recipe", CASES)
def test_one_epoch_on_two_ranks(recipe, trained):
    assert_trained(trained(recipe, 2)[0], recipe)


@pytest.mark.slow
@pytest.mark.mpi
def test_one_and_two_ranks_agree_on_the_first_steps_loss(trained):
    """The 12AX LSTM demo (no dropout, whose masks differ per rank). 2 ranks in grad mode train batches 0
    and 1 of the epoch's plan in their first step (max_seqs 10: 200 sequences of at most 200 frames
    after chunking, so batch_size 5000 never binds: 20 batches of 10); 1 rank with max_seqs 20 trains
    the same 20 sequences as its batch 0, from the same initial parameters. The first step's score (the
    ranks' loss sums added over their frames) must be the one process's to float32 rounding."""
    two, two_dir = trained(VANILLA, 2)
    one, one_dir = trained(VANILLA, 1, "++max_seqs", "20")
    np.testing.assert_allclose(first_step_score(two_dir), first_step_score(one_dir), rtol=1e-5)
    # every sequence once, in as many steps: 10 batches of 20, or 20 of 10 taken two at a time
    steps, frames = epoch_steps_and_frames(two)
    assert (steps, frames) == epoch_steps_and_frames(one) and steps == 10
    # the comparison can tell batches apart: batch 0 alone (the recipe on 1 rank) scores otherwise
    alone, alone_dir = trained(VANILLA, 1)
    assert epoch_steps_and_frames(alone)[0] == 20
    assert abs(first_step_score(alone_dir) - first_step_score(one_dir)) > 1e-3


@pytest.mark.slow
@pytest.mark.mpi
def test_chunking_gives_the_steps_and_frames_of_the_chunk_arithmetic(trained, corpora):
    """The Quaero recipe's ``chunking = "50:25"``: a sequence of L frames gives the chunks [25 j,
    min(25 j + 50, L)) for 25 j < L; ``max_seqs`` 40 counts chunks (40 x 50 frames: batch_size 5000
    never binds), so the epoch has ceil(chunks / 40) batches; 2 ranks take them two at a time and drop
    an odd last one. Without chunking, 60 sequences would train in 2 steps on their plain frames."""
    config = Config.from_sources([str(RECIPES / QUAERO)], [])
    size, step = (int(n) for n in config.value("chunking").split(":"))
    max_seqs = config.int("max_seqs")
    with h5py.File(corpora / "50x60" / "data" / "train.hdf", "r") as f:
        lengths = [int(n) for n in f["seqLengths"][:, 0]]
    chunks = [min(size, length - start) for length in lengths for start in range(0, length, step)]
    batches = math.ceil(len(chunks) / max_seqs)
    assert (size, step, max_seqs) == (50, 25, 40) and len(chunks) > 2 * len(lengths)
    assert epoch_steps_and_frames(trained(QUAERO, 1)[0]) == (batches, sum(chunks))
    steps, frames = epoch_steps_and_frames(trained(QUAERO, 2)[0])
    assert steps == batches // 2
    assert frames == sum(chunks) if batches % 2 == 0 else frames < sum(chunks)


@pytest.mark.tf_latest
def test_the_neural_transducer_demo_is_refused_before_anything_runs(capsys):
    """Its output layer class left RETURNN in 2021 and is not in this engine's scope."""
    _Logged.messages.clear()
    assert main([str(RECIPES / "demo-tf-neural-transducer.12ax.config"), "--check"]) == 2
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert "class 'neural_transducer' is a RETURNN layer class this engine does not implement" in last
