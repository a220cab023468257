"""``unit_opts`` ``rec_weight_dropout`` of the LSTM units RETURNN runs as its NativeLstm2
(2022-scale-learning's encoders): in training the recurrent weights W_re are dropped (one mask per step,
kept entries scaled by 1 / (1 - rate), as RETURNN's NativeLstm2 calls its dropout on W_re); outside
training nothing changes."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.model.spec import parse_network
from engine.runtime.errors import ConfigError

IN, N = 3, 8


def model(unit="nativelstm2", unit_opts=None):
    network = {"l": {"class": "rec", "unit": unit, "n_out": N, "from": "data", "unit_opts": unit_opts},
               "output": {"class": "softmax", "loss": "ce", "from": "l", "n_out": 2}}
    return build_model(network, input_dim=IN, input_sparse=False, target_dims={"classes": 2}, random_seed=3)


def batch():
    rng = np.random.default_rng(0)
    return tf.constant(rng.normal(size=(2, 7, IN)).astype(np.float32)), tf.constant([7, 4], tf.int32)


def test_outside_training_the_output_is_the_plain_lstms():
    plain, dropped = model(), model(unit_opts={"rec_weight_dropout": 0.5})
    x, lengths = batch()
    np.testing.assert_array_equal(plain.layers["l"].params["W"].numpy(),
                                  dropped.layers["l"].params["W"].numpy())
    np.testing.assert_array_equal(plain(x, lengths)["l"].numpy(), dropped(x, lengths)["l"].numpy())


def test_training_runs_the_lstm_with_its_recurrent_weights_dropped():
    """The training output equals the plain LSTM's with W replaced by the dropped W (nothing else changes),
    and differs from the undropped one."""
    dropped = model(unit_opts={"rec_weight_dropout": 0.5})
    layer = dropped.layers["l"]
    x, lengths = batch()
    seed = tf.constant([5, 6], tf.int64)
    trained = dropped(x, lengths, training=True, seed=seed)["l"].numpy()
    layer_seed = tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(seed, dropped.order.index("l")), 1)
    weights = layer._weights(True, layer_seed).numpy()
    plain = model()
    plain.layers["l"].params["W"].assign(weights)
    np.testing.assert_allclose(trained, plain(x, lengths)["l"].numpy(), atol=1e-6)
    assert np.abs(trained - dropped(x, lengths)["l"].numpy()).max() > 1e-3


@pytest.mark.parametrize("shape", [None, (None, 1), (1, None)])
def test_the_mask_is_inverted_dropout_on_w_re_only(shape):
    rate = 0.25
    layer = model(unit_opts={"rec_weight_dropout": rate, "rec_weight_dropout_shape": shape}).layers["l"]
    weights = layer.params["W"].numpy()
    kept = []
    for i in range(40):
        dropped = layer._weights(True, tf.constant([i, 1], tf.int64)).numpy()
        np.testing.assert_array_equal(dropped[:IN], weights[:IN])  # the input weights W stay
        recurrent = dropped[IN:]
        mask = recurrent != 0
        np.testing.assert_allclose(recurrent[mask], weights[IN:][mask] / (1 - rate), rtol=1e-6)
        if shape == (None, 1):  # one draw per row of W_re
            assert all(row.all() or not row.any() for row in mask)
        if shape == (1, None):
            assert all(col.all() or not col.any() for col in mask.T)
        kept.append(mask.mean())
    assert 0.70 < np.mean(kept) < 0.80
    np.testing.assert_array_equal(layer._weights(False, None).numpy(), weights)


@pytest.mark.parametrize("unit, unit_opts, match", [
    ("nativelstm", {"rec_weight_dropout": 0.1}, "RETURNN runs this unit as another cell than NativeLstm2"),
    ("basiclstm", {"rec_weight_dropout": 0.1}, "another cell than NativeLstm2"),
    ("lstm", {"rec_weight_dropout": 1.0}, r"rec_weight_dropout must be a rate in \[0, 1\)"),
    ("lstm", {"rec_weight_dropout": 0.1, "rec_weight_dropout_shape": (2, None)}, "rec_weight_dropout_shape"),
    ("lstm", {"forget_bias": 1.0}, "asserts forget_bias 0"),
    ("lstm", {"use_peepholes": True}, r"\['use_peepholes'\] not implemented"),
])
def test_refusals_name_the_layer_and_option(unit, unit_opts, match):
    network = {"l": {"class": "rec", "unit": unit, "n_out": N, "unit_opts": unit_opts},
               "output": {"class": "softmax", "loss": "ce", "from": "l"}}
    with pytest.raises(ConfigError, match=f"Network layer 'l': unit_opts .*{match}"):
        parse_network(network)


@pytest.mark.parametrize("unit", ["lstm", "lstmp", "nativelstm2", "LSTMBlock", "LSTMBlockFused", "CudnnLSTM"])
def test_the_units_returnn_runs_as_native_lstm2_take_it(unit):
    layer = model(unit=unit, unit_opts={"rec_weight_dropout": 0.1, "forget_bias": 0.0}).layers["l"]
    assert layer.needs_seed and layer.rec_weight_dropout == 0.1
