"""Models in a compiled train step: learning a toy task, no retracing, and ``get_model`` models."""

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.model import build_model
from engine.runtime.errors import ConfigError
from engine.training.update.updater import Updater, optimizer_from_config

pytestmark = [
    pytest.mark.tf_latest,
    pytest.mark.filterwarnings("ignore:non-integer arguments to randrange"),  # inside Keras 2's initialisers
]


def make_train_step(model, updater):
    data_spec, lengths_spec = model.input_signature
    labels_spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[data_spec, lengths_spec, labels_spec])
    def step(data, lengths, labels):
        with tf.GradientTape() as tape:
            res = model.compute_losses(
                model(data, lengths, training=True), {"classes": labels}, {"classes": lengths}
            )
        params = list(model.trainable_variables)
        updater.apply_gradients(tape.gradient(res.objective, params), params)
        return res.loss / res.num_frames, res.error / res.num_frames

    return step


def neighbour_task(rng, batch, vocab=4, max_len=12):
    """Target at t = the pair (x[t-1], x[t+1]) inside each sequence (0 outside): needs both directions."""
    lengths = rng.randint(4, max_len + 1, size=batch).astype("int32")
    x = rng.randint(0, vocab, size=(batch, max_len)).astype("int32")
    y = np.zeros_like(x)
    for b, n in enumerate(lengths):
        prev = np.concatenate([[0], x[b, : n - 1]])
        nxt = np.concatenate([x[b, 1:n], [0]])
        y[b, :n] = prev * vocab + nxt
        x[b, n:] = 0
    return x, lengths, y


def test_blstm_learns_a_task_that_needs_both_directions():
    rng = np.random.RandomState(0)
    net = {
        "fw": {"class": "rec", "unit": "lstm", "n_out": 24},
        "bw": {"class": "rec", "unit": "lstm", "n_out": 24, "direction": -1},
        "output": {"class": "softmax", "loss": "ce", "from": ["fw", "bw"]},
    }
    model = build_model(net, input_dim=4, input_sparse=True, target_dims={"classes": 16})
    updater = Updater(model.named_trainable_variables(), optimizer_from_config("adam"), learning_rate=0.02)
    step = make_train_step(model, updater)
    for _ in range(300):
        step(*neighbour_task(rng, 16))
    x, lengths, y = neighbour_task(rng, 64)
    res = model.compute_losses(model(x, lengths), {"classes": y}, {"classes": lengths})
    assert res.error.numpy() / res.num_frames.numpy() < 0.03
    assert step.experimental_get_tracing_count() == 1


def test_no_retracing_for_new_batch_shapes():
    net = {
        "h": {"class": "rec", "n_out": 5, "direction": -1},
        "output": {"class": "softmax", "loss": "ce", "from": "h"},
    }
    model = build_model(net, input_dim=3, input_sparse=False, target_dims={"classes": 2})
    step = make_train_step(
        model, Updater(model.trainable_variables, optimizer_from_config("sgd"), learning_rate=0.1)
    )
    for batch, time in [(2, 5), (7, 3), (1, 11), (3, 1)]:
        lengths = np.full(batch, time, np.int32)
        lengths[0] = 1
        loss, _ = step(np.ones((batch, time, 3), np.float32), lengths, np.zeros((batch, time), np.int32))
        assert np.isfinite(loss.numpy())
    assert step.experimental_get_tracing_count() == 1


class LengthAwareModule(tf.Module):
    """A tf.Module of the kind ``get_model`` may return: it takes ``lengths`` and zeroes padded frames."""

    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.w = tf.Variable(tf.random.uniform([input_dim, output_dim], -0.5, 0.5))
        self.seen_lengths = False

    def __call__(self, data, lengths, training=False):
        self.seen_lengths = True
        mask = tf.sequence_mask(lengths, tf.shape(data)[1], tf.float32)[:, :, None]
        return tf.einsum("btf,fo->bto", data * mask, self.w)


@pytest.mark.parametrize("kind", ["keras", "module"])
def test_get_model_hook_trains_and_exposes_tf_variables(kind):
    got = {}

    def get_model(*, input_dim, output_dim, input_sparse, **kwargs):
        got.update(kwargs, input_dim=input_dim, output_dim=output_dim, input_sparse=input_sparse)
        if kind == "module":
            return LengthAwareModule(input_dim, output_dim)
        return tf.keras.Sequential(
            [tf.keras.layers.Dense(8, activation="tanh"), tf.keras.layers.Dense(output_dim)]
        )

    config = Config({"get_model": get_model, "random_seed": 3, "optimizer": {"class": "adam"},
                     "learning_rate": 0.05})
    model = build_model(config, input_dim=3, input_sparse=False, target_dims={"classes": 2})
    assert got["output_dim"] == 2 and got["random_seed"] == 3 and got["target_dims"] == {"classes": 2}
    assert all(isinstance(v, tf.Variable) for v in model.variables)
    assert len(model.named_variables()) == (4 if kind == "keras" else 1)  # distinct names for both kernels
    if kind == "module":
        assert model.model.seen_lengths
    updater = Updater.from_config(config, model.named_trainable_variables())
    step = make_train_step(model, updater)
    rng = np.random.RandomState(0)
    x = rng.randn(8, 6, 3).astype("float32")
    y = (x[:, :, 0] > 0).astype("int32")
    lengths = np.full(8, 6, np.int32)
    first, _ = step(x, lengths, y)
    for _ in range(150):
        loss, err = step(x, lengths, y)
    assert loss.numpy() < 0.5 * first.numpy() and err.numpy() < 0.1


def test_get_model_errors():
    def wrong_dim(**kwargs):
        return tf.keras.Sequential([tf.keras.layers.Dense(5)])

    with pytest.raises(ConfigError, match="output has dim 5, but target 'classes' has dim 2"):
        build_model(
            Config({"get_model": wrong_dim}), input_dim=3, input_sparse=False, target_dims={"classes": 2}
        )
    with pytest.raises(ConfigError, match="cannot take the engine's keyword arguments"):
        build_model(
            Config({"get_model": lambda dims: None}),
            input_dim=3,
            input_sparse=False,
            target_dims={"classes": 2},
        )
    with pytest.raises(ConfigError, match="'network' must be a layer dict"):
        build_model(
            Config({"network": wrong_dim}), input_dim=3, input_sparse=False, target_dims={"classes": 2}
        )


def test_a_layer_with_trainable_false_keeps_its_values_while_the_others_learn():
    rng = np.random.RandomState(1)
    net = {"frozen": {"class": "linear", "activation": "tanh", "n_out": 8, "trainable": False},
           "glu": {"class": "gating", "activation": "identity", "from": "frozen"},
           "output": {"class": "softmax", "loss": "ce", "from": "glu"}}
    model = build_model(net, input_dim=4, input_sparse=True, target_dims={"classes": 16})
    assert list(model.named_trainable_variables()) == ["output/W", "output/b"]
    assert list(model.named_variables()) == ["frozen/W", "frozen/b", "output/W", "output/b"]
    before = {name: var.numpy() for name, var in model.named_variables().items()}
    updater = Updater(model.named_trainable_variables(), optimizer_from_config("adam"), learning_rate=0.02)
    step = make_train_step(model, updater)
    for _ in range(3):
        step(*neighbour_task(rng, 8))
    after = {name: var.numpy() for name, var in model.named_variables().items()}
    assert all(np.array_equal(before[n], after[n]) for n in ("frozen/W", "frozen/b"))
    assert not np.array_equal(before["output/W"], after["output/W"])
    with pytest.raises(ConfigError, match="'trainable' must be True or False"):
        build_model({"output": {"class": "softmax", "loss": "ce", "trainable": "no"}}, input_dim=4,
                    input_sparse=False, target_dims={"classes": 2})
