"""A ``subnetwork`` layer inside a rec unit (the LM of shallow fusion) and its ``load_on_init``. Its outputs
and gradients equal RETURNN's (fixture case ``unit_subnetwork``: tests/test_returnn_checkpoints.py); here
how its references resolve, what is refused, and the loading of its parameters from a checkpoint RETURNN
wrote (tests/fixtures/returnn_ckpt/dense: hidden/W, hidden/b, output/W, output/b)."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from engine.config.loader import Config
from engine.model.rec.unit import parse_unit
from engine.runtime import log
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.file_format import save_checkpoint
from engine.training.checkpoints.initial_params import init_for_training, load_for_inference
from returnn_fixtures import fixture, model_of, stored, values

LM = {"class": "subnetwork", "from": "data:source", "n_out": 4, "subnetwork": {
    "hidden": {"class": "linear", "activation": "tanh", "n_out": 6},
    "output": {"class": "linear", "activation": None, "n_out": 4, "from": "hidden"}}}
NETWORK = {"loop": {"class": "rec", "from": "data", "unit": {
    "am": {"class": "linear", "activation": "tanh", "from": "data:source", "n_out": 3},
    "lm": LM,
    "output": {"class": "linear", "activation": None, "from": ["am", "lm"], "n_out": 4}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}


def network(**lm_opts):
    net = copy.deepcopy(NETWORK)
    net["loop"]["unit"]["lm"].update(lm_opts)
    return net


def test_its_layers_join_the_unit_under_its_name_reading_its_input_the_unit_and_each_other():
    unit = {"am": {"class": "linear", "from": "data:source", "n_out": 3},
            "lm": {"class": "subnetwork", "from": ["prev:output", "am"], "subnetwork": {
                "input": {"class": "linear", "n_out": 3},
                "mix": {"class": "combine", "kind": "add", "from": ["input", "prev:mix", "base:am"]},
                "output": {"class": "copy", "from": "mix"}}},
            "output": {"class": "linear", "from": "lm", "n_out": 3}}
    layers = parse_unit("loop", unit)
    assert sorted(layers) == ["am", "lm", "lm/input", "lm/mix", "lm/output", "output"]
    assert [str(r) for r in layers["lm/input"].sources] == ["prev:output", "am"]  # no 'from': its 'data'
    assert [str(r) for r in layers["lm/mix"].sources] == ["lm/input", "prev:lm/mix", "am"]
    assert layers["lm"].cls == "copy" and [str(r) for r in layers["lm"].sources] == ["lm/output"]


@pytest.mark.parametrize("opts, words", [
    ({"dropout": 0.1}, "'dropout' on the subnetwork's input"),
    ({"concat_sources": False}, "concat_sources"),
    ({"load_on_init": {"filename": "x"}}, "load_on_init must be a checkpoint path"),
    ({"n_out": 5}, "n_out 5 differs from its 'output' layer's n_out 4"),
    ({"L2": 0.1}, "option(s) ['L2']"),
    ({"subnetwork": {"output": {"class": "copy", "from": "lm_state"}}}, "reads 'lm_state', which is not a "
                                                                        "layer of the subnetwork"),
    ({"subnetwork": {"v": {"class": "variable", "shape": (2,)}, "output": {"class": "copy", "from": "v"}}},
     "class 'variable' is not implemented inside a subnetwork"),
    ({"subnetwork": {"hidden": {"class": "linear", "n_out": 2}}}, "with an 'output' layer"),
])
def test_what_is_not_implemented_is_refused_naming_the_subnetwork(opts, words):
    with pytest.raises(ConfigError) as info:
        parse_unit("loop", network(**opts)["loop"]["unit"])
    assert "unit layer 'lm' (a subnetwork)" in str(info.value) and words in str(info.value)


def test_trainable_false_keeps_every_parameter_of_it():
    model = model_of("dense", network(trainable=False))
    params = model.layers["loop"].params
    frozen = {key for key, var in params.items() if not var.trainable}
    assert frozen == {"lm/hidden/W", "lm/hidden/b", "lm/output/W", "lm/output/b"}


def test_load_on_init_takes_its_parameters_from_the_names_inside_it_at_the_start_of_training():
    model = model_of("dense", network(load_on_init=fixture("dense")))
    before = values(model)
    init_for_training(Config({}), model)
    after, file = values(model), stored(fixture("dense"))
    for name in ("hidden/W", "hidden/b", "output/W", "output/b"):
        np.testing.assert_array_equal(after[f"loop/lm/{name}"], file[name])
    for name in ("loop/am/W", "loop/output/W", "output/W"):
        np.testing.assert_array_equal(after[name], before[name])  # not the subnetwork's


def test_load_on_init_is_kept_when_the_model_is_loaded_after_it_as_in_returnn(tmp_path):
    model = model_of("dense", network(load_on_init=fixture("dense")), seed=7)
    main = str(tmp_path / "main.001")
    save_checkpoint(main, model.named_variables(), [], epoch=1, global_step=0)  # the seed's values
    other = model_of("dense", network(load_on_init=fixture("dense")), seed=8)
    load_for_inference(Config({}), other, main)
    got, saved = values(other), values(model)
    np.testing.assert_array_equal(got["loop/lm/hidden/W"], stored(fixture("dense"))["hidden/W"])
    np.testing.assert_array_equal(got["loop/am/W"], saved["loop/am/W"])


def test_load_on_init_names_the_layer_and_the_parameters_the_file_lacks():
    net = network(load_on_init=fixture("dense"))
    net["loop"]["unit"]["lm"]["subnetwork"]["extra"] = {"class": "linear", "n_out": 2, "from": "hidden"}
    net["loop"]["unit"]["lm"]["subnetwork"]["output"]["from"] = ["hidden", "extra"]
    with pytest.raises(ConfigError) as info:
        init_for_training(Config({}), model_of("dense", net))
    message = str(info.value)
    assert "Network layer 'loop', unit layer 'lm': load_on_init" in message
    assert "missing in the checkpoint" in message and "loop/rec/lm/extra/W" in message


def test_load_on_init_of_a_file_that_does_not_exist_is_an_error_naming_it(tmp_path):
    model = model_of("dense", network(load_on_init=str(tmp_path / "lm.ckpt")))
    with pytest.raises(ConfigError, match="load_on_init: checkpoint '.*lm.ckpt' does not exist"):
        init_for_training(Config({}), model)


def test_a_target_without_a_loss_has_no_effect_and_says_so(capsys):
    """2020-lm-integration's ``lm_output_prob``: an activation with a target and no loss."""
    unit = network()["loop"]["unit"]
    unit["lm_prob"] = {"class": "activation", "activation": "softmax", "from": "lm", "target": "classes"}
    log.init()
    try:
        layers = parse_unit("loop", unit)
    finally:
        log.close()
    assert layers["lm_prob"].cls == "activation"
    captured = capsys.readouterr()
    assert ("unit layer 'lm_prob': option 'target' has no effect on a activation layer"
            in captured.out + captured.err)
