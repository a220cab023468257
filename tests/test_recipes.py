"""RETURNN's own 12AX demos and two classic hybrid BLSTM acoustic-model recipes run as written.

The fixtures in tests/recipes/ name their origin (repository, path, commit) at the top: the same keys
with the same values, sizes trimmed, the Sprint datasets of the hybrid recipes replaced by HDF corpora
written here. Each recipe: ``--check`` gives every key a verdict and none stops the run, and one epoch
trains on 1 and on 2 ranks (real mpirun) with no key ignored.
"""
import re
from pathlib import Path

import numpy as np
import pytest

from engine.config import Config
from engine.datasets import DataKeyInfo, HDFWriter
from engine.key_check import _Logged
from engine.main import main
from helpers import ROOT, run_mpi, run_rnn

RECIPES = ROOT / "tests" / "recipes"
DEMOS = ["chunking-blstm", "contribrnn-lstm", "maxgradnorm-lstm", "native-lstm-lowmem", "native-lstm",
         "native-lstm2", "vanilla-lstm"]
TUNED = "demo-tf-native-lstm2.12ax.tuned.config"  # gradient_clip_norm, gradient_noise, decouple_constraints
SWB = "swb.dropout01.l2_1e_2.6l.n500.inpstddev3.fl2.config"
QUAERO = "quaero.dropout01.l2_1e_2.6l.n500.max_seqs40.adam.lr1e_3.config"
# recipe file -> (its config-code variables, which are no keys; the HDF corpus it reads: dim, train seqs)
CASES = {**{f"demo-tf-{demo}.12ax.config": ({"demo_name"}, None) for demo in DEMOS},
         TUNED: ({"demo_name"}, None),
         SWB: ({"EpochSplit"}, (40, 600)),  # partitionEpoch 6: 100 sequences an epoch
         QUAERO: (set(), (50, 150))}
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


# A recipe asks for a GPU (device = "gpu"); the test machines may have none.
TRAIN_ARGS = ["++num_epochs", "1", "++device", "cpu"]


def assert_trained(r, recipe):
    output = r.stdout + r.stderr
    assert r.returncode == 0, output
    steps = re.search(r"train epoch 1, finished after (\d+) steps", output)
    assert steps and int(steps.group(1)) > 0, output
    assert "finished training after epoch 1" in output and "Ignored as ignore_keys" not in output
    unknown = set(re.findall(r"config key '(\w+)'[^\n]*: not a key of this engine", output))
    assert unknown == CASES[recipe][0], output  # the only warnings: the recipe's own variables


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
@pytest.mark.parametrize("recipe", CASES)
def test_one_epoch_on_one_rank(recipe, tmp_path, corpora):
    r = run_rnn([str(RECIPES / recipe), *TRAIN_ARGS], cwd=workdir(tmp_path, corpora, recipe), timeout=300)
    assert_trained(r, recipe)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("recipe", CASES)
def test_one_epoch_on_two_ranks(recipe, tmp_path, corpora):
    r = run_mpi(2, [str(ROOT / "rnn.py"), str(RECIPES / recipe), *TRAIN_ARGS, "++use_horovod", "1"],
                cwd=workdir(tmp_path, corpora, recipe), timeout=300)
    assert_trained(r, recipe)


@pytest.mark.tf_latest
def test_the_neural_transducer_demo_is_refused_before_anything_runs(capsys):
    """Its output layer class left RETURNN in 2021 and is not in this engine's scope."""
    _Logged.messages.clear()
    assert main([str(RECIPES / "demo-tf-neural-transducer.12ax.config"), "--check"]) == 2
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert "class 'neural_transducer' is a RETURNN layer class this engine does not implement" in last
