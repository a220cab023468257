"""The gradient keys (``gradient_noise``, ``gradient_clip``, ``gradient_clip_global_norm``,
``maximize_grad_norm``), ``L2`` in the train step, and the optimizer flags, against hand-computed numbers."""
import math

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.strategy import Strategy
from engine.model import build_model
from engine.runtime import log
from engine.runtime.errors import ConfigError
from engine.training.step import Steps
from engine.training.update.gradients import NOISE_STREAM, GradientOptions, process_gradients
from engine.training.update.optimizer_config import optimizer_for_config
from engine.training.update.updater import Updater

pytestmark = pytest.mark.tf_latest
SEED = tf.constant([7, 3], tf.int64)


def test_clipping_uses_the_norm_of_the_gradients_as_they_came():
    grads = [tf.constant([3.0, -4.0]), None, tf.constant([0.5])]  # global norm sqrt(25.25)
    out = process_gradients(grads, GradientOptions(clip_value=1.0, clip_global_norm=2.5), SEED)
    scale = 2.5 / math.sqrt(25.25)  # not 2.5 / norm([1, -1, 0.5]), which is above 1: no scaling
    np.testing.assert_allclose(out[0].numpy(), [scale, -scale], rtol=1e-6)
    np.testing.assert_allclose(out[2].numpy(), [0.5 * scale], rtol=1e-6)
    assert out[1] is None
    same = process_gradients(grads, GradientOptions(), SEED)
    np.testing.assert_array_equal(same[0].numpy(), [3.0, -4.0])


def test_noise_is_truncated_gaussian_of_the_given_stddev_keyed_by_seed_step_and_variable():
    grads = [tf.zeros([200_000]), tf.zeros([3])]
    noise = process_gradients(grads, GradientOptions(noise=0.3), SEED)
    values = noise[0].numpy()
    assert np.abs(values).max() <= 2 * 0.3 + 1e-6  # redrawn beyond two standard deviations
    phi2 = math.exp(-2.0) / math.sqrt(2 * math.pi)
    truncated_std = 0.3 * math.sqrt(1 - 4 * phi2 / math.erf(2 / math.sqrt(2)))
    assert abs(values.std() - truncated_std) < 0.003 and abs(values.mean()) < 0.003
    again = process_gradients(grads, GradientOptions(noise=0.3), SEED)
    np.testing.assert_array_equal(again[1].numpy(), noise[1].numpy())
    fold = tf.random.experimental.stateless_fold_in
    expected = tf.random.stateless_truncated_normal([3], seed=fold(fold(SEED, NOISE_STREAM), 1), stddev=0.3)
    np.testing.assert_array_equal(noise[1].numpy(), expected.numpy())
    other_step = process_gradients(grads, GradientOptions(noise=0.3), tf.constant([7, 4], tf.int64))
    assert not np.array_equal(other_step[1].numpy(), noise[1].numpy())
    clipped = process_gradients([tf.constant([5.0, -5.0, 0.0])],
                                GradientOptions(noise=1.0, clip_value=0.1), SEED)
    assert np.abs(clipped[0].numpy()).max() <= np.float32(0.1)  # noise first, then the value clipping


def test_bad_values_are_errors():
    with pytest.raises(ConfigError, match="'gradient_noise' must be a number >= 0"):
        GradientOptions.from_config(Config({"gradient_noise": -0.1}))


@pytest.mark.parametrize("values, name, opts", [
    ({"adam": True}, "adam", {"epsilon": 1e-16}),
    ({"adam": True, "optimizer_epsilon": 1e-8}, "adam", {"epsilon": 1e-8}),
    ({"nadam": "1"}, "nadam", {"epsilon": 1e-16}),
    ({"rmsprop": True, "momentum": 0.5}, "rmsprop", {"decay": 0.9, "momentum": 0.5, "epsilon": 1e-16}),
    ({"rmsprop": 0.8}, "rmsprop", {"decay": 0.8, "momentum": 0.0}),
    ({"momentum": 0.9}, "momentum", {"momentum": 0.9, "nesterov": False}),
    ({"adam": False, "momentum": 0.0}, "sgd", {}),  # RETURNN's default: plain gradient descent
    ({}, "sgd", {}),
    ({"optimizer": {"class": "adam", "epsilon": 1e-3}, "optimizer_epsilon": 1e-5}, "adam", {"epsilon": 1e-3}),
    ({"optimizer": "rmsprop", "optimizer_epsilon": 1e-5}, "rmsprop", {"epsilon": 1e-5}),
    # RETURNN's names of the same rules (TensorFlow 1's classes; its plain SGD on TF 2 is "gradientdescent")
    ({"optimizer": {"class": "gradientdescent"}}, "sgd", {}),
    ({"optimizer": "GradientDescentOptimizer"}, "sgd", {}),
    ({"optimizer": {"class": "AdamOptimizer", "epsilon": 1e-3}}, "adam", {"epsilon": 1e-3}),
    ({"optimizer": "NadamOptimizer"}, "nadam", {"epsilon": 1e-16}),
    ({"optimizer": {"class": "MomentumOptimizer", "momentum": 0.5}}, "momentum", {"momentum": 0.5}),
    ({"optimizer": "RMSPropOptimizer"}, "rmsprop", {"decay": 0.9}),
])
def test_optimizer_flags(values, name, opts):
    optimizer = optimizer_for_config(Config(values))
    assert optimizer.name == name
    assert {k: optimizer.opts[k] for k in opts} == opts


def test_the_nadam_flag_says_which_rule_it_runs(capsys):
    log.init(verbosity=log.INFO)
    assert optimizer_for_config(Config({"nadam": True})).name == "nadam"
    out = capsys.readouterr().out
    assert "nadam = True: RETURNN's NadamOptimizer" in out and "Keras' Nadam" in out
    optimizer_for_config(Config({"optimizer": "nadam"}))  # what the line explains is the flag
    assert "nadam = True" not in capsys.readouterr().out


@pytest.mark.parametrize("values, message", [
    ({"optimizer": "adam", "adam": True}, r"\['adam'\] and 'optimizer' are both set"),
    ({"optimizer": {"class": "rmsprop"}, "momentum": 0.9}, r"\['momentum'\] and 'optimizer'"),
    ({"adam": True, "nadam": True}, r"\['adam', 'nadam'\] each select an optimizer"),
    ({"nadam": True, "momentum": 0.9}, "'nadam' does not take 'momentum'"),
])
def test_optimizer_flag_conflicts_are_errors(values, message):
    with pytest.raises(ConfigError, match=message):
        optimizer_for_config(Config(values))


def test_optimizer_epsilon_is_used_in_the_update():
    var = tf.Variable([1.0, 1.0])
    updater = Updater([var], optimizer_for_config(Config({"adam": True, "optimizer_epsilon": 0.1})),
                      learning_rate=0.1)
    g = np.array([0.02, -3.0])
    updater.apply_gradients([tf.constant(g, tf.float32)])
    m, v = 0.1 * g, 0.001 * g * g  # first adam step
    lr_t = 0.1 * math.sqrt(1 - 0.999) / (1 - 0.9)
    np.testing.assert_allclose(var.numpy(), 1.0 - lr_t * m / (np.sqrt(v) + 0.1), rtol=1e-5)


NETWORK = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 3, "L2": 0.05},
           "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}


def one_batch():
    rng = np.random.RandomState(0)

    class Batch:
        data = {"data": rng.randn(2, 4, 2).astype(np.float32),
                "classes": rng.randint(0, 3, (2, 4)).astype(np.int32)}
        lengths = {"data": np.array([4, 3], np.int32), "classes": np.array([4, 3], np.int32)}
    return Batch


def sgd_steps(network, **gradient_options):
    """A model and its train step with plain SGD at rate 1: the update is minus the processed gradient."""
    config = Config({"network": network, "maximize_grad_norm": gradient_options.get("maximize_norm", 0.0)})
    model = build_model(config, input_dim=2, input_sparse=False, target_dims={"classes": 3})
    updater = Updater(model.named_trainable_variables(), optimizer_for_config(Config({"optimizer": "sgd"})),
                      learning_rate=1.0, gradient_options=GradientOptions(**gradient_options))
    return model, Steps(model, updater, Strategy(LocalCommunicator()))


def losses_of(model, batch):
    out = model(batch.data["data"], batch.lengths["data"])
    return model.compute_losses(out, {"classes": batch.data["classes"]},
                                {"classes": batch.lengths["classes"]})


def test_l2_enters_the_step_at_returnns_weight_relative_to_the_summed_loss():
    model, steps = sgd_steps(NETWORK)
    batch = one_batch()
    params = list(model.trainable_variables)
    with tf.GradientTape() as tape:
        summed_ce = losses_of(model, batch).loss
    grads = tape.gradient(summed_ce, params)
    before = [p.numpy() for p in params]
    steps.train(batch)
    # RETURNN's objective: sum of CE + L2 * sum(w^2) over the hidden layer's W and b
    for name, p, w, g in zip(model.named_trainable_variables(), params, before, grads):
        l2 = 2 * 0.05 * w if name.startswith("hidden/") else 0.0
        np.testing.assert_allclose(p.numpy(), w - (g.numpy() + l2), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("network", [NETWORK, {"lstm": {"class": "rec", "unit": "NativeLstm2", "n_out": 3},
                                               "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}])
def test_maximize_grad_norm_adds_the_gradient_of_minus_f_times_the_gradient_norm(network):
    factor = 0.5
    model, steps = sgd_steps(network, maximize_norm=factor)
    batch = one_batch()
    params = list(model.trainable_variables)

    # a graph: the finite differences below take two gradients per parameter, each seconds eagerly
    @tf.function(autograph=False)
    def graph_gradient():  # of what the step differentiates (the L2 term as checked above)
        with tf.GradientTape() as tape:
            losses = losses_of(model, batch)
            total = losses.objective + losses.regularizer
        return tape.gradient(total, params)

    def gradient():
        return [g.numpy().astype(np.float64) for g in graph_gradient()]

    def norm():
        return math.sqrt(sum(float(np.sum(g * g)) for g in gradient()))

    before, grads = [p.numpy().copy() for p in params], gradient()
    numeric = []  # central finite differences of the gradient norm in every parameter
    for p, w in zip(params, before):
        d = np.zeros(p.shape)
        for idx in np.ndindex(*p.shape):
            for sign in (1, -1):
                moved = w.copy()
                moved[idx] += sign * 1e-2
                p.assign(moved)
                d[idx] += sign * norm() / 2e-2
        p.assign(w)
        numeric.append(d)
    steps.train(batch)
    for p, w, g, d in zip(params, before, grads, numeric):
        np.testing.assert_allclose(p.numpy(), w - (g - factor * d), rtol=2e-3, atol=2e-4)


def test_maximize_grad_norm_with_an_op_that_cannot_be_differentiated_twice_is_a_clear_error():
    from engine.model.network import NetworkModel

    net = {"lstm": {"class": "rec", "n_out": 3}, "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
    model = NetworkModel(net, input_dim=2, input_sparse=False, target_dims={"classes": 3}, random_seed=1)
    updater = Updater(model.named_trainable_variables(), optimizer_for_config(Config({})),
                      gradient_options=GradientOptions(maximize_norm=0.1))
    steps = Steps(model, updater, Strategy(LocalCommunicator()))
    with pytest.raises(ConfigError,
                       match=r"gradient \((BlockLSTMGrad|LSTMBlockCellGrad)\) cannot be differentiated"):
        steps.train(one_batch())


def test_dropout_and_noise_are_reproducible_from_random_seed_and_step():
    network = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 4, "dropout": 0.3},
               "output": {"class": "softmax", "loss": "ce", "from": "hidden", "dropout": 0.2}}

    def train(seed):
        config = Config({"network": network, "random_seed": seed, "gradient_noise": 0.05, "adam": True})
        model = build_model(config, input_dim=2, input_sparse=False, target_dims={"classes": 3},
                            random_seed=1)
        steps = Steps(model, Updater.from_config(config, model.named_trainable_variables()),
                      Strategy(LocalCommunicator()))
        for _ in range(3):
            steps.train(one_batch())
        return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])

    first = train(5)
    np.testing.assert_array_equal(first, train(5))
    assert not np.allclose(first, train(6))  # same initial parameters, other dropout masks and noise
