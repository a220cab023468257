"""Unit ``layernormvariantslstm`` (RETURNN's LayerNormVariantsLSTMCell): its numbers in training against a
numpy step-by-step reference with the same dropout masks, the masks' statistics, training mode without
dropout against RETURNN's fixtures, initial values, checkpoint names, ``--check`` and the refusals.
RETURNN parity of the published option sets (outputs, gradients, both checkpoint directions): the
``lnlstm_*`` cases of test_returnn_checkpoints.py."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.model import build_model
from engine.model.layers.lstm_norm import dropout_masks
from engine.model.placement import layer_kernels
from engine.model.spec import parse_network
from engine.runtime.errors import ConfigError
from engine.tasks.check import collect, stop_reason
from engine.training.checkpoints.initial_params import load_for_inference
from engine.training.checkpoints.returnn_format import ReturnnView
from returnn_fixtures import CASES, FIXTURES, TOLERANCE, fixture, model_of

pytestmark = pytest.mark.tf_latest

UNIT = "LayerNormVariantsLSTM"
DEFAULTS = {"with_concat": False, "global_norm": True, "global_norm_joined": False, "per_gate_norm": False,
            "cell_norm": True, "cell_norm_in_output": True, "hidden_norm": False, "variance_epsilon": 1e-12}


def network(unit_opts=None, **layer):
    return {"l": {"class": "rec", "unit": UNIT, "n_out": 4, "unit_opts": unit_opts, **layer},
            "output": {"class": "copy", "from": "l"}}


def model(unit_opts=None, **layer):
    return build_model(network(unit_opts, **layer), input_dim=5, input_sparse=False, target_dims={})


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def norm(p, x, where, eps):
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * p[f"gamma_{where}"]
    return y + p[f"beta_{where}"] if f"beta_{where}" in p else y


def reference(p, x, lengths, opts, direction, masks):
    """RETURNN's cell, one sequence and one step at a time; x (B, T, in) -> (B, T, n)."""
    o = {**DEFAULTS, **opts}
    eps, (mask_j, mask_h) = o["variance_epsilon"], masks
    n = p["gamma_new_c"].shape[0] if "gamma_new_c" in p else p["W_re"].shape[0]
    out = np.zeros(x.shape[:2] + (n,))
    for b, length in enumerate(lengths):
        c, h, ys = np.zeros(n), np.zeros(n), []
        for x_t in x[b, :length][::direction]:
            h_in = h * mask_h[b] if mask_h is not None else h
            if o["with_concat"]:
                z = np.concatenate([x_t, h_in]) @ p["W_ff_re"] + p.get("bias_ff_re", 0.0)
            else:
                below, rec = x_t @ p["W_ff"] + p.get("bias_ff", 0.0), h_in @ p["W_re"]
                if o["global_norm"]:
                    below, rec = norm(p, below, "input_below", eps), norm(p, rec, "state_below", eps)
                z = below + rec
            if o["global_norm_joined"]:
                z = norm(p, z, "lstm_in", eps)
            i, j, f, g_o = np.split(z, 4)
            if o["per_gate_norm"]:
                i, j, f, g_o = (norm(p, v, f"{g}_gate", eps) for v, g in zip((i, j, f, g_o), "ijfo"))
            cell_in = np.tanh(j) * (mask_j[b] if mask_j is not None else 1.0)
            c = sigmoid(f) * c + sigmoid(i) * cell_in
            c_out = c
            if o["cell_norm"]:
                c = norm(p, c, "new_c", eps)
                c_out = c if o["cell_norm_in_output"] else c_out
            h = sigmoid(g_o) * np.tanh(c_out)
            if o["hidden_norm"]:
                h = norm(p, h, "new_h", eps)
            ys.append(h)
        out[b, :length] = ys[::direction]
    return out


OPTION_SETS = [
    {}, {"cell_norm": False}, {"global_norm": False, "global_norm_joined": True, "cell_norm": False},
    {"global_norm": False, "per_gate_norm": True},
    {"global_norm": False, "with_concat": True, "hidden_norm": True, "cell_norm_in_output": False,
     "variance_epsilon": 0.01},
    {"global_norm": False, "cell_norm": False, "forget_bias": 1.0},
]


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("direction", [1, -1])
def test_training_with_dropouts_is_the_cell_step_by_step(opts, direction):
    """Both masks (B, n) are drawn once a call and applied at every step: dropout on tanh(j), dropout_h on
    h_prev where it meets the recurrent weights only (the state keeps the undropped h)."""
    rates = {"dropout": 0.3, "dropout_h": 0.5}
    m = model({**opts, **rates}, direction=direction)
    layer = m.layers["l"]
    rng = np.random.RandomState(len(str(opts)) + direction)
    for var in layer.params.values():
        var.assign((0.5 * rng.standard_normal(var.shape)).astype(np.float32))
    lengths = np.array([6, 4, 1], np.int32)
    x = rng.standard_normal((3, 6, 5)).astype(np.float32)
    seed = tf.constant([3, 4], tf.int64)
    got = layer(tf.transpose(x, [1, 0, 2]), tf.constant(lengths), True, seed=seed).numpy().transpose(1, 0, 2)
    masks = [m.numpy() for m in dropout_masks(seed, tf.constant(3), 4, (0.3, 0.5))]
    params = {key: var.numpy().astype(np.float64) for key, var in layer.params.items()}
    np.testing.assert_allclose(got, reference(params, x, lengths, opts, direction, masks), atol=2e-5)
    # eval: no dropout
    got = layer(tf.transpose(x, [1, 0, 2]), tf.constant(lengths), False).numpy().transpose(1, 0, 2)
    np.testing.assert_allclose(got, reference(params, x, lengths, opts, direction, (None, None)), atol=2e-5)


def test_the_masks_are_returnns_inverted_dropout_from_one_draw():
    seed = tf.constant([5, 6], tf.int64)
    a, same, wider, none = dropout_masks(seed, tf.constant(64), 500, (0.3, 0.3, 0.5, 0.0))
    assert none is None and a.shape == (64, 500)
    assert set(np.unique(a.numpy())) == {0.0, np.float32(1 / 0.7)}
    assert abs(np.mean(a.numpy() > 0) - 0.7) < 0.01 and abs(np.mean(wider.numpy() > 0) - 0.5) < 0.01
    np.testing.assert_array_equal(a, same)  # RETURNN's masks share one seed: equal rates, equal masks
    assert np.all(a.numpy()[wider.numpy() > 0] > 0)  # a unit kept at rate 0.5 is kept at 0.3 too
    other = dropout_masks(tf.constant([5, 7], tf.int64), tf.constant(64), 500, (0.3,))[0]
    assert not np.array_equal(a, other)


def test_a_dropped_unit_stays_dropped_over_time_and_only_in_training():
    """Without norms after the cell, a unit whose tanh(j) is dropped keeps c = 0, so h = 0 at every step:
    per (sequence, unit) all steps or none are 0 (as RETURNN's output is, trained, 2026-11-29: 51% all,
    none partly)."""
    m = model({"global_norm": False, "cell_norm": False, "dropout": 0.5})
    x = np.random.RandomState(0).standard_normal((64, 6, 5)).astype(np.float32)
    lengths = np.full(64, 6)
    out = m(x, lengths, training=True, seed=tf.constant([1, 2], tf.int64))["l"].numpy()
    zero = out == 0
    assert np.array_equal(zero.all(axis=1), zero.any(axis=1))
    assert 0.4 < zero.all(axis=1).mean() < 0.6
    again = m(x, lengths, training=True, seed=tf.constant([1, 3], tf.int64))["l"].numpy() == 0
    assert not np.array_equal(zero, again)  # a new mask each call
    assert not (m(x, lengths, training=False)["l"].numpy() == 0).any()


@pytest.mark.parametrize("name", ["lnlstm_gn", "lnlstm_gnj", "lnlstm_pgn"])
def test_training_mode_without_dropout_gives_returnns_outputs(name):
    net = copy.deepcopy(CASES[name]["network"])
    for layer in net.values():
        layer.pop("dropout", None)
        if layer.get("unit_opts"):
            layer["unit_opts"].update(dropout=0.0, dropout_h=0.0)
    m = model_of(name, net)
    load_for_inference(Config({"load": fixture(name)}), m, fixture(name))
    expected = np.load(FIXTURES / f"{name}.npz")
    got = m(expected["data"], expected["lengths"], training=True, seed=tf.constant([1, 2], tf.int64))
    for layer in (n for n in net if n != "output"):
        for b, length in enumerate(expected["lengths"]):
            np.testing.assert_allclose(got[layer].numpy()[b, :length], expected[f"out:{layer}"][b, :length],
                                       atol=TOLERANCE, rtol=0, err_msg=layer)


def test_initial_values_are_returnns():
    p = {k: v.numpy() for k, v in model({"global_norm": False, "per_gate_norm": True, "forget_bias": 1.0,
                                         "norm_gain": 2.0, "norm_shift": 0.5}).layers["l"].params.items()}
    assert all(np.all(v == 2.0) for k, v in p.items() if k.startswith("gamma_"))
    assert np.all(p["beta_f_gate"] == 1.5) and np.all(p["beta_i_gate"] == 0.5)
    assert np.all(p["beta_new_c"] == 0.5)
    # global norm: RETURNN adds the forget bias to the whole beta of input_below; state_below has no beta
    p = {k: v.numpy() for k, v in model({"forget_bias": 1.0}).layers["l"].params.items()}
    assert np.all(p["beta_input_below"] == 1.0) and "beta_state_below" not in p
    limit = np.sqrt(6 / (5 + 16))
    assert 0.7 * limit < np.abs(p["W_ff"]).max() <= limit
    p = {k: v.numpy() for k, v in model({"global_norm": False, "with_concat": True, "forget_bias": 1.0},
                                        forward_weights_init=0.1).layers["l"].params.items()}
    np.testing.assert_array_equal(p["bias_ff_re"], np.repeat([0.0, 0.0, 1.0, 0.0], 4))
    assert np.all(p["W_ff_re"] == 0.1)  # the recurrent initializer falls back on the forward one
    p = {k: v.numpy() for k, v in model({"global_norm": False, "cell_norm": False}, forward_weights_init=0.1,
                                        recurrent_weights_init=0.2).layers["l"].params.items()}
    assert np.all(p["W_ff"] == 0.1) and np.all(p["W_re"] == 0.2) and np.all(p["bias_ff"] == 0.0)
    assert sorted(p) == ["W_ff", "W_re", "bias_ff"]


def test_checkpoint_names_are_returnns():
    """As RETURNN 1.2026x names them (its global variables for unit_opts {}), and back."""
    m = model()
    view = ReturnnView(m)
    assert sorted(view.shapes()) == sorted(f"l/rec/{n}" for n in (
        "W_ff", "gamma_input_below", "beta_input_below", "W_re", "gamma_state_below", "gamma_new_c",
        "beta_new_c"))
    values = {name: np.full(shape, 0.25, np.float32) for name, shape in view.shapes().items()}
    view.assign(values)
    assert all(np.all(v.numpy() == 0.25) for v in m.layers["l"].params.values())
    assert "layernormvariantslstm" in layer_kernels(m)["l"]


@pytest.mark.parametrize("unit_opts, match", [
    ({"activation": "relu"}, "unit_opts 'activation' is not implemented: RETURNN calls"),
    ({"dropout_seed": 1}, "unit_opts 'dropout_seed' is not implemented"),
    ({"is_training": True}, "unit_opts 'is_training' is not implemented"),
    ({"zoneout": 0.1}, "unit_opts 'zoneout' is no option of RETURNN's LayerNormVariantsLSTMCell; it takes "
                       "norm_gain"),
    ({"cell_norm": 1}, "unit_opts 'cell_norm' must be True or False"),
    ({"norm_gain": "1"}, "unit_opts 'norm_gain' must be a number"),
    ({"dropout_h": 1.0}, r"unit_opts 'dropout_h' must be a rate in \[0, 1\)"),
    ({"global_norm_joined": True}, "unit_opts global_norm and global_norm_joined are both on"),
    ({"per_gate_norm": True}, "unit_opts per_gate_norm and global_norm are both on"),
    ({"global_norm": False, "global_norm_joined": True, "per_gate_norm": True},
     "unit_opts per_gate_norm and global_norm_joined are both on"),
    ({"with_concat": True}, "unit_opts with_concat and global_norm are both on"),
    ("cell_norm", "unit_opts must be a dict"),
])
def test_refused_unit_opts_are_named(unit_opts, match):
    with pytest.raises(ConfigError, match=f"Network layer 'l': {match}"):
        parse_network(network(unit_opts))


def test_other_refusals():
    with pytest.raises(ConfigError, match="bias_init on unit 'LayerNormVariantsLSTM' is refused"):
        model(bias_init=0.1)
    with pytest.raises(ConfigError, match="direction must be 1 or -1"):
        model(direction=0)
    plain = {"l": {"class": "rec", "unit": "standardlstm", "n_out": 4, "unit_opts": {"forget_bias": 0.0}},
             "output": {"class": "copy", "from": "l"}}
    with pytest.raises(ConfigError, match="unit_opts .* on unit 'standardlstm' is not implemented"):
        parse_network(plain)
    plain["l"]["unit_opts"] = {}
    parse_network(plain)  # no options


def test_check_accepts_the_published_networks_and_names_a_bad_option():
    layer = {"class": "rec", "unit": "layernormvariantslstm", "n_out": 500, "dropout": 0.1, "L2": 0.01,
             "unit_opts": {"global_norm": False, "per_gate_norm": True, "cell_norm": False}}
    net = {"fw": {**layer, "direction": 1}, "bw": {**layer, "direction": -1},
           "output": {"class": "softmax", "loss": "ce", "from": ["fw", "bw"]}}
    findings, problems = collect(Config({"network": net, "num_outputs": 9, "num_inputs": 4}))
    assert not problems and not stop_reason(findings, problems)
    net["fw"] = {**net["fw"], "unit_opts": {"hidden_norm": True, "cell_clip": 1.0}}
    findings, problems = collect(Config({"network": net, "num_outputs": 9, "num_inputs": 4}))
    assert "unit_opts 'cell_clip' is no option" in stop_reason(findings, problems)
