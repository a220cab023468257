"""``debug_add_check_numerics_on_output`` (111 published configs set it): a NaN or Inf in a layer's output
stops the step naming the layer, as RETURNN's check_numerics on each layer's output does."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.model import build_model

NETWORK = {"hidden": {"class": "eval", "eval": "tf.math.log(source(0))", "from": "data"},
           "output": {"class": "softmax", "loss": "ce", "from": "hidden", "n_out": 2}}


def model(check: bool):
    config = Config({"network": NETWORK, "debug_add_check_numerics_on_output": check})
    return build_model(config, input_dim=3, input_sparse=False, target_dims={"classes": 2})


def test_a_nan_stops_the_step_naming_the_layer_only_when_asked():
    data = np.full((1, 2, 3), -1.0, np.float32)  # log of a negative number: NaN
    lengths = np.array([2], np.int32)
    assert np.isnan(model(False)(data, lengths)["hidden"].numpy()).all()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="Network layer 'hidden': its output has a NaN or Inf"):
        model(True)(data, lengths)
    finite = model(True)(np.ones((1, 2, 3), np.float32), lengths)
    assert np.isfinite(finite["output"].numpy()).all()
