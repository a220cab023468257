"""``rnn_cell`` units in a rec unit beyond TensorFlow's LSTMCell: ZoneoutLSTM (2021-internal-lm-attention's
and 2022-scale-learning's decoders: that LSTMCell, then c and h zoned out) and LayerNormVariantsLSTM
(2019-asr-layer-norm-lstm's). Their outputs equal RETURNN's (fixture cases ``unit_zoneout`` outside
training, ``unit_lnlstm`` with gradients: tests/test_returnn_checkpoints.py); here what training draws."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import tensorflow as tf

from engine.model.network import NetworkModel
from engine.model.rec.frames import Template, Value
from engine.model.rec.unit import parse_unit
from engine.runtime.errors import ConfigError

UNIT = {"s": {"class": "rnn_cell", "unit": "ZoneoutLSTM", "from": ["data:source", "prev:s"], "n_out": 64,
              "unit_opts": {"zoneout_factor_cell": 0.3, "zoneout_factor_output": 0.1}},
        "output": {"class": "copy", "from": "s"}}
NETWORK = {"loop": {"class": "rec", "from": "data", "unit": UNIT},
           "output": {"class": "softmax", "loss": "ce", "from": "loop", "n_out": 2}}


def cell(unit_opts=None):
    network = copy.deepcopy(NETWORK)
    if unit_opts is not None:
        network["loop"]["unit"]["s"]["unit_opts"] = unit_opts
    model = NetworkModel(network, input_dim=3, input_sparse=False, target_dims={"classes": 2}, random_seed=1)
    return model.layers["loop"].units["s"]


def run(unit, training, seed=(1, 2)):
    """One step on fixed inputs (data:source, prev:s) and state: (output, (c, h)), and the state before."""
    rng = np.random.default_rng(0)
    x, prev_s, c, h = (tf.constant(rng.normal(size=(8, n)).astype(np.float32)) for n in (3, 64, 64, 64))
    unit.training, unit.seed = training, tf.constant(seed, tf.int64) if training else None
    values = [Value(x, Template((), 3), False), Value(prev_s, Template((), 64), False)]
    return unit.step(values, (c, h)), (c, h)


def plain_step(unit):
    """The LSTM's own new state, without zoneout."""
    zoneout, unit.zoneout = unit.zoneout, None
    try:
        return run(unit, False)[0]
    finally:
        unit.zoneout = zoneout


def test_in_training_each_unit_keeps_its_previous_value_at_the_zoneout_rate():
    unit = cell()
    (output, (c, h)), (prev_c, prev_h) = run(unit, True)
    new_h, (new_c, _) = plain_step(unit)
    for zoned, prev, new, rate in ((c, prev_c, new_c, 0.3), (h, prev_h, new_h, 0.1)):
        kept = np.isclose(zoned.numpy(), prev.numpy(), atol=1e-6)
        assert (kept | np.isclose(zoned.numpy(), new.numpy(), atol=1e-6)).all()  # the one or the other
        assert abs(kept.mean() - rate) < 0.06
    np.testing.assert_allclose(output.numpy(), new_h.numpy(), atol=1e-6)  # RETURNN's default output
    (_, (other_c, _)), _ = run(unit, True, seed=(3, 4))
    assert not np.array_equal(other_c.numpy(), c.numpy())  # a new draw per step's seed


def test_outside_training_the_state_is_the_mixture_and_use_zoneout_output_outputs_it():
    unit = cell({"zoneout_factor_cell": 0.3, "zoneout_factor_output": 0.1, "use_zoneout_output": True})
    (output, (c, h)), (prev_c, prev_h) = run(unit, False)
    new_h, (new_c, _) = plain_step(unit)
    np.testing.assert_allclose(c.numpy(), 0.7 * new_c.numpy() + 0.3 * prev_c.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.numpy(), 0.9 * new_h.numpy() + 0.1 * prev_h.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(output.numpy(), h.numpy())


@pytest.mark.parametrize("unit_opts, match", [
    ({"zoneout_factor_cell": 1.0}, r"zoneout_factor_cell must be in \[0, 1\), got 1.0"),
    ({"zoneout_factor_output": "0.1"}, "zoneout_factor_output must be in"),
    ({"use_zoneout_output": 1}, "use_zoneout_output must be True or False"),
    ({"forget_bias": 0.0}, r"unit_opts \['forget_bias'\] of rnn_cell unit ZoneoutLSTM"),
])
def test_bad_unit_opts_are_refused_by_the_check(unit_opts, match):
    unit = copy.deepcopy(UNIT)
    unit["s"]["unit_opts"] = unit_opts
    with pytest.raises(ConfigError, match=f"Network layer 'loop', unit layer 's': .*{match}"):
        parse_unit("loop", unit)


def test_other_rnn_cell_units_are_refused_by_the_check():
    unit = copy.deepcopy(UNIT)
    unit["s"].update(unit="NativeLstm2", unit_opts=None)
    with pytest.raises(ConfigError, match=r"unit layer 's': rnn_cell unit 'NativeLstm2' is not "
                                          "implemented here; implemented: LSTMBlock, .* ZoneoutLSTM and "
                                          "LayerNormVariantsLSTM"):
        parse_unit("loop", unit)


def test_an_lstm_cell_takes_forget_bias_alone_in_its_unit_opts():
    """The published LMs' ``{"forget_bias": 0.0}`` on LSTMBlock (fixture case ``unit_subnetwork``)."""
    unit = copy.deepcopy(UNIT)
    unit["s"].update(unit="LSTMBlock", unit_opts={"forget_bias": 0.0})
    parse_unit("loop", unit)
    for unit_opts, words in (({"forget_bias": 0.0, "use_peepholes": True}, "only 'forget_bias'"),
                             ({"forget_bias": "0"}, "forget_bias must be a number")):
        unit["s"]["unit_opts"] = unit_opts
        with pytest.raises(ConfigError, match=words):
            parse_unit("loop", unit)


def test_a_layer_norm_lstm_cell_keeps_its_dropout_masks_over_the_steps():
    """rnn_cell layernormvariantslstm: RETURNN draws its dropout masks once, outside its loop; the loop
    hands the cell one seed per call (``call_seed``), whatever the step's own seed."""
    network = copy.deepcopy(NETWORK)
    network["loop"]["unit"]["s"].update(unit="LayerNormVariantsLSTM", unit_opts={"dropout_h": 0.5})
    model = NetworkModel(network, input_dim=3, input_sparse=False, target_dims={"classes": 2}, random_seed=1)
    unit = model.layers["loop"].units["s"]
    unit.call_seed = tf.constant([7, 8], tf.int64)
    (first, _), _ = run(unit, True, seed=(1, 2))
    (again, _), _ = run(unit, True, seed=(5, 6))  # another step: the same masks
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    unit.call_seed = tf.constant([9, 10], tf.int64)
    (other, _), _ = run(unit, True)
    assert not np.allclose(other.numpy(), first.numpy())
    (evaluated, _), _ = run(unit, False)
    assert not np.allclose(evaluated.numpy(), first.numpy())


def test_a_state_of_a_cell_returnn_moves_out_of_the_loop_is_refused():
    """RETURNN moves a cell no recurrence reads out of the loop; its get_last_hidden_state there is the state
    after the last frame (found beside RETURNN 1.20261022: 0.04-0.45 apart from the step's state)."""
    network = copy.deepcopy(NETWORK)
    network["loop"]["unit"] = {
        "s": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["data:source"], "n_out": 3},
        "state": {"class": "get_last_hidden_state", "from": "s", "n_out": 6},
        "s2": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["s", "state"], "n_out": 2},
        "output": {"class": "copy", "from": "s2"}}
    options = dict(input_dim=3, input_sparse=False, target_dims={"classes": 2}, random_seed=1)
    with pytest.raises(ConfigError, match=r"unit layer 'state': RETURNN's plan moves the cell\(s\) \['s'\] "
                                          "out of the loop"):
        NetworkModel(copy.deepcopy(network), **options)
    network["loop"]["unit"]["s"]["from"] = ["data:source", "prev:s2"]  # in a recurrence: stays in the loop
    NetworkModel(network, **options)
