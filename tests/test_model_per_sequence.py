"""Values per sequence: ``length``, a top-level ``compare`` of it, read by a rec unit's ``switch`` as
``base:`` (2019-e2e-speech-to-text-comparison's multi-input decoders). Equal to RETURNN's with the unit
(fixture case ``seq_length_switch``: tests/test_returnn_checkpoints.py); here the values, the refusals,
and a search through such a switch."""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from engine.model.spec import parse_network
from engine.runtime.errors import ConfigError
from test_model_rec import NETWORK, batch, model, searched_scores_checked

FLAGS = {"len": {"class": "length", "from": "data"},
         "short": {"class": "compare", "from": "len", "kind": "less_equal", "value": 4}}


@pytest.mark.parametrize("kind, expected", [("less_equal", [False, True, True]),
                                            ("equal", [False, True, False]),
                                            ("greater", [True, False, False])])
def test_a_length_and_its_comparison_per_sequence(kind, expected):
    network = copy.deepcopy(NETWORK)
    network.update(copy.deepcopy(FLAGS))
    network["short"]["kind"] = kind
    network["output"]["unit"]["prev_att"] = {"class": "switch", "condition": "base:short",
                                             "true_from": "prev:att", "false_from": "prev:att"}
    data, _, labels, label_lengths = batch()
    lengths = np.array([6, 4, 2], np.int32)
    out = model(network)(data, lengths, streams={"classes": labels},
                         stream_lengths={"classes": label_lengths})
    np.testing.assert_array_equal(out["len"].numpy().reshape(-1), lengths)
    np.testing.assert_array_equal(out["short"].numpy().reshape(-1), expected)


@pytest.mark.parametrize("changes, words", [
    ({"len": {"class": "length", "from": "data"},
      "output": {"class": "softmax", "loss": "ce", "from": "len"}},
     "'output' reads 'len', a length per sequence; here only a compare layer reads such a layer"),
    ({"short": {"class": "compare", "from": "data", "value": 1},
      "output": {"class": "softmax", "loss": "ce", "from": "data"}},
     "compare at the top level is implemented on one length layer's output"),
    ({**FLAGS, "output": {"class": "softmax", "loss": "ce", "from": ["data", "short"]}},
     "reads 'short', a flag per sequence (a compare of a length); here only a rec unit"),
])
def test_other_readers_are_refused_by_the_check(changes, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        parse_network(changes)  # rnn.py --check, without TensorFlow


@pytest.mark.parametrize("opts, words", [({"axis": "F"}, "length over axis 'F'"),
                                         ({"add_time_axis": True}, "length with add_time_axis True"),
                                         ({"dtype": "float32"}, "length with dtype 'float32'")])
def test_length_options_other_than_returnns_defaults_are_refused(opts, words):
    network = copy.deepcopy(NETWORK)
    network.update(copy.deepcopy(FLAGS))
    network["len"].update(opts)
    network["output"]["unit"]["prev_att"] = {"class": "switch", "condition": "base:short",
                                             "true_from": "prev:att", "false_from": "prev:att"}
    with pytest.raises(ConfigError, match=re.escape(words)):
        model(network)


def test_a_searched_hypothesis_through_a_switch_by_a_flag_per_sequence_scores_its_log_probability():
    """The flag is tiled by the beam as the encoder is (lengths 10, 8, 6: two sequences take the zeros)."""
    network = copy.deepcopy(NETWORK)
    network.update(copy.deepcopy(FLAGS))
    network["short"]["value"] = 8
    unit = network["output"]["unit"]
    unit["zero_att"] = {"class": "eval", "eval": "tf.zeros_like(source(0))", "from": "prev:att",
                        "out_type": {"dim": 12, "shape": (12,)}}
    unit["prev_att"] = {"class": "switch", "condition": "base:short", "true_from": "zero_att",
                        "false_from": "prev:att"}
    unit["s"]["from"] = ["prev:target_embed", "prev_att"]
    unit["output"].update(beam_size=3, length_normalization=False)
    assert searched_scores_checked(model(network))
