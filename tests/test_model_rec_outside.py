"""A rec unit's layer read outside its rec layer, ``"<rec>/<unit layer>"`` (2019-e2e-speech-to-text-
comparison's triangle models: the second decoder attends to the first one's ``output2/readout``). Equal to
RETURNN's in a loop over input frames (fixture case ``unit_layer_outside``:
tests/test_returnn_checkpoints.py); here the decoder loop over labels, and what is refused."""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from engine.model.spec import parse_network
from engine.runtime.errors import ConfigError
from test_model_rec import NETWORK, batch, model

READ = copy.deepcopy(NETWORK)
READ["output"]["unit"]["readout"]["is_output_layer"] = True
READ["h_out"] = {"class": "softmax", "loss": "ce", "target": "classes", "from": "output/readout"}


def test_the_readout_on_every_label_is_read_with_the_labels_lengths():
    data, lengths, labels, label_lengths = batch()
    out = model(READ)(data, lengths, streams={"classes": labels}, stream_lengths={"classes": label_lengths})
    np.testing.assert_array_equal(out["h_out:lengths"].numpy(), label_lengths)
    readout = out["output/readout"].numpy()
    assert readout.shape[:2] == labels.shape
    net = model(READ)
    w, b = (net.named_variables()[f"h_out/{k}"].numpy() for k in ("W", "b"))
    out = net(data, lengths, streams={"classes": labels}, stream_lengths={"classes": label_lengths})
    logits = out["output/readout"].numpy() @ w + b
    np.testing.assert_allclose(out["h_out:logits"].numpy(), logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change, words", [
    ({"from": "output/readout_x"}, "'from' names 'output/readout_x', but the unit of rec layer 'output' has "
                                   "no layer 'readout_x'"),
    ({"from": "output/readout_in"}, "reads 'output/readout_in', which the loop of 'output' does not give: "
                                    "set 'is_output_layer': True on unit layer 'readout_in'"),
])
def test_a_unit_layer_the_loop_does_not_give_is_refused_by_the_check(change, words):
    network = copy.deepcopy(READ)
    network["h_out"].update(change)
    with pytest.raises(ConfigError, match=re.escape(words)):
        parse_network(network)


def test_a_search_through_a_unit_layer_read_outside_is_refused():
    net = model(READ)
    data, lengths, _, _ = batch()
    with pytest.raises(ConfigError, match="reading its steps outside is implemented in training and eval"):
        net.search(data, lengths, "decision")
