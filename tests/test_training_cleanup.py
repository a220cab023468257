"""``save_interval`` and ``cleanup_old_models``: RETURNN's keep rules on hand-made histories, only the run's
own checkpoint files deleted, only by rank 0."""
import os
import re

import pytest

from engine.config.loader import Config
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.cleanup import (CleanupPolicy, cleanup_old_models, default_keep_pattern,
                                                 epochs_to_delete)
from engine.training.update.lr_control import EpochData, LearningRateControl
from helpers import ROOT, run_mpi, run_rnn

pytestmark = pytest.mark.tf_latest


def history(**columns):
    control = LearningRateControl()
    for key, values in columns.items():
        for epoch, value in enumerate(values, start=1):
            if value is not None:
                control.epoch_data.setdefault(epoch, EpochData(0.1)).scores[key] = value
    return control


@pytest.mark.parametrize("newest, pattern", [
    (10, {4, 8, 5, 10}), (30, {20, 5, 10, 20}), (100, {40, 80, 10, 20, 40, 80}),
    (500, {320, 20, 40, 80, 160, 320}), (1000, {640, 20, 40, 80, 160, 320, 640})])
def test_default_keep_pattern(newest, pattern):
    assert default_keep_pattern(newest) == pattern


def test_keeps_pattern_last_and_best_per_score():
    control = history(dev_score=[5, 4, 3.5, 3.6, 3.2, 3.3, 3.1, 3.15, 3.05, 3.08],
                      train_score=[6, 5, 4.5, 4, 3.8, 3.6, 3.5, 3.4, 3.3, 3.2],
                      dev_error=[0.5] * 10)  # the same everywhere: tells nothing
    # pattern {4, 5, 8, 10}, last 2 {9, 10}, best 4 by dev_score {9, 10, 7, 8}
    # and by train_score {10, 9, 8, 7}
    assert epochs_to_delete(range(1, 11), control, CleanupPolicy()) == [1, 2, 3, 6]
    assert epochs_to_delete(range(1, 11), control,
                            CleanupPolicy(2, 1, frozenset({1}))) == [2, 3, 4, 5, 6, 7, 8]
    # not more than keep_best_n
    assert epochs_to_delete([2, 5, 9], control, CleanupPolicy(keep_best_n=3)) == []


def test_best_and_newest_survive_even_without_keep_best_n():
    control = history(dev_score=[5, 4, 3.0, 3.6, 3.2, None])  # epoch 6 has no dev score (yet)
    assert epochs_to_delete(range(1, 7), control, CleanupPolicy(1, 0, frozenset())) == [1, 2, 4, 5]
    # without a dev score an epoch counts as the worst for that key
    assert epochs_to_delete(range(1, 7), control, CleanupPolicy(1, 2, frozenset())) == [1, 2, 4]


def test_only_this_runs_checkpoint_files_are_deleted(tmp_path):
    prefix = str(tmp_path / "net")
    for epoch in range(1, 7):
        open(f"{prefix}.{epoch:03d}", "w").close()
    others = [f"{prefix}.002.tmp-123", f"{prefix}.007", str(tmp_path / "other.001"), f"{prefix}.lr"]
    for path in others:
        open(path, "w").close()
    control = history(dev_score=[6, 5, 4, 3, 2, 1])
    deleted = cleanup_old_models(prefix, 6, control, CleanupPolicy(1, 1, frozenset()))
    assert sorted(deleted) == [f"{prefix}.{e:03d}" for e in (1, 2, 3, 4, 5)]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in others + [f"{prefix}.006"])


@pytest.mark.parametrize("value, message", [
    ({"keep_last": 1}, r"unknown option\(s\) \['keep_last'\]"),
    ({"keep_last_n": 0}, "keep_last_n must be >= 1"),
    ({"keep": 5}, "keep must be a list"), ("yes please", "must be True or a dict")])
def test_bad_options(value, message):
    with pytest.raises(ConfigError, match=message):
        CleanupPolicy.from_config(Config({"cleanup_old_models": value}))
    # RETURNN: an empty dict is off
    assert CleanupPolicy.from_config(Config({"cleanup_old_models": {}})) is None
    assert CleanupPolicy.from_config(Config({"cleanup_old_models": True})) == CleanupPolicy(2, 4, None)


TRAIN = """
train = {"class": "Task12AXDataset", "num_seqs": 20, "fixed_random_seed": 1}
dev = {"class": "Task12AXDataset", "num_seqs": 10, "fixed_random_seed": 2}
network = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 6},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
batch_size = 400
adam = True
learning_rate = 0.02
num_epochs = 5
save_interval = 2
model = %(model)r
learning_rate_file = %(model)r + ".lr"
cleanup_old_models = {"keep_last_n": 1, "keep_best_n": 1, "keep": []}
"""


def expected_files(lr_file, saved, num_epochs):
    """RETURNN's rule for keep_last_n 1, keep_best_n 1, keep [], applied after every epoch: the newest and,
    per score that tells the stored epochs apart, the best (the earliest of equals)."""
    control = LearningRateControl()
    control.load(lr_file)
    stored = []
    for epoch in range(1, num_epochs + 1):
        stored += [epoch] if epoch in saved else []
        if len(stored) <= 1:
            continue
        keep = {stored[-1]}
        for key in {k for e in range(1, epoch + 1) for k in control.epoch_data[e].scores}:
            values = [control.epoch_data[e].scores[key] for e in stored]
            if min(values) != max(values):
                keep.add(min(zip(values, stored))[1])
        stored = [e for e in stored if e in keep]
    return set(stored)


@pytest.mark.version_independent  # which files stay: the checkpoint format is tested on both
@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.mpi)])
def test_training_saves_every_second_epoch_and_cleans_up(tmp_path, ranks):
    cfg = tmp_path / "train.py"
    prefix = str(tmp_path / "net")
    cfg.write_text(TRAIN % {"model": prefix})
    if ranks == 1:
        r = run_rnn([str(cfg)], timeout=300)
    else:
        r = run_mpi(2, [str(ROOT / "rnn.py"), str(cfg), "++use_horovod", "1", "++distributed_backend", "mpi"],
                    timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "could not delete" not in r.stdout + r.stderr
    # every 2nd and the last
    assert re.findall(r"saved model to \S+\.(\d+)", r.stdout) == ["002", "004", "005"]
    stored = sorted(int(name[-3:]) for name in os.listdir(tmp_path) if re.fullmatch(r"net\.\d{3}", name))
    assert set(stored) == expected_files(prefix + ".lr", [2, 4, 5], 5)
    assert 5 in stored


def test_save_interval_must_be_positive(tmp_path):
    from engine.distributed.local_backend import LocalCommunicator
    from engine.distributed.strategy import Strategy
    from engine.tasks.train import Trainer

    config = Config.from_sources([], [])
    exec(TRAIN % {"model": str(tmp_path / "net")}, {}, values := {})
    for key, value in {**values, "save_interval": 0}.items():
        config.set(key, value)
    with pytest.raises(ConfigError, match="'save_interval' must be >= 1"):
        Trainer(config, Strategy(LocalCommunicator()))
