"""An utterance's one frame (``reduce`` over time with ``keep_dims``) and ``dot`` with it, as the
speaker-adaptive Conformer hybrids (2022-swb-conformer-hybrid-sat) use them; equal to RETURNN's on the
fixture case ``ivector_dot`` (tests/test_returnn_checkpoints.py). Here: the masking and the refusals."""
from __future__ import annotations

import numpy as np
import pytest

from engine.model import build_model
from engine.model.spec import parse_network
from engine.runtime.errors import ConfigError

NETWORK = {
    "frames": {"class": "linear", "activation": "tanh", "n_out": 4, "from": "data"},
    "avg": {"class": "reduce", "mode": "avg", "axis": "T", "keep_dims": True, "from": "data"},
    "max": {"class": "reduce", "mode": "max", "axis": "T", "keep_dims": True, "from": "data"},
    "proj": {"class": "linear", "activation": None, "n_out": 4, "from": ["avg", "max"]},
    "score": {"class": "dot", "red1": "F", "red2": "F", "var1": "T", "var2": "T", "from": ["frames", "proj"]},
    "weighted": {"class": "dot", "red1": 2, "red2": 1, "var1": 1, "var2": 2, "from": ["score", "proj"]},
    "output": {"class": "softmax", "loss": "ce", "from": ["frames", "weighted"], "n_out": 2},
}


def model(**changes):
    network = {**NETWORK, **changes}
    return build_model(network, input_dim=3, input_sparse=False, target_dims={"classes": 2}, random_seed=1)


def test_the_frame_of_an_utterance_is_over_its_valid_frames_and_dot_uses_it_per_frame():
    rng = np.random.default_rng(0)
    data = rng.normal(size=(2, 6, 3)).astype(np.float32)
    data[1, 4:] = 100.0  # padding: never read
    lengths = np.array([6, 4], np.int32)
    out = model()(data, lengths)
    np.testing.assert_allclose(out["avg"][:, 0], [data[0].mean(0), data[1, :4].mean(0)], rtol=1e-5)
    np.testing.assert_allclose(out["max"][:, 0], [data[0].max(0), data[1, :4].max(0)], rtol=1e-6)
    assert out["avg:lengths"].numpy().tolist() == [1, 1]
    assert out["weighted:lengths"].numpy().tolist() == [6, 4]
    score = np.einsum("btf,bf->bt", out["frames"].numpy(), out["proj"].numpy()[:, 0])
    np.testing.assert_allclose(out["score"].numpy()[:, :, 0], score, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["weighted"].numpy(), score[:, :, None] * out["proj"].numpy(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("changes, match", [
    ({"score": {**NETWORK["score"], "from": ["frames", "frames"]}},
     "'score': dot's second source must be one frame"),
    ({"score": {**NETWORK["score"], "var1": 2, "red1": 1}}, "dot with red1 1, var1 2, .* is not implemented"),
    ({"score": {**NETWORK["score"], "red2": 0}}, r"dot red2 0 must name the time \(1, 'T'\) or feature"),
    ({"weighted": {**NETWORK["weighted"], "from": ["frames", "proj"]}},
     "reduces the first source's 4 features against the second source's one frame: they must be 1"),
    ({"avg": {**NETWORK["avg"], "mode": "logsumexp"}}, "mode 'logsumexp' over time is not implemented"),
    ({"avg": {**NETWORK["avg"], "use_time_mask": False}}, "use_time_mask False over time"),
    ({"output": {**NETWORK["output"], "from": "proj"}}, "'output' is one frame per sequence"),
])
def test_what_is_not_implemented_is_named(changes, match):
    with pytest.raises(ConfigError, match=match):
        model(**changes)


def test_time_is_reduced_alone_to_one_frame_or_one_vector_which_only_rec_units_read():
    network = {"avg": {"class": "reduce", "mode": "avg", "axis": "T", "from": "data"},
               "output": {"class": "softmax", "loss": "ce", "from": "avg", "n_out": 2}}
    with pytest.raises(ConfigError, match=r"Network layer 'output' is one vector per sequence \(RETURNN's "
                                          r"value without a time axis\): the output needs the frames"):
        parse_network(network)  # rnn.py --check, without TensorFlow
    mixed = {**network, "output": {"class": "softmax", "loss": "ce", "from": ["avg", "data"], "n_out": 2}}
    with pytest.raises(ConfigError, match=r"'output' reads 'avg', one vector per sequence \(RETURNN's value "
                                          r"without a time axis\); here only rec units \(as 'base:...'\) "
                                          r"and the classes linear, softmax, copy"):
        parse_network(mixed)
    del network["avg"]["axis"]
    network["avg"].update(axes=["T", "F"], keep_dims=True)
    with pytest.raises(ConfigError, match=r"\(axes \['T', 'F'\], keep_dims True\)"):
        build_model(network, input_dim=3, input_sparse=False, target_dims={"classes": 2})
