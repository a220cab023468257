"""RETURNN's TensorFlow checkpoints, both ways, against checkpoints and outputs RETURNN made
(tests/fixtures/returnn_ckpt, written by benchmarks/returnn_checkpoints.py; RETURNN is not needed here).

In: each fixture loaded as ``load`` gives RETURNN's outputs of every layer. Out: export-returnn-checkpoint
writes back what RETURNN wrote (names, shapes, values), and that file loads to the same outputs. Then
the errors (missing, unused, wrong shape: each names the parameter and the file), the options of
``preload_from_files``, and which of ``load``/``import_model_train_epoch1`` a training start takes.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.model import build_model
from engine.runtime.errors import ConfigError, EngineError
from engine.tools.export_returnn_checkpoint import main as export_main
from engine.training.checkpoints.file_format import save_checkpoint
from engine.training.checkpoints.initial_params import init_for_training, load_for_inference
from engine.training.checkpoints.preload_options import preload_entries
from engine.training.checkpoints.returnn_files import write_checkpoint
from helpers import ROOT, run_rnn

pytestmark = pytest.mark.tf_latest

FIXTURES = ROOT / "tests" / "fixtures" / "returnn_ckpt"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
sys.path.insert(0, str(ROOT / "benchmarks"))
# the script that makes the fixtures judges by these
from returnn_checkpoints import (RETURNN_GRADIENT_WRONG, TOLERANCE, engine_gradients,  # noqa: E402
                                 gradient_differences)


def model_of(case: dict | str, network: dict | None = None, seed: int = 42):
    case = CASES[case] if isinstance(case, str) else case
    streams = case["extern_data"]
    return build_model(network or case["network"], input_dim=streams["data"]["dim"],
                       input_sparse=bool(streams["data"].get("sparse")),
                       target_dims={k: v["dim"] for k, v in streams.items() if k != "data"}, random_seed=seed)


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def stored(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def outputs(model, name: str) -> dict[str, np.ndarray]:
    expected = np.load(FIXTURES / f"{name}.npz")
    result = model(expected["data"], expected["lengths"])
    return {layer: result[layer].numpy() for layer in model.layers}


def assert_outputs_equal_returnns(model, name: str) -> None:
    expected = np.load(FIXTURES / f"{name}.npz")
    got = outputs(model, name)
    for layer, value in got.items():
        for b, n in enumerate(expected["lengths"]):  # padded frames differ by design
            np.testing.assert_allclose(value[b, :n], expected[f"out:{layer}"][b, :n], rtol=0, atol=TOLERANCE,
                                       err_msg=f"{name}: layer {layer}, sequence {b}")


def values(model) -> dict[str, np.ndarray]:
    return {name: var.numpy() for name, var in model.named_variables().items()}


def randomise(model, seed: int) -> None:
    rng = np.random.RandomState(seed)
    for var in model.named_variables().values():
        var.assign(rng.standard_normal(var.shape).astype(np.float32))


# ----- in: RETURNN -> engine -----

@pytest.mark.parametrize("name", sorted(CASES))
def test_load_gives_returnns_outputs(name):
    model = model_of(name)
    load_for_inference(Config({"load": fixture(name)}), model, fixture(name))
    assert_outputs_equal_returnns(model, name)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(RETURNN_GRADIENT_WRONG)))
def test_gradients_from_returnns_checkpoint_are_returnns(name):
    model = model_of(name)
    load_for_inference(Config({"load": fixture(name)}), model, fixture(name))
    expected = np.load(FIXTURES / f"{name}.npz")
    differences = gradient_differences(expected, engine_gradients(model, name, expected["data"],
                                                                  expected["lengths"]))
    assert any(n.startswith("grad:") and n != "grad:data" for n in differences), "no parameter gradient"
    assert max(differences.values()) <= TOLERANCE, differences


def test_every_lstm_unit_has_a_fixture():
    from engine.model.spec import LSTM_UNITS

    units = {CASES[n]["network"]["fw"]["unit"].lower() for n in CASES if n.startswith("rec_")}
    assert units == set(LSTM_UNITS)


@pytest.mark.parametrize("given", ["{}", "{}.index", "{}.meta"])
def test_load_takes_the_prefix_or_its_index_or_meta_name(given):
    model = model_of("dense")
    init_for_training(Config({"load": given.format(fixture("dense"))}), model)
    assert_outputs_equal_returnns(model, "dense")


# ----- out: engine -> RETURNN -----

@pytest.mark.parametrize("name", sorted(CASES))
def test_export_writes_what_returnn_wrote_and_loads_back(name, tmp_path):
    model = model_of(name)
    load_for_inference(Config({"load": fixture(name)}), model, fixture(name))
    engine_file = str(tmp_path / "net.001")
    save_checkpoint(engine_file, model.named_variables(), [], epoch=1, global_step=17)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CASES[name]))  # its network and extern_data
    out = str(tmp_path / "exported")
    assert export_main([str(config), engine_file, out]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("exported")) == [
        "exported.data-00000-of-00001", "exported.index", "exported.meta"]
    written, original = stored(out), stored(fixture(name))
    assert int(written.pop("global_step")) == 17
    original.pop("global_step", None)
    assert sorted(written) == sorted(original)
    for key, value in original.items():
        assert written[key].dtype == value.dtype and written[key].shape == value.shape, key
        np.testing.assert_allclose(written[key], value, rtol=0, atol=1e-6, err_msg=key)
    again = model_of(name, seed=7)
    load_for_inference(Config({"load": out}), again, out)
    assert_outputs_equal_returnns(again, name)


def test_export_refuses_to_overwrite_unless_asked(tmp_path, capsys):
    model = model_of("dense")
    engine_file = str(tmp_path / "net.001")
    save_checkpoint(engine_file, model.named_variables(), [], epoch=1, global_step=0)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CASES["dense"]))
    out = str(tmp_path / "out")
    (tmp_path / "out.index").write_text("old")
    assert export_main([str(config), engine_file, out]) == ConfigError.exit_code
    assert "out.index exist(s) already" in capsys.readouterr().err
    assert export_main([str(config), engine_file, out, "--overwrite"]) == 0
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_an_overwrite_cut_between_its_renames_leaves_no_old_index_beside_new_data(tmp_path, monkeypatch):
    """The renames replace one file at a time: a crash after the data's must not leave the old .index and
    .meta, which would read as a complete checkpoint of the old names with the new data."""
    import os

    from engine.training.checkpoints.returnn_files import files_of, open_checkpoint

    out = str(tmp_path / "out")
    write_checkpoint(out, {"w": np.zeros((2, 3), np.float32)}, global_step=1)
    renames, real_replace = [], os.replace

    def replace_then_crash(source, target):
        if renames:  # the data file is in place: the process dies before the .index follows
            raise OSError(5, "Input/output error", target)
        renames.append(target)
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace_then_crash)
    with pytest.raises(EngineError, match="Cannot write the RETURNN checkpoint"):
        write_checkpoint(out, {"v": np.ones((4,), np.float32)}, global_step=2)
    monkeypatch.undo()
    assert renames == [out + ".data-00000-of-00001"]
    assert files_of(out) == [out + ".data-00000-of-00001"]  # no .index, no .meta: nothing takes it whole
    with pytest.raises(ConfigError, match="cannot be read"):
        open_checkpoint(out)
    assert write_checkpoint(out, {"v": np.ones((4,), np.float32)}, global_step=2)  # a rerun completes it
    np.testing.assert_array_equal(stored(out)["v"], np.ones(4))
    assert "w" not in stored(out) and not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


# ----- errors: each names the parameter and the file -----

def write_variant(tmp_path, name: str, drop=(), add=None) -> str:
    variables = {k: v for k, v in stored(fixture(name)).items() if k not in drop and k != "global_step"}
    variables.update(add or {})
    prefix = str(tmp_path / f"variant-{name}")
    write_checkpoint(prefix, variables)
    return prefix


def load_error(path: str, model, config: dict | None = None) -> str:
    with pytest.raises(ConfigError) as error:
        init_for_training(Config({"load": path, **(config or {})}), model)
    return str(error.value)


def test_a_missing_parameter_is_named(tmp_path):
    prefix = write_variant(tmp_path, "rec_NativeLstm2", drop=["fw/rec/W_re"])
    message = load_error(prefix, model_of("rec_NativeLstm2"))
    assert f"Checkpoint '{prefix}' (RETURNN's TensorFlow format)" in message
    assert "missing in the checkpoint: fw/rec/W_re (rec layer 'fw', unit NativeLstm2" in message


def test_an_unused_variable_is_named_but_bookkeeping_is_not(tmp_path):
    extra = {"extra/W": np.zeros((2, 2), np.float32), "beta1_power": np.float32(0.9),
             "output/W/Adam": np.zeros((6, 4), np.float32)}
    prefix = write_variant(tmp_path, "dense", add=extra)
    message = load_error(prefix, model_of("dense"))
    assert "in the checkpoint but read by no parameter: extra/W." in message
    assert "beta1_power" not in message and "Adam" not in message and prefix in message


def test_a_wrong_shape_is_named():
    network = json.loads(json.dumps(CASES["dense"]["network"]))
    network["hidden"]["n_out"] = 7
    message = load_error(fixture("dense"), model_of("dense", network))
    assert ("different shapes: hidden/W: checkpoint (5, 6), network (5, 7); hidden/b: checkpoint (6,)"
            in message)
    assert fixture("dense") in message


def test_another_lstm_units_variables_are_named_with_the_unit_that_reads_them():
    network = json.loads(json.dumps(CASES["rec_StandardLSTM"]["network"]))
    for layer in ("fw", "bw"):
        network[layer]["unit"] = "NativeLstm2"
    message = load_error(fixture("rec_StandardLSTM"), model_of("rec_StandardLSTM", network))
    assert "missing in the checkpoint: fw/rec/W (rec layer 'fw', unit NativeLstm2" in message
    assert ("Layer 'fw': the checkpoint holds fw/rec/lstm_cell/kernel, fw/rec/lstm_cell/bias, the variables "
            "of RETURNN's TensorFlow's LSTMCell (StandardLSTM); this engine reads them for unit standardlstm."
            in message)


def test_a_missing_or_broken_checkpoint_is_named(tmp_path):
    assert "load: checkpoint '" in load_error(str(tmp_path / "nothing"), model_of("dense"))
    assert "does not exist (neither this engine's checkpoint file nor RETURNN's" in load_error(
        str(tmp_path / "nothing"), model_of("dense"))
    broken = tmp_path / "broken"
    (tmp_path / "broken.index").write_bytes(b"not a checkpoint index")
    message = load_error(str(broken), model_of("dense"))
    assert f"load: Checkpoint '{broken}' (RETURNN's TensorFlow format: {broken}.index) cannot be read" \
        in message


def test_this_engines_own_checkpoints_load_as_before(tmp_path):
    source = model_of("dense")
    randomise(source, 3)
    path = str(tmp_path / "own.005")
    save_checkpoint(path, source.named_variables(), [], epoch=5, global_step=9)
    model = model_of("dense")
    init_for_training(Config({"load": path}), model)
    assert all(np.array_equal(v, values(source)[k]) for k, v in values(model).items())
    extra = {"class": "linear", "n_out": 2, "from": "hidden", "is_output_layer": True}
    other = model_of("dense", {**CASES["dense"]["network"], "extra": extra})
    message = load_error(path, other)
    assert "does not match the network (parameters): missing in the checkpoint: extra/W" in message


# ----- which file a training start takes -----

def test_import_model_train_epoch1_wins_over_load_unless_start_epoch_is_given(tmp_path):
    own = model_of("dense")
    randomise(own, 5)
    path = str(tmp_path / "own.001")
    save_checkpoint(path, own.named_variables(), [], epoch=1, global_step=0)
    both = {"load": path, "import_model_train_epoch1": fixture("dense")}
    model = model_of("dense")
    assert init_for_training(Config(both), model) == fixture("dense")
    assert_outputs_equal_returnns(model, "dense")
    assert init_for_training(Config({**both, "start_epoch": 1}), model) == path
    assert np.array_equal(values(model)["hidden/W"], values(own)["hidden/W"])


# ----- preload_from_files -----

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


# ----- through rnn.py -----

TRAIN = """
train = {"class": "DummyDataset", "input_dim": 5, "output_dim": 4, "num_seqs": 20, "seq_len": 6,
         "fixed_random_seed": 1}
dev = {"class": "DummyDataset", "input_dim": 5, "output_dim": 4, "num_seqs": 6, "seq_len": 6,
       "fixed_random_seed": 1}
network = %(network)r
batch_size = 60
num_epochs = 1
model = %(model)r
tensorboard = False
"""


@pytest.mark.slow
def test_rnn_py_trains_from_a_returnn_checkpoint_and_evaluates_one(tmp_path):
    config = tmp_path / "train.py"
    entry = {"filename": fixture("dense"), "init_for_train": True, "ignore_params_prefixes": ["hidden/"]}
    config.write_text(TRAIN % {"network": CASES["dense"]["network"], "model": str(tmp_path / "net")}
                      + f"import_model_train_epoch1 = {fixture('dense')!r}\n"
                      + f"preload_from_files = {{'out': {entry!r}}}\n")
    r = run_rnn([str(config)])
    assert r.returncode == 0, r.stderr
    assert "preload_from_files['out']: loaded 2 parameter(s) from" in r.stdout
    assert (f"import_model_train_epoch1: loaded 2 parameter(s) from '{fixture('dense')}' (RETURNN's "
            "TensorFlow format); 2 came from an earlier preload_from_files entry already") in r.stdout
    r = run_rnn([str(config), "++task", "eval", "++load", fixture("dense")])
    assert r.returncode == 0, r.stderr
    assert f"load: loaded 4 parameter(s) from '{fixture('dense')}' (RETURNN's TensorFlow format)" in r.stdout
