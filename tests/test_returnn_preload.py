"""RETURNN's ``preload_from_files`` against checkpoints RETURNN made (tests/fixtures/returnn_ckpt): which
entry applies to training and which to eval, prefixes, ignored and missing parameters, renamed ones, and
the errors that name the entry."""
from __future__ import annotations

import numpy as np
import pytest

from engine.config.loader import Config
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.file_format import save_checkpoint
from engine.training.checkpoints.initial_params import init_for_training, load_for_inference
from engine.training.checkpoints.preload_options import preload_entries
from returnn_fixtures import (CASES, FIXTURES, TOLERANCE, fixture, model_of, randomise, stored, values,
                              write_variant)

pytestmark = pytest.mark.tf_latest


def preload(model, entries: dict, training: bool = False, load: str | None = None) -> None:
    config = Config({"preload_from_files": entries, **({"load": load} if load else {})})
    if training:
        init_for_training(config, model)
    else:
        load_for_inference(config, model, load)


def test_preload_init_for_train_applies_to_training_only_and_the_others_to_eval_only(tmp_path):
    fresh = values(model_of("dense"))
    main = str(tmp_path / "main.001")  # the model of eval: the initial values
    save_checkpoint(main, model_of("dense").named_variables(), [], epoch=1, global_step=0)
    for init_for_train, training, applies in [(True, True, True), (True, False, False),
                                              (False, True, False), (False, False, True)]:
        model = model_of("dense")
        entries = {"x": {"filename": fixture("dense"), "init_for_train": init_for_train}}
        if training:
            preload(model, entries, training=True)
        else:
            preload(model, entries, load=main)
        loaded = not np.array_equal(values(model)["hidden/W"], fresh["hidden/W"])
        assert loaded == applies, (init_for_train, training)


def test_preload_prefix_loads_the_layers_that_contain_it_from_the_names_without_it():
    network = {"lm_hidden": {"class": "linear", "activation": "tanh", "n_out": 6, "from": "data"},
               "lm_output": {"class": "softmax", "n_out": 4, "from": "lm_hidden", "is_output_layer": True},
               "output": {"class": "softmax", "loss": "ce", "from": "data"}}
    model = model_of("dense", network)
    before = values(model)
    preload(model, {"lm": {"filename": fixture("dense"), "prefix": "lm_", "init_for_train": True}},
            training=True)
    after, file = values(model), stored(fixture("dense"))
    for name in ("hidden/W", "hidden/b", "output/W", "output/b"):
        assert np.array_equal(after[f"lm_{name}"], file[name])
    assert np.array_equal(after["output/W"], before["output/W"])  # no "lm_" in its name


def test_preload_ignore_missing_keeps_what_the_file_lacks():
    network = {**CASES["dense"]["network"],
               "extra": {"class": "linear", "n_out": 2, "from": "hidden", "is_output_layer": True}}
    entry = {"filename": fixture("dense"), "init_for_train": True}
    with pytest.raises(ConfigError, match=r"missing in the checkpoint: extra/W; extra/b\. The options of "
                                          r"preload_from_files\['x'\] choose what is loaded"):
        preload(model_of("dense", network), {"x": entry}, training=True)
    model = model_of("dense", network)
    before = values(model)
    preload(model, {"x": {**entry, "ignore_missing": True}}, training=True)
    assert np.array_equal(values(model)["extra/W"], before["extra/W"])
    assert np.array_equal(values(model)["hidden/W"], stored(fixture("dense"))["hidden/W"])


@pytest.mark.parametrize("option", [{"ignore_params": ["output/b"]},
                                    {"ignore_params_prefixes": ["output/b"]}])
def test_preload_ignored_params_keep_their_values_and_are_not_unused(option):
    model = model_of("dense")
    before = values(model)
    preload(model, {"x": {"filename": fixture("dense"), "init_for_train": True, **option}}, training=True)
    assert np.array_equal(values(model)["output/b"], before["output/b"])
    assert np.array_equal(values(model)["output/W"], stored(fixture("dense"))["output/W"])


def test_preload_ignore_params_prefixes_leaves_a_whole_lstm_and_a_partial_one_keeps_the_rest():
    model = model_of("rec_NativeLstm2")
    before = values(model)
    entry = {"filename": fixture("rec_NativeLstm2"), "init_for_train": True,
             "ignore_params_prefixes": ["bw/"], "ignore_params": ["fw/rec/W_re"]}
    preload(model, {"x": entry}, training=True)
    after, file = values(model), stored(fixture("rec_NativeLstm2"))
    assert np.array_equal(after["bw/W"], before["bw/W"]) and np.array_equal(after["bw/b"], before["bw/b"])
    n_in = file["fw/rec/W"].shape[0]
    assert np.array_equal(after["fw/W"][n_in:], before["fw/W"][n_in:])  # the recurrent rows: W_re, ignored
    n = file["fw/rec/W_re"].shape[0]  # the input rows: RETURNN's W, gate blocks (j, i, f, o) -> (i, j, f, o)
    gates = np.split(file["fw/rec/W"], 4, axis=1)
    np.testing.assert_array_equal(after["fw/W"][:n_in], np.concatenate([gates[1], gates[0], *gates[2:]], 1))
    assert after["fw/W"].shape == (n_in + n, 4 * n)


def test_preload_var_name_mapping_reads_renamed_parameters():
    network = {"hidden2": {**CASES["dense"]["network"]["hidden"]},
               "output": {**CASES["dense"]["network"]["output"], "from": "hidden2"}}
    model = model_of("dense", network)
    entry = {"filename": fixture("dense"), "init_for_train": True,
             "var_name_mapping": {"hidden2/W": "hidden/W", "hidden2/b": "hidden/b"}}
    preload(model, {"x": entry}, training=True)
    assert_outputs_equal_returnns_by_name(model, {"hidden2": "hidden", "output": "output"})


def assert_outputs_equal_returnns_by_name(model, layers: dict[str, str]) -> None:
    expected = np.load(FIXTURES / "dense.npz")
    got = model(expected["data"], expected["lengths"])
    for ours, theirs in layers.items():
        for b, n in enumerate(expected["lengths"]):
            np.testing.assert_allclose(got[ours].numpy()[b, :n], expected[f"out:{theirs}"][b, :n],
                                       atol=TOLERANCE)


def test_the_first_preload_entry_wins_and_the_model_does_not_overwrite_it(tmp_path):
    own = model_of("dense")
    randomise(own, 11)
    main = str(tmp_path / "main.001")
    save_checkpoint(main, own.named_variables(), [], epoch=1, global_step=0)
    other = write_variant(tmp_path, "dense", add={"output/W": np.ones((6, 4), np.float32)})
    model = model_of("dense")
    preload(model, {"b_second": {"filename": other},
                    "a_first": {"filename": fixture("dense"), "ignore_params": ["hidden/W", "hidden/b"]}},
            load=main)
    after, file = values(model), stored(fixture("dense"))
    assert np.array_equal(after["output/W"], file["output/W"])  # a_first, not b_second's ones nor main's
    assert np.array_equal(after["hidden/W"], stored(other)["hidden/W"])  # b_second, not main's
    assert np.array_equal(after["hidden/b"], stored(other)["hidden/b"])


def test_preload_from_this_engines_own_checkpoint_uses_its_names(tmp_path):
    source = model_of("dense")
    randomise(source, 13)
    path = str(tmp_path / "own.003")
    save_checkpoint(path, source.named_variables(), [], epoch=3, global_step=0)
    model = model_of("rec_NativeLstm2")
    before = values(model)
    preload(model, {"x": {"filename": path, "init_for_train": True, "ignore_params_prefixes": ["hidden/"],
                          "ignore_missing": True}}, training=True)
    assert np.array_equal(values(model)["output/b"], values(source)["output/b"])
    assert np.array_equal(values(model)["fw/W"], before["fw/W"])


def test_a_preload_that_selects_nothing_is_an_error():
    with pytest.raises(ConfigError, match=r"\['x'\]: no parameter of the network is selected"):
        preload(model_of("dense"), {"x": {"filename": fixture("dense"), "prefix": "lm_",
                                          "init_for_train": True}}, training=True)


@pytest.mark.parametrize("entry, message", [
    ({"filename": "f", "ignore_mising": True}, r"\['x'\]: unknown option\(s\) \['ignore_mising'\]"),
    ({"filename": "f", "custom_missing_load_func": print}, r"not implemented: 'custom_missing_load_func'"),
    ({"filename": "f", "init_for_train": "always"}, r"'init_for_train' must be True or False, got 'always'"),
    ({"prefix": "lm_"}, r"'filename' must name a checkpoint"),
    ({"filename": "f", "var_name_mapping": ["a"]}, r"'var_name_mapping' must map parameter names"),
])
def test_bad_preload_entries_are_config_errors(entry, message):
    with pytest.raises(ConfigError, match=message):
        preload_entries(Config({"preload_from_files": {"x": entry}}))


def test_rnn_py_check_reports_a_bad_preload_entry():
    from engine.tasks.check import collect

    _, problems = collect(Config({"preload_from_files": {"lm": {"filename": "f", "prefx": "lm_"}}}))
    assert problems == ["Config key preload_from_files['lm']: unknown option(s) ['prefx']. Its options: "
                        "filename, prefix, init_for_train, ignore_missing, ignore_params, "
                        "ignore_params_prefixes, var_name_mapping."]


def test_a_missing_preload_file_names_its_entry(tmp_path):
    with pytest.raises(ConfigError, match=r"^preload_from_files\['lm'\]: checkpoint '.*/nothing' does not"):
        preload(model_of("dense"), {"lm": {"filename": str(tmp_path / "nothing"), "init_for_train": True}},
                training=True)
