"""The updater: each optimizer against its formula and TensorFlow 1's optimizer, clipping, learning rate."""

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.runtime.errors import ConfigError
from engine.training.update.updater import Updater, optimizer_from_config

pytestmark = pytest.mark.tf_latest

GRADS = [
    np.array([0.5, -1.0, 2.0], np.float32),
    np.array([-0.3, 0.2, 1.5], np.float32),
    np.array([0.1, 0.0, -4.0], np.float32),
]
START = np.array([1.0, -2.0, 0.5], np.float32)
LRS = [0.1, 0.1, 0.05]  # the rate changes before the last step


def reference(name, opts):
    """The module docstring's formulas in numpy, float64; epsilon defaults to RETURNN's optimizer_epsilon."""
    w, state = START.astype(np.float64), {}
    for t, (g, lr) in enumerate(zip(GRADS, LRS), start=1):
        g = g.astype(np.float64)
        if name == "sgd":
            w = w - lr * g
        elif name == "momentum":
            mu = opts.get("momentum", 0.9)
            a = state["a"] = mu * state.get("a", 0) + g
            w = w - lr * (g + mu * a if opts.get("nesterov") else a)
        elif name in ("adam", "nadam"):
            b1, b2, eps = opts.get("beta1", 0.9), opts.get("beta2", 0.999), opts.get("epsilon", 1e-16)
            m = state["m"] = b1 * state.get("m", 0) + (1 - b1) * g
            v = state["v"] = b2 * state.get("v", 0) + (1 - b2) * g * g
            lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
            direction = b1 * m + (1 - b1) * g if name == "nadam" else m
            w = w - lr_t * direction / (np.sqrt(v) + eps)
        elif name == "rmsprop":
            rho, mu, eps = opts.get("decay", 0.9), opts.get("momentum", 0.0), opts.get("epsilon", 1e-16)
            s = state["s"] = rho * state.get("s", 1.0) + (1 - rho) * g * g
            a = state["a"] = mu * state.get("a", 0) + lr * g / np.sqrt(s + eps)
            w = w - a
    return w


def run_updater(optimizer, compiled):
    var = tf.Variable(START)
    updater = Updater([var], optimizer_from_config(optimizer), learning_rate=LRS[0])
    grad_spec = tf.TensorSpec([3], tf.float32)
    apply = (
        tf.function(lambda g: updater.apply_gradients([g], [var]), input_signature=[grad_spec])
        if compiled
        else (lambda g: updater.apply_gradients([g], [var]))
    )
    for g, lr in zip(GRADS, LRS):
        updater.set_learning_rate(lr)
        apply(tf.constant(g))
    if compiled:
        assert apply.experimental_get_tracing_count() == 1  # a new learning rate does not retrace
    assert int(updater.iterations.numpy()) == 3
    return var.numpy(), updater


CASES = [
    ("sgd", {}),
    ({"class": "momentum", "momentum": 0.8}, {"momentum": 0.8}),
    ({"class": "Momentum", "nesterov": True}, {"nesterov": True}),
    ("adam", {}),
    (
        {"class": "adam", "beta_1": 0.8, "beta2": 0.99, "epsilon": 1e-3},
        {"beta1": 0.8, "beta2": 0.99, "epsilon": 1e-3},
    ),
    ("nadam", {}),
    ({"class": "rmsprop", "rho": 0.8, "momentum": 0.5}, {"decay": 0.8, "momentum": 0.5}),
    ("RMSprop", {}),
]


@pytest.mark.parametrize("optimizer, opts", CASES)
@pytest.mark.parametrize("compiled", [False, True])
def test_optimizer_matches_formula(optimizer, opts, compiled):
    name = (optimizer if isinstance(optimizer, str) else optimizer["class"]).lower()
    got, _ = run_updater(optimizer, compiled)
    np.testing.assert_allclose(got, reference(name, opts), rtol=1e-5, atol=1e-6)


TF1 = {
    "sgd": lambda lr: tf.compat.v1.train.GradientDescentOptimizer(lr),
    "momentum": lambda lr: tf.compat.v1.train.MomentumOptimizer(lr, 0.9),
    "nesterov": lambda lr: tf.compat.v1.train.MomentumOptimizer(lr, 0.9, use_nesterov=True),
    "adam": lambda lr: tf.compat.v1.train.AdamOptimizer(lr, epsilon=1e-16),  # as RETURNN creates them
    "rmsprop": lambda lr: tf.compat.v1.train.RMSPropOptimizer(lr, momentum=0.5, epsilon=1e-16),
}
OURS = {
    "sgd": "sgd",
    "momentum": "momentum",
    "nesterov": {"class": "momentum", "nesterov": True},
    "adam": "adam",
    "rmsprop": {"class": "rmsprop", "momentum": 0.5},
}


@pytest.mark.parametrize("name", list(TF1))
def test_optimizer_matches_tensorflow1(name):
    """An independent implementation of the same rules (the ones RETURNN uses), at a fixed rate."""
    var = tf.Variable(START)
    tf1 = TF1[name](0.1)
    ours = tf.Variable(START)
    updater = Updater([ours], optimizer_from_config(OURS[name]), learning_rate=0.1)
    for g in GRADS:
        tf1.apply_gradients([(tf.constant(g), var)])
        updater.apply_gradients([tf.constant(g)])
    np.testing.assert_allclose(ours.numpy(), var.numpy(), rtol=1e-5, atol=1e-6)


def test_slots_exist_before_the_first_step_and_are_named():
    w, b = tf.Variable(tf.ones([2, 3])), tf.Variable(tf.zeros([3]))
    updater = Updater({"layer/W": w, "layer/b": b}, optimizer_from_config("adam"))
    assert list(updater.named_variables()) == [
        "iterations",
        "m/layer/W",
        "v/layer/W",
        "m/layer/b",
        "v/layer/b",
    ]
    assert updater.named_variables()["v/layer/W"].shape == (2, 3)
    assert all(not v.trainable for v in updater.variables)
    assert list(Updater([w], optimizer_from_config("sgd")).named_variables()) == ["iterations"]


def test_clipping_none_gradients_and_learning_rate():
    a, b, c = tf.Variable([0.0, 0.0]), tf.Variable([0.0]), tf.Variable([5.0])
    config = Config({"optimizer": "sgd", "learning_rate": 1.0, "gradient_clip_global_norm": 1.0})
    updater = Updater.from_config(config, [a, b, c])
    assert updater.learning_rate == pytest.approx(1.0)
    updater.apply_gradients([tf.constant([3.0, 0.0]), tf.constant([4.0]), None])  # global norm 5 -> 1
    np.testing.assert_allclose(a.numpy(), [-0.6, 0.0], rtol=1e-6)  # lr 1 * clipped 0.6
    np.testing.assert_allclose(b.numpy(), [-0.8], rtol=1e-6)
    assert c.numpy()[0] == 5.0  # no gradient: untouched
    updater.set_learning_rate(0.25)
    assert updater.learning_rate == pytest.approx(0.25)
    updater.apply_gradients([tf.constant([0.1, 0.0]), tf.constant([0.0]), None])  # below the clip norm
    np.testing.assert_allclose(a.numpy(), [-0.625, 0.0], rtol=1e-6)
    with pytest.raises(ValueError, match="differ"):
        updater.apply_gradients([None, None, None], [c, b, a])


def test_config_defaults_and_errors():
    updater = Updater.from_config(Config({"gradient_clip_global_norm": 0}), [tf.Variable([1.0])])
    assert (
        updater.optimizer.name == "sgd" and updater.learning_rate == 1.0  # RETURNN's defaults
        and updater.gradient_options.clip_global_norm == 0.0
    )
    assert optimizer_from_config("adam").opts["epsilon"] == 1e-16
    with pytest.raises(ConfigError, match="unknown class 'adamw'"):
        optimizer_from_config({"class": "adamw"})
    with pytest.raises(ConfigError, match=r"adam has no option 'learning_rate'.*'beta1'"):
        optimizer_from_config({"class": "adam", "learning_rate": 0.1})
    with pytest.raises(ConfigError, match="momentum option 'momentum' must be a number, got '0.9'"):
        optimizer_from_config({"class": "momentum", "momentum": "0.9"})
    with pytest.raises(ConfigError, match="option 'nesterov' must be True or False"):
        optimizer_from_config({"class": "momentum", "nesterov": 1})
    with pytest.raises(ConfigError, match="class name or a dict"):
        optimizer_from_config(3)
