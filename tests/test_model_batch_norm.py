"""RETURNN's ``batch_norm`` layer: training and eval against RETURNN's numbers (tests/fixtures/
returnn_batch_norm, written by benchmarks/returnn_batch_norm_train.py; the eval fixture of
tests/fixtures/returnn_ckpt covers loading RETURNN's checkpoint), the formula against numpy, the running
statistics (stored once per train step, moved and put back by a dev pass, no gradient, L2 or optimizer
state, averaged over ranks), RETURNN's names, and the refusals."""
from __future__ import annotations

import contextlib
import json
import sys

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.strategy import Strategy
from engine.model import build_model
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.returnn_format import ReturnnView
from engine.training.running_state import average_running_state
from engine.training.step import Steps
from engine.training.update.optimizer_config import optimizer_for_config
from engine.training.update.updater import Updater
from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from returnn_batch_norm_train import TOLERANCE, differences, engine_steps  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "returnn_batch_norm"
VARIANTS = json.loads((FIXTURES / "cases.json").read_text())["cases"]
LENGTHS = np.array([5, 3], np.int32)


def model_of(bn: dict, n_in: int = 3, loss: bool = False):
    network = {"bn": {"class": "batch_norm", "from": "data", **bn},
               "output": {"class": "softmax", "loss": "ce", "from": "bn"} if loss else
               {"class": "copy", "from": "bn"}}
    return build_model(network, input_dim=n_in, input_sparse=False, target_dims={"classes": 2})


def batch(seed: int = 0, n_in: int = 3, padding: float = 0.0) -> np.ndarray:
    data = (np.random.RandomState(seed).standard_normal((2, 5, n_in)) * 2 + 1).astype(np.float32)
    data[1, LENGTHS[1]:] = padding
    return data


def valid_frames(data: np.ndarray) -> np.ndarray:
    return np.concatenate([data[b, :n] for b, n in enumerate(LENGTHS)])


def stats(model) -> tuple[np.ndarray, np.ndarray]:
    layer = model.layers["bn"]
    return layer.params["mean"].numpy().ravel(), layer.params["variance"].numpy().ravel()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_training_and_eval_steps_give_returnns_outputs_gradients_and_statistics(variant):
    expected = np.load(FIXTURES / f"{variant}.npz")
    init = {k[5:]: expected[k] for k in expected.files if k.startswith("init:")}
    found = differences(expected, engine_steps(variant, init), variant)
    assert any(":stat:" in k for k in found) and any(k.startswith("eval") for k in found)
    assert max(found.values()) <= TOLERANCE, found


def test_defaults_are_returnns_of_behavior_version_0_against_numpy():
    """momentum 0.99, epsilon 1e-3; training normalises by the batch's statistics over the valid frames and
    moves the running ones; eval uses the running ones moved towards this batch's (not delayed)."""
    model = model_of({})
    layer = model.layers["bn"]
    gamma, beta = np.array([1.5, -0.5, 2.0], np.float32), np.array([0.1, 0.2, -0.3], np.float32)
    mean0, var0 = np.array([0.5, -1.0, 2.0], np.float32), np.array([2.0, 0.5, 1.0], np.float32)
    for key, value in (("gamma", gamma), ("beta", beta), ("mean", mean0), ("variance", var0)):
        layer.params[key].assign(value.reshape(1, 1, 3))
    data = batch()
    frames = valid_frames(data)
    mb, vb = frames.mean(0), frames.var(0)
    out = model(data, LENGTHS, training=True)["bn"].numpy()
    want = (data - mb) / np.sqrt(vb + 1e-3) * gamma + beta
    np.testing.assert_allclose(valid_frames(out), valid_frames(want), atol=2e-5)
    mean1, var1 = mean0 + (mb - mean0) * 0.99, var0 + (vb - var0) * 0.99
    np.testing.assert_allclose(stats(model), (mean1, var1), atol=2e-6)
    stored = stats(model)
    out = model(data, LENGTHS)["bn"].numpy()  # eval: the running values moved by this batch, not stored
    mean2, var2 = mean1 + (mb - mean1) * 0.99, var1 + (vb - var1) * 0.99
    want = (data - mean2) / np.sqrt(var2 + 1e-3) * gamma + beta
    np.testing.assert_allclose(valid_frames(out), valid_frames(want), atol=2e-5)
    np.testing.assert_array_equal(stats(model), stored)
    model(data, LENGTHS, update_running=True)  # as the eval step calls it: stored
    np.testing.assert_allclose(stats(model), (mean2, var2), atol=2e-6)


def test_padding_changes_neither_outputs_nor_statistics():
    results = []
    for padding in (0.0, 1e4):
        model = model_of({"momentum": 0.5})
        out = model(batch(padding=padding), LENGTHS, training=True)["bn"].numpy()
        results.append((valid_frames(out), *stats(model)))
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)


def test_running_statistics_are_saved_but_get_no_gradient_l2_or_optimizer_state():
    model = model_of({"param_version": 2}, loss=True)
    model.l2["bn"] = 0.1
    assert set(model.running_state()) == {"bn/mean", "bn/variance"}
    assert {"bn/mean", "bn/variance", "bn/gamma", "bn/beta"} <= set(model.named_variables())
    assert set(model.named_trainable_variables()) == {"bn/gamma", "bn/beta", "output/W", "output/b"}
    assert set(model.l2_factors()) == {"bn/gamma", "bn/beta"}
    updater = Updater(model.named_trainable_variables(), optimizer_for_config(Config({"adam": True})))
    assert not any("mean" in name or "variance" in name for name in updater.named_variables())


def one_batch(seed: int = 0):
    class Batch:
        data = {"data": batch(seed), "classes": np.zeros((2, 5), np.int32)}
        lengths = {"data": LENGTHS, "classes": LENGTHS}
    return Batch


def test_a_train_step_stores_the_statistics_once_and_a_dev_pass_puts_them_back():
    model = model_of({"momentum": 0.5}, loss=True)
    updater = Updater(model.named_trainable_variables(), optimizer_for_config(Config({"optimizer": "sgd"})))
    steps = Steps(model, updater, Strategy(LocalCommunicator()))
    frames = valid_frames(batch())
    steps.train(one_batch())
    np.testing.assert_allclose(stats(model), (0.5 * frames.mean(0), 0.5 + 0.5 * frames.var(0)), atol=2e-6)
    trained = stats(model)
    with steps.kept_running_state():  # what loop.evaluate does around a dev pass
        steps.eval(one_batch(1))
        assert not np.allclose(stats(model)[0], trained[0])  # eval moves them, as RETURNN's does
    np.testing.assert_array_equal(stats(model), trained)
    assert steps.output_dim() == 2  # the softmax over the 2 classes
    np.testing.assert_array_equal(stats(model), trained)  # the probe leaves them alone


def test_update_sample_only_in_training_keeps_eval_from_moving_them():
    model = model_of({"update_sample_only_in_training": True}, loss=True)
    steps = Steps(model)
    steps.eval(one_batch())
    np.testing.assert_array_equal(stats(model), (np.zeros(3), np.ones(3)))


class TwoRanks:
    """A communicator of two ranks whose other rank holds ``other``."""

    size = 2

    def __init__(self, other: list[np.ndarray]) -> None:
        self.other = other

    def stall_guard(self, what):
        return contextlib.nullcontext()

    def allreduce(self, arrays, op="sum"):
        assert op == "average"
        return [(a + b) / 2 for a, b in zip(arrays, self.other)]


def test_ranks_average_their_running_statistics():
    model = model_of({})
    layer = model.layers["bn"]
    layer.params["mean"].assign(np.full((1, 1, 3), 2.0, np.float32))
    gamma = layer.params["gamma"].numpy()
    average_running_state(TwoRanks([np.zeros((1, 1, 3)), np.full((1, 1, 3), 3.0)]), model)
    np.testing.assert_array_equal(stats(model), (np.full(3, 1.0), np.full(3, 2.0)))
    np.testing.assert_array_equal(layer.params["gamma"].numpy(), gamma)  # parameters are the gradients' job


@pytest.mark.parametrize("version, prefix, shape", [(0, "bn_bn_output_", (1, 1, 3)), (1, "", (1, 1, 3)),
                                                    (2, "v2_", (3,))])
def test_returnns_names_and_shapes(version, prefix, shape):
    model = model_of({"param_version": version, "use_shift": False})
    assert ReturnnView(model).shapes() == {f"bn/batch_norm/{prefix}{key}": shape
                                           for key in ("mean", "variance", "gamma")}


def test_gamma_and_beta_take_initializers():
    model = model_of({"gamma_init": 0.5, "beta_init": "random_normal_initializer(stddev=0.1)"})
    layer = model.layers["bn"]
    np.testing.assert_array_equal(layer.params["gamma"].numpy(), np.full((1, 1, 3), 0.5))
    assert 0 < np.abs(layer.params["beta"].numpy()).max() < 1


def test_trainable_false_freezes_gamma_and_beta_and_still_updates_statistics():
    model = build_model({"bn": {"class": "batch_norm", "from": "data", "trainable": False},
                         "output": {"class": "softmax", "loss": "ce", "from": "bn"}},
                        input_dim=3, input_sparse=False, target_dims={"classes": 2})
    assert set(model.named_trainable_variables()) == {"output/W", "output/b"}
    model(batch(), LENGTHS, training=True)
    assert not np.allclose(stats(model)[0], 0.0)


@pytest.mark.parametrize("options, message", [
    ({"masked_time": False}, "masked_time False is not supported"),
    ({"param_version": 3}, "'param_version' must be 0, 1 or 2"),
    ({"use_sample": 2}, "'use_sample' must be a number in [0, 1]"),
    ({"momentum": "fast"}, "'momentum' must be a number in [0, 1]"),
    ({"epsilon": -1.0}, "'epsilon' must be a number in [0, inf]"),
    ({"use_std": 1}, "'use_std' must be True or False"),
    ({"use_std": False, "gamma_init": 2.0}, "gamma_init is given, but use_std is False"),
    ({"beta_init": "random_uniform(-1, 1)"}, "unknown initializer 'random_uniform'"),
    ({"fused_bn": True}, "fused_bn"),
])
def test_refusals_name_the_layer_and_option(options, message):
    with pytest.raises(ConfigError) as info:
        model_of(options)
    assert "'bn'" in str(info.value) and message in str(info.value)


def test_sparse_data_is_refused():
    with pytest.raises(ConfigError, match="batch_norm layer takes dense input"):
        build_model({"output": {"class": "batch_norm", "from": "data"}}, input_dim=4, input_sparse=True,
                    target_dims={})


def test_eval_uses_float32_statistics_under_bfloat16():
    network = {"bn": {"class": "batch_norm", "from": "data"}, "output": {"class": "copy", "from": "bn"}}
    model = build_model(Config({"network": network, "tf_amp": "bfloat16"}), input_dim=3, input_sparse=False,
                        target_dims={})
    out = model(batch(), LENGTHS, training=True)["bn"]
    assert out.dtype == tf.float32 and model.layers["bn"].params["mean"].dtype == tf.float32
    assert np.isfinite(out.numpy()).all()
