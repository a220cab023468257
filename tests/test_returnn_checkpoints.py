"""RETURNN's TensorFlow checkpoints, both ways, against checkpoints and outputs RETURNN made
(tests/fixtures/returnn_ckpt, written by benchmarks/returnn_checkpoints.py; RETURNN is not needed here).

In: each fixture loaded as ``load`` gives RETURNN's outputs of every layer. Out: export-returnn-checkpoint
writes back what RETURNN wrote (names, shapes, values), and that file loads to the same outputs. Then
the errors (missing, unused, wrong shape: each names the parameter and the file), and which of
``load``/``import_model_train_epoch1`` a training start takes (``preload_from_files``:
test_returnn_preload.py).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.config.loader import Config
from engine.runtime.errors import ConfigError, EngineError
from engine.tools.export_returnn_checkpoint import main as export_main
from engine.training.checkpoints.file_format import save_checkpoint
from engine.training.checkpoints.initial_params import init_for_training, load_for_inference
from engine.training.checkpoints.returnn_files import write_checkpoint
from helpers import run_rnn
from returnn_fixtures import (CASES, FIXTURES, GRADIENTS_NOT_COMPARED, TOLERANCE,
                              assert_outputs_equal_returnns, stream_ids, engine_gradients, fixture,
                              gradient_differences, model_of, randomise, stored, values, write_variant)

pytestmark = pytest.mark.tf_latest


# ----- in: RETURNN -> engine -----

@pytest.mark.parametrize("name", sorted(CASES))
def test_load_gives_returnns_outputs(name):
    model = model_of(name)
    load_for_inference(Config({"load": fixture(name)}), model, fixture(name))
    assert_outputs_equal_returnns(model, name)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(GRADIENTS_NOT_COMPARED)))
def test_gradients_from_returnns_checkpoint_are_returnns(name):
    model = model_of(name)
    load_for_inference(Config({"load": fixture(name)}), model, fixture(name))
    expected = np.load(FIXTURES / f"{name}.npz")
    differences = gradient_differences(expected, engine_gradients(model, name, expected["data"],
                                                                  expected["lengths"], stream_ids(expected)))
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
