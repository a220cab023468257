"""RETURNN's initialisers (``forward_weights_init``, ``bias_init``, ``recurrent_weights_init``): the forms
RETURNN's get_initializer takes, their distributions (TensorFlow-1's fans, limits and truncation), values that
are a pure function of (random_seed, name, shape), the layers that take them, and the refusals."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.model import build_model
from engine.model.initializers import GLOROT_UNIFORM, fans, parse_initializer
from engine.model.layers.base import glorot_values
from engine.runtime.errors import ConfigError

VS_078 = {"class": "VarianceScaling", "distribution": "uniform", "mode": "fan_in", "scale": 0.78}
VS_078_CALL = "variance_scaling_initializer(mode='fan_in', distribution='uniform', scale=0.78)"
NORMAL_01 = "random_normal_initializer(mean=0.0, stddev=0.1)"


def draw(value, shape=(400, 300), name="layer/W", seed=42) -> np.ndarray:
    return parse_initializer("layer", "forward_weights_init", value).values(name, shape, seed).numpy()


def bound(limit: float) -> np.float32:
    """``limit`` as the float32 bound the values keep (the draw's minval and maxval are float32)."""
    return np.float32(limit)


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 6), (2, 3, 4, 5)])
def test_glorot_uniform_is_the_engines_former_default_to_the_bit(shape):
    for value in ("glorot_uniform", "xavier", {"class": "GlorotUniform"}, "glorot_uniform_initializer()"):
        np.testing.assert_array_equal(draw(value, shape), glorot_values("layer/W", shape, 42).numpy())
    np.testing.assert_array_equal(GLOROT_UNIFORM.values("layer/W", shape, 42), draw("glorot_uniform", shape))


@pytest.mark.parametrize("value", [VS_078, VS_078_CALL])
def test_variance_scaling_uniform_fan_in(value):
    values = draw(value)
    limit = math.sqrt(3 * 0.78 / 400)
    assert np.abs(values).max() <= bound(limit) and np.abs(values).max() > 0.99 * limit
    assert values.var() == pytest.approx(limit ** 2 / 3, rel=0.02)
    assert abs(values.mean()) < 0.01 * limit


@pytest.mark.parametrize("value, n, scale", [
    ("variance_scaling_initializer(mode='fan_avg', distribution='uniform', scale=0.5)", 350, 0.5),
    ("he_uniform", 400, 2.0), ("lecun_uniform()", 400, 1.0),
    ({"class": "VarianceScaling", "mode": "fan_out", "distribution": "uniform"}, 300, 1.0),
])
def test_variance_scaling_modes(value, n, scale):
    values = draw(value)
    assert values.var() == pytest.approx(scale / n, rel=0.02)
    assert np.abs(values).max() <= bound(math.sqrt(3 * scale / n))


@pytest.mark.parametrize("value, std, truncated", [
    ("he_normal", math.sqrt(2 / 400), True),  # TF-1's VarianceScaling draws "normal" truncated too
    ("xavier_initializer(uniform=False)", math.sqrt(1 / 350), True),
    ("glorot_normal", math.sqrt(1 / 350), True),
    ("VarianceScaling", math.sqrt(1 / 400), True),
    ({"class": "VarianceScaling", "distribution": "untruncated_normal", "scale": 2.0}, math.sqrt(2 / 400),
     False),
])
def test_variance_scaling_normals_have_the_variance_of_their_scale(value, std, truncated):
    values = draw(value)
    assert values.std() == pytest.approx(std, rel=0.02)
    if truncated:  # at two standard deviations of the untruncated normal whose truncation has this std
        assert np.abs(values).max() <= 2 * std / 0.87962566103423978 + 1e-7
    else:
        assert np.abs(values).max() > 3 * std


def test_plain_distributions():
    values = draw(NORMAL_01)
    assert values.mean() == pytest.approx(0.0, abs=1e-3) and values.std() == pytest.approx(0.1, rel=0.02)
    values = draw({"class": "TruncatedNormal", "mean": 1.0, "stddev": 0.5})
    assert values.min() >= 0.0 and values.max() <= 2.0 and values.mean() == pytest.approx(1.0, abs=0.01)
    values = draw("random_uniform_initializer(-0.1, 0.1)")
    assert values.min() >= bound(-0.1) and values.max() < bound(0.1)
    assert values.mean() == pytest.approx(0.0, abs=1e-3)
    values = draw("random_uniform")  # TensorFlow's defaults: [0, 1)
    assert values.min() >= 0.0 and values.max() < 1.0 and values.mean() == pytest.approx(0.5, abs=0.01)
    assert draw("random_normal").std() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("value, constant", [(0, 0.0), (0.0, 0.0), (1, 1.0), (0.5, 0.5), ("zeros", 0.0),
                                             ("ones", 1.0), ("constant_initializer(-0.25)", -0.25),
                                             ({"class": "Constant", "value": 3}, 3.0), ("Zeros", 0.0)])
def test_constants(value, constant):
    np.testing.assert_array_equal(draw(value, (3, 4)), np.full((3, 4), constant, np.float32))


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (2, 3, 5)])
def test_orthogonal(shape):
    values = draw("orthogonal_initializer(gain=2.0)", shape).reshape(-1, shape[-1])
    small = min(values.shape)
    product = values.T @ values if values.shape[0] >= values.shape[1] else values @ values.T
    np.testing.assert_allclose(product, 4.0 * np.eye(small), atol=1e-5)


def test_values_are_a_function_of_seed_name_and_shape_and_the_given_seed():
    first = draw(VS_078, (20, 30))
    np.testing.assert_array_equal(first, draw(VS_078, (20, 30)))
    assert not np.array_equal(first, draw(VS_078, (20, 30), name="other/W"))
    assert not np.array_equal(first, draw(VS_078, (20, 30), seed=43))
    seeded = draw({**VS_078, "seed": 7}, (20, 30))
    assert not np.array_equal(first, seeded)
    np.testing.assert_array_equal(seeded, draw({**VS_078, "seed": 7}, (20, 30)))


def test_fans_are_tensorflows():
    assert fans((5,)) == (5, 5) and fans((4, 6)) == (4, 6) and fans((3, 4, 6)) == (12, 18)
    assert fans((2, 3, 4, 6)) == (24, 36) and fans(()) == (1, 1)


@pytest.mark.parametrize("value, message", [
    ("random_uniform_abs_initializer(0.01)", "RETURNN itself fails on it"),
    ("random_uniform(-0.1, 0.1)", "unknown initializer 'random_uniform'"),  # TensorFlow's op, not an init
    ("identity", "unknown initializer 'identity'"),
    ({"class": "HeNormal"}, "'HeNormal' is not one this engine takes"),
    ({"distribution": "uniform"}, "None is not one this engine takes"),
    ("variance_scaling_initializer(scale=sqrt(2))", "only literal arguments"),
    ("variance_scaling_initializer(mode='fan_sum')", "mode must be one of fan_in, fan_out, fan_avg"),
    ("variance_scaling_initializer(scale=-1.0)", "scale must be > 0"),
    ("variance_scaling_initializer(distribution='gamma')", "distribution must be one of"),
    ({"class": "VarianceScaling", "factor": 2}, "unknown argument 'factor'"),
    ("glorot_uniform(dtype='float16')", "parameters are float32 here"),
    ("random_normal_initializer(0.0, 0.1, 3, 'float32', 5)", "takes at most 4 arguments"),
    ("random_normal_initializer(0.0, stddev='wide')", "stddev must be a finite number"),
    ("constant_initializer([1.0, 2.0])", "a list of values is not taken"),
    ("glorot_uniform(seed=1.5)", "seed must be an int"),
    ("lambda: glorot_uniform()", "is not a call of an initializer"),
    ("glorot_uniform", None),
    (True, "must be a number, an initializer name, a call or a dict"),
    (None, "must be a number, an initializer name, a call or a dict"),
])
def test_refusals_name_the_layer_and_option(value, message):
    if message is None:  # the refusals' counterpart: a form that is taken
        parse_initializer("layer", "forward_weights_init", value)
        return
    with pytest.raises(ConfigError) as info:
        parse_initializer("layer", "forward_weights_init", value)
    assert "layer 'layer': 'forward_weights_init'" in str(info.value) and message in str(info.value)


def model_of(network: dict, n_in: int = 4, seed: int = 42):
    network = {**network, "output": {"class": "softmax", "loss": "ce", "from": list(network)}}
    return build_model(network, input_dim=n_in, input_sparse=False, target_dims={"classes": 3},
                       random_seed=seed)


def test_layers_take_their_initializers():
    model = model_of({
        "lin": {"class": "linear", "n_out": 6, "forward_weights_init": VS_078, "bias_init": 0.5,
                "from": "data"},
        "conv": {"class": "conv", "filter_size": (3,), "padding": "same", "n_out": 5, "from": "data",
                 "with_bias": True, "forward_weights_init": "variance_scaling_initializer(mode='fan_in', "
                                                            "distribution='uniform', scale=1.0)",
                 "bias_init": -1.0},
        "att": {"class": "self_attention", "num_heads": 1, "total_key_dim": 4, "n_out": 4, "from": "data",
                "forward_weights_init": "zeros"},
    })
    variables = {k: v.numpy() for k, v in model.named_variables().items()}
    assert np.abs(variables["lin/W"]).max() <= bound(math.sqrt(3 * 0.78 / 4))
    np.testing.assert_array_equal(variables["lin/b"], np.full(6, 0.5, np.float32))
    assert np.abs(variables["conv/W"]).max() <= bound(math.sqrt(3 / 12))  # fan_in: width 3 * 4 inputs
    np.testing.assert_array_equal(variables["conv/bias"], np.full(5, -1.0, np.float32))
    np.testing.assert_array_equal(variables["att/QKV"], np.zeros((4, 12), np.float32))


def test_defaults_are_unchanged_and_every_build_draws_the_same():
    network = {"lin": {"class": "linear", "n_out": 6, "from": "data"},
               "lstm": {"class": "rec", "unit": "nativelstm2", "n_out": 3, "from": "data"}}
    first, second = model_of(network), model_of(network)
    for name, var in first.named_variables().items():
        np.testing.assert_array_equal(var.numpy(), second.named_variables()[name].numpy())
    variables = first.named_variables()
    np.testing.assert_array_equal(variables["lin/W"], glorot_values("lin/W", (4, 6), 42))
    np.testing.assert_array_equal(variables["lstm/W"][:4], glorot_values("lstm/W", (4, 12), 42))
    np.testing.assert_array_equal(variables["lstm/W"][4:], glorot_values("lstm/W_re", (3, 12), 42))
    np.testing.assert_array_equal(variables["lstm/b"], np.zeros(12, np.float32))


def test_rec_initializers_fall_back_as_returnns():
    """W takes forward_weights_init, else recurrent_weights_init; W_re the other way round; b bias_init."""
    only_rec = model_of({"lstm": {"class": "rec", "unit": "lstm", "n_out": 3, "from": "data",
                                  "recurrent_weights_init": NORMAL_01}})
    weights = only_rec.named_variables()["lstm/W"].numpy()
    want = parse_initializer("lstm", "recurrent_weights_init", NORMAL_01)
    np.testing.assert_array_equal(weights[:4], want.values("lstm/W", (4, 12), 42))
    np.testing.assert_array_equal(weights[4:], want.values("lstm/W_re", (3, 12), 42))
    both = model_of({"lstm": {"class": "rec", "unit": "lstm", "n_out": 3, "from": "data",
                              "forward_weights_init": 0.25, "recurrent_weights_init": "ones",
                              "bias_init": -2}})
    weights = both.named_variables()["lstm/W"].numpy()
    np.testing.assert_array_equal(weights[:4], np.full((4, 12), 0.25, np.float32))
    np.testing.assert_array_equal(weights[4:], np.ones((3, 12), np.float32))
    np.testing.assert_array_equal(both.named_variables()["lstm/b"], np.full(12, -2.0, np.float32))


@pytest.mark.parametrize("network, message", [
    ({"lstm": {"class": "rec", "unit": "standardlstm", "n_out": 3, "from": "data", "bias_init": 0.1}},
     "bias_init on unit 'standardlstm' is not supported"),
    ({"lin": {"class": "linear", "n_out": 3, "with_bias": False, "bias_init": 0.1, "from": "data"}},
     r"bias_init is given, but the layer has no bias \(with_bias False\)"),
    ({"conv": {"class": "conv", "filter_size": (3,), "padding": "same", "n_out": 3, "bias_init": 0.1,
               "from": "data"}}, r"no bias \(with_bias 'not given'\)"),  # RETURNN's conv: no bias by default
    ({"lin": {"class": "linear", "n_out": 3, "forward_weights_init": "orthogonal", "bias_init": "orthogonal",
              "from": "data"}}, "the orthogonal initializer needs at least two axes"),
    ({"lin": {"class": "linear", "n_out": 3, "weights_init": "xavier", "from": "data"}}, "weights_init"),
])
def test_layer_refusals(network, message):
    with pytest.raises(ConfigError, match=message):
        model_of(network)
