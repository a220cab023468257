"""``random_seed`` seeds what ``--help`` says: the initial parameters and dropout; as in RETURNN, not the
data's order, which the epoch, ``random_seed_offset`` and ``fixed_random_seed`` decide."""
from __future__ import annotations

import numpy as np
import pytest

from engine.config.cli import help_text
from engine.config.loader import Config
from engine.datasets import Batch, dataset_from_config
from engine.datasets.ordering import epoch_order, parse_seq_ordering
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.strategy import Strategy
from engine.model import build_model
from engine.training.step import Steps
from engine.training.update.updater import Updater, optimizer_from_config

pytestmark = pytest.mark.tf_latest
TRAIN = {"class": "Task12AXDataset", "num_seqs": 30, "seq_ordering": "random"}


def train_order(random_seed: int, spec: dict = TRAIN, key: str = "train", offset: int = 0) -> list[int]:
    dataset = dataset_from_config(Config({key: spec, "random_seed": random_seed}), key,
                                  random_seed_offset=offset)
    dataset.init_seq_order(2)
    return dataset.order.tolist()


def test_help_names_what_random_seed_seeds():
    line = next(line for line in help_text().splitlines() if line.strip().startswith("random_seed "))
    assert "initial parameters" in line and "dropout" in line and "not the data's order" in line, line


def test_every_seed_orders_the_train_data_as_returnn_and_the_offset_still_changes_it():
    returnn = epoch_order(parse_seq_ordering("random"), num_seqs=30, epoch=2, get_lengths=lambda: None)
    assert train_order(42) == train_order(7) == train_order(8) == returnn.tolist()  # epoch + offset only
    # the per-rank offset (random_seed_offset distribution) still gives each rank its own order
    assert train_order(7, offset=16127) == train_order(42, offset=16127) != train_order(7)
    fixed = dict(TRAIN, fixed_random_seed=3)
    assert train_order(7, fixed) == train_order(42, fixed) != train_order(7)


def one_step_params(random_seed: int, init_seed: int = 1) -> np.ndarray:
    """Parameters after one train step with dropout, from the same initial parameters."""
    network = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 16, "dropout": 0.5},
               "output": {"class": "softmax", "loss": "ce", "from": "hidden", "dropout": 0.5}}
    model = build_model(network, input_dim=5, input_sparse=False, target_dims={"classes": 3},
                        random_seed=init_seed)
    updater = Updater(model.named_trainable_variables(), optimizer_from_config("sgd"), learning_rate=0.5,
                      random_seed=random_seed)
    steps = Steps(model, updater, Strategy(LocalCommunicator()))
    rng = np.random.RandomState(0)
    lengths = np.array([6, 4], np.int32)
    batch = Batch(data={"data": rng.randn(2, 6, 5).astype(np.float32), "classes": rng.randint(0, 3, (2, 6))},
                  lengths={"data": lengths, "classes": lengths}, seq_tags=["a", "b"], seq_idx=np.arange(2),
                  corpus_seq_idx=np.arange(2), num_frames={"data": 10, "classes": 10})
    steps.train(batch)
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])


def test_random_seed_keys_dropout_and_the_initial_parameters():
    assert np.array_equal(one_step_params(7), one_step_params(7))  # dropout: a function of the seed
    assert not np.array_equal(one_step_params(7), one_step_params(8))  # other masks, same start
    assert not np.array_equal(one_step_params(7, init_seed=2), one_step_params(7))
