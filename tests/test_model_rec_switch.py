"""The step ``:i`` and ``switch`` inside a rec unit (2021-internal-lm-attention's internal LM: a first frame
reads a zero attention). Their outputs and gradients equal RETURNN's (fixture case ``unit_switch_step``:
tests/test_returnn_checkpoints.py); here the plan, what is refused, and a search through them."""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from engine.model.rec.unit import parse_unit, plan_loop
from engine.runtime.errors import ConfigError
from test_model_rec import NETWORK, batch, model, searched_scores_checked

# the attention decoder of test_model_rec, its state fed with a zero attention at the first label
SWITCHED = copy.deepcopy(NETWORK)
SWITCHED["output"]["unit"].update({
    "is_first_frame": {"class": "compare", "from": ":i", "kind": "equal", "value": 0},
    "zero_att": {"class": "eval", "eval": "tf.zeros_like(source(0))", "from": "prev:att",
                 "out_type": {"dim": 12, "shape": (12,)}},
    "prev_att": {"class": "switch", "condition": "is_first_frame", "true_from": "zero_att",
                 "false_from": "prev:att"},
    "s": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["prev:target_embed", "prev_att"], "n_out": 8}})
# ilm_seq_avg's: the encoder's mean over time in place of the attention after the first label
SEQ_AVG = copy.deepcopy(SWITCHED)
SEQ_AVG["enc_mean"] = {"class": "reduce", "mode": "mean", "axes": ["t"], "keep_dims": False,
                       "from": "encoder"}
SEQ_AVG["output"]["unit"]["prev_att"]["false_from"] = "base:enc_mean"


def test_what_reads_the_step_stays_in_the_loop_and_the_log_lists_the_step_there():
    layers = parse_unit("output", SWITCHED["output"]["unit"])
    plan = plan_loop(layers, search=False)
    assert {"is_first_frame", "prev_att", "zero_att"} <= set(plan.in_loop)
    lines = plan.log_lines("output", search=False, training=True)
    in_loop = lines.index("  Layers in loop: (#: %d)" % (len(plan.in_loop) + 1))
    assert "    :i" in lines[in_loop + 1:in_loop + 2 + len(plan.in_loop)]


def test_a_step_read_only_behind_the_loop_is_every_step_at_once():
    unit = {"h": {"class": "linear", "from": ["data:source", "prev:h"], "n_out": 3},
            "first": {"class": "compare", "from": ":i", "value": 0},
            "output": {"class": "switch", "condition": "first", "true_from": "h", "false_from": "prev:h"}}
    net = model({"loop": {"class": "rec", "from": "data", "unit": unit},
                 "output": {"class": "softmax", "loss": "ce", "from": "loop", "n_out": 7}})
    plan = net.layers["loop"].plan
    assert (plan.outputs_moved_out, plan.in_loop) == (("output", "first"), ("h",))
    # RETURNN 1.20261022's log of this unit: ':i' moves behind the loop with what reads it
    assert plan.log_lines("loop", search=False, training=True)[3:8] == [
        "  Output layers moved out of loop: (#: 3)", "    output", "    first", "    :i",
        "  Layers in loop: (#: 1)"]
    data, lengths, _, _ = batch()
    out = net(data, lengths)
    h, loop = out["loop/h"].numpy(), out["loop/output"].numpy()
    np.testing.assert_allclose(loop[:, 0], h[:, 0], rtol=1e-6)  # step 0: true_from
    np.testing.assert_allclose(loop[:, 1:], h[:, :-1], rtol=1e-6)  # later: prev:h


@pytest.mark.parametrize("change, words", [
    ({"zero_att": {"class": "eval", "eval": "source(0)", "from": ":i"}},
     "reads ':i' (the step); here a compare layer reads it, a eval layer does not"),
    ({"prev_att": {"class": "switch", "condition": "is_first_frame", "true_from": 0.0,
                   "false_from": "prev:att"}},
     "switch needs 'true_from', the name of a layer; got 0.0"),
    ({"prev_att": {"class": "switch", "condition": "is_first_frame", "true_from": "zero_att",
                   "false_from": "prev:att", "from": "zero_att"}},
     "switch reads no 'from' here (its layers are condition, true_from and false_from)"),
    ({"prev_att": {"class": "switch", "condition": "prev:target_embed", "true_from": "zero_att",
                   "false_from": "prev:att"}},
     "switch's condition must be a compare layer's output (bool)"),
])
def test_what_is_not_implemented_is_refused_naming_the_layer(change, words):
    network = copy.deepcopy(SWITCHED)
    network["output"]["unit"].update(change)
    with pytest.raises(ConfigError, match=re.escape(words)):
        model(network)


@pytest.mark.parametrize("base", [SWITCHED, SEQ_AVG], ids=["zero", "seq-avg"])
def test_a_searched_hypothesis_through_the_switch_scores_its_log_probability(base):
    """The search reads ':i' per step on the beam's rows (and a vector per sequence, tiled by the beam)
    as training does per label: the decided hypothesis' score is its log probability when the network is
    run on it as a target."""
    network = copy.deepcopy(base)
    network["output"]["unit"]["output"].update(beam_size=3, length_normalization=False)
    assert searched_scores_checked(model(network))


@pytest.mark.parametrize("network, words", [
    ({"mean": {"class": "reduce", "mode": "mean", "axes": "T", "from": "data"},
      "output": {"class": "softmax", "loss": "ce", "from": ["mean", "data"]}},
     "reads 'mean', one vector per sequence"),
    ({"output": {"class": "reduce", "mode": "mean", "axes": "T", "from": "data"}},
     "'output' is one vector per sequence"),
])
def test_one_vector_per_sequence_is_read_by_rec_units_only(network, words):
    """A reduce over time without keep_dims (2021-internal-lm-attention's encoder_mean): RETURNN's (B, F),
    which a rec unit reads as base: at every step (fixture case ``unit_base_vector``)."""
    with pytest.raises(ConfigError, match=re.escape(words)):
        model(network)
