"""Learning-rate control: constant and newbob decisions on known scores, the history file, resume."""

import errno
import math
import os
import re

import numpy as np
import pytest

from engine.config.loader import Config
from engine.runtime.errors import ConfigError, TransientIOError
from engine.training.update.lr_control import EpochData, LearningRateControl
from engine.training.update.lr_history import parse_history
from helpers import ROOT, run_mpi, run_rnn

pytestmark = pytest.mark.tf_latest


def run_epochs(control, scores, key="dev_score"):
    """Epoch e gets its rate, then its score; returns the rates used."""
    rates = []
    for epoch, score in enumerate(scores, start=1):
        rates.append(control.learning_rate_for_epoch(epoch))
        control.set_epoch_scores(epoch, {key: score, "train_score": 100.0 - epoch})
    return rates


def test_constant_and_learning_rates_list():
    assert run_epochs(LearningRateControl(default_learning_rate=0.3), [5, 6, 7]) == [0.3, 0.3, 0.3]
    control = LearningRateControl(default_learning_rate=1.0, learning_rates=[0.1, 0.2])
    assert run_epochs(control, [5, 6, 7, 8]) == [0.1, 0.2, 0.2, 0.2]  # the last rate used carries on


def test_newbob_relative_decisions():
    # Relative changes (new - old) / |new|: -0.111 keep, -0.0056 decay, -0.119 keep, +0.059 decay, -0.5 keep.
    control = LearningRateControl("newbob", default_learning_rate=1.0)
    assert run_epochs(control, [10.0, 9.0, 8.95, 8.0, 8.5, 5.0, 4.0]) == [1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    strict = LearningRateControl(
        "newbob_rel", default_learning_rate=1.0, relative_error_threshold=-0.2, decay=0.1
    )
    assert run_epochs(strict, [10.0, 9.0, 5.0]) == pytest.approx([1.0, 1.0, 0.1])


def test_newbob_abs_min_learning_rate_and_warmup():
    # Absolute changes: -1 keep, -0.005 decay, -0.95 keep, +0.5 decay (clamped at the minimum).
    control = LearningRateControl("newbob_abs", default_learning_rate=1.0, min_learning_rate=0.4)
    assert run_epochs(control, [10.0, 9.0, 8.995, 8.045, 8.545, 1.0]) == [1.0, 1.0, 1.0, 0.5, 0.5, 0.4]
    warmup = LearningRateControl("newbob", default_learning_rate=1.0, learning_rates={1: 0.1, 2: 0.5})
    assert run_epochs(warmup, [10.0, 9.99, 9.98]) == [0.1, 0.5, 0.25]  # epoch 3 decays from epoch 2's rate


def test_which_score_drives_the_control():
    control = LearningRateControl("newbob")
    control.set_epoch_scores(1, {"train_score": 2.0, "dev_error": 0.3, "dev_score": 1.0})
    assert control.score(1) == ("dev_score", 1.0)
    control.set_epoch_scores(2, {"train_score": 1.0})
    assert control.score(2) == ("train_score", 1.0)
    assert control.learning_rate_for_epoch(3) == 1.0  # different keys in epochs 1 and 2: no decision
    measured = LearningRateControl("newbob", error_measure="dev_error")
    measured.set_epoch_scores(1, {"dev_error": 0.3, "dev_score": 1.0})
    assert measured.score(1) == ("dev_error", 0.3)
    assert LearningRateControl().score(7) == (None, None)


def test_history_file_round_trip(tmp_path):
    path = str(tmp_path / "sub" / "lr.txt")
    control = LearningRateControl("newbob", default_learning_rate=0.001, filename=path)
    run_epochs(control, [3.25, 1e-12, -0.5])
    control.set_epoch_scores(3, {"dev_error": math.inf, "odd": math.nan})
    control.learning_rate_for_epoch(4)
    control.save()
    text = open(path).read()
    assert text.startswith("{\n    1: EpochData(learningRate=0.001, error={\n        'dev_score': 3.25,")
    loaded = LearningRateControl("newbob", filename=path)
    loaded.load()
    assert sorted(loaded.epoch_data) == [1, 2, 3, 4]
    for epoch, data in control.epoch_data.items():
        other = loaded.epoch_data[epoch]
        assert other.learning_rate == data.learning_rate
        assert set(other.scores) == set(data.scores)
        for key, value in data.scores.items():
            assert other.scores[key] == value or (math.isnan(value) and math.isnan(other.scores[key]))
    assert sorted(os.listdir(tmp_path / "sub")) == ["lr.txt"]


def test_resume_continues_the_decisions_and_keeps_trained_rates(tmp_path):
    path = str(tmp_path / "lr")
    config = Config(
        {
            "learning_rate_control": "newbob",
            "learning_rate": 1.0,
            "learning_rate_file": path,
            "learning_rates": [0.5],
            "newbob_learning_rate_decay": 0.1,
        }
    )
    first = LearningRateControl.from_config(config)
    run_epochs(first, [10.0, 9.999])
    first.save()
    config.set("learning_rates", [0.7, 0.7])  # edited before the restart: trained epochs keep their history
    resumed = LearningRateControl.from_config(config)
    resumed.load()
    assert resumed.learning_rate_for_epoch(1) == 0.5 and resumed.learning_rate_for_epoch(2) == 0.5
    assert resumed.learning_rate_for_epoch(3) == pytest.approx(0.05)  # the decision the first run would make
    assert first.learning_rate_for_epoch(3) == pytest.approx(0.05)


def test_reads_returnn_written_files(tmp_path):
    path = tmp_path / "newbob.data"
    path.write_text(
        "{\n1: EpochData(learningRate=0.0008, error={\n'dev_error': 0.5,\n'dev_score': 2.5,\n"
        "'train_score': 3.0,\n':meta:effective_learning_rate': 0.0008,\n}),\n"
        "2: EpochData(np.float64(0.0004), {'dev_score': inf, 'train_score': numpy.float32(-1.5)}),\n"
        "3: EpochData(learningRate=-1e-3, error=0.25),\n4: EpochData(learningRate=0.001, error={}),\n}\n"
    )
    control = LearningRateControl()
    control.load(str(path))
    assert control.epoch_data == {
        1: EpochData(0.0008, {"dev_error": 0.5, "dev_score": 2.5, "train_score": 3.0}),
        2: EpochData(0.0004, {"dev_score": math.inf, "train_score": -1.5}),
        3: EpochData(-0.001, {"old_format_score": 0.25}),
        4: EpochData(0.001, {}),
    }


def test_save_is_atomic(tmp_path, monkeypatch):
    path = str(tmp_path / "lr")
    control = LearningRateControl(filename=path)
    run_epochs(control, [1.0])
    control.save()
    before = open(path).read()
    control.set_epoch_scores(2, {"dev_score": 0.5})

    def crash(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        control.save()
    assert open(path).read() == before and os.listdir(tmp_path) == ["lr"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{1: EpochData(learningRate=0.1", "syntax error at line 1"),
        ("[1, 2]", "must hold one dict"),
        ("{1: 0.1}", "epoch 1: EpochData"),
        ("{'a': EpochData(0.1)}", "epoch number"),
        ("{1: EpochData(learningRate=__import__('os'))}", "a number was expected"),
        ("{1: EpochData(learningRate=0.1, error={'x': 1}, extra=2)}", "unexpected or missing"),
        ("{1: EpochData(learningRate=0.1,\n error={3: 1.0})}", "at line 2: epoch 1: score names"),
        ("{1: EpochData(learningRate=np.array(0.1))}", "a number was expected"),
        (" \n", "is empty"),
    ],
)
def test_bad_history_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "lr"
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"'{path}'.*{message}"):
        LearningRateControl(filename=str(path)).load()


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ETIMEDOUT])
def test_an_io_error_that_may_pass_is_restartable_not_a_config_error(tmp_path, monkeypatch, code):
    path = tmp_path / "lr"
    path.write_text("{1: EpochData(learningRate=0.1, error={'dev_score': 1.0})}")
    real_open = open

    def failing_open(name, *args, **kwargs):
        if str(name) == str(path):
            raise OSError(code, os.strerror(code), str(name))
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(TransientIOError, match=f"'{path}' could not be read: .*supervise") as error:
        LearningRateControl(filename=str(path)).load()
    assert error.value.exit_code == 1 and not isinstance(error.value, ConfigError)


def test_the_file_defaults_beside_the_model():
    def filename(**values):
        return LearningRateControl.from_config(Config(values)).filename

    assert filename(model="out/net") == "out/net.learning_rates"
    assert filename(model="out/net", learning_rate_file="lr") == "lr"
    assert filename() is None


def test_config_errors():
    with pytest.raises(ConfigError, match="unknown value 'newbob_multi'"):
        LearningRateControl.from_config(Config({"learning_rate_control": "newbob_multi"}))
    with pytest.raises(ConfigError, match="'learning_rates' must be"):
        LearningRateControl.from_config(Config({"learning_rates": "fast"}))
    with pytest.raises(ConfigError, match="cannot be read"):
        LearningRateControl(filename="/nonexistent/lr").load()


def test_newbob_multi_epoch_averages_relative_changes_at_update_epochs():
    control = LearningRateControl.from_config(Config({
        "learning_rate_control": "newbob_multi_epoch", "learning_rate": 1.0, "newbob_multi_num_epochs": 2}))
    # defaults to newbob_multi_num_epochs: decides at epochs 1, 3, 5, ...
    assert control.multi_update_interval == 2
    # epoch 3: (9-10)/9 = -0.111 keep; epoch 5: mean((8.9-9)/8.9, (8.85-8.9)/8.85) = -0.00844 > -0.01 decay;
    # epoch 7: mean((8.8-8.85)/8.8, (7-8.8)/7) = -0.131 keep; even epochs carry the rate on
    assert run_epochs(control, [10, 9, 8.9, 8.85, 8.8, 7.0, 6.0]) == [1, 1, 1, 1, 0.5, 0.5, 0.5]


def test_newbob_multi_epoch_grows_below_the_grow_threshold_and_clamps_decay():
    control = LearningRateControl(
        "newbob_multi_epoch", default_learning_rate=1.0, multi_num_epochs=1, multi_update_interval=1,
        growth=1.5, grow_threshold=-0.1, min_learning_rate=0.6)
    # epoch 3: -0.25 grow; 4: -0.0127 keep; 5: 0 decay; 6: (5-7.9)/5 = -0.58 grow; 7: 0 decay to 0.5625 -> 0.6
    rates = run_epochs(control, [10, 8, 7.9, 7.9, 5, 5, 4])
    assert rates == pytest.approx([1, 1, 1.5, 1.5, 0.75, 1.125, 0.6])
    with pytest.raises(ConfigError, match="grow_threshold .* is above"):
        LearningRateControl("newbob_multi_epoch", grow_threshold=0.1)
    with pytest.raises(ConfigError, match="'newbob_multi_num_epochs' must be an integer >= 1"):
        LearningRateControl("newbob_multi_epoch", multi_num_epochs=0)


def test_relative_change_options_and_min_epochs_per_new_rate():
    control = LearningRateControl.from_config(Config({
        "learning_rate_control": "newbob", "learning_rate": 1.0, "newbob_relative_error_div_by_old": True,
        "learning_rate_control_relative_error_relative_lr": True,
        "learning_rate_control_min_num_epochs_per_new_lr": 2}))
    # epoch 3: (9.9005-10)/10 = -0.00995 > -0.01 decay (divided by the new score it would be -0.01005: keep);
    # epoch 4: the new rate ran 1 epoch: keep; epoch 5: (8.946-9)/9 = -0.006, / (0.5 / 1.0) = -0.012 keep;
    # epoch 6: 0 decay; epoch 7: the new rate ran 1 epoch: keep
    rates = run_epochs(control, [10, 9.9005, 9.0, 8.946, 8.946, 8.0, 7.0])
    assert rates == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]
    by_new = LearningRateControl("newbob", default_learning_rate=1.0)
    assert run_epochs(by_new, [10, 9.9005, 9.0]) == [1.0, 1.0, 1.0]


def test_error_key_as_returnn_chooses_it():
    control = LearningRateControl(error_measure=["dev_error"])
    for scores, key in [({"dev_error_output": 1.0, "dev_score": 2.0}, "dev_error_output"),
                        ({"dev_score_output": 1.0, "dev_error": 2.0}, "dev_error"),
                        ({"train_score": 1.0, "dev_score_output/output_x": 2.0, "dev_a": 3.0},
                         "dev_score_output/output_x"),
                        ({"train_score_output": 1.0, "b": 2.0}, "train_score_output"),
                        ({"b": 1.0, "a": 2.0}, "a")]:
        control.epoch_data = {1: EpochData(0.1, scores)}
        assert control.score(1) == (key, scores[key])
    with pytest.raises(ConfigError, match="error_measure' must be a score name"):
        LearningRateControl(error_measure=3)


def test_a_measure_naming_the_main_loss_layer_reads_its_reported_score_and_another_layer_is_refused():
    control = LearningRateControl("newbob", error_measure="dev_error_output")
    control.resolve_layer_keys(["output", "ctc"])
    assert control.error_measure == "dev_error"  # RETURNN's fallback alone would take dev_score
    control.epoch_data = {1: EpochData(0.1, {"dev_score": 2.0, "dev_error": 0.3, "train_score": 2.5})}
    assert control.score(1) == ("dev_error", 0.3)
    listed = LearningRateControl(error_measure=["dev_other_score_ctc", "dev_score_x/y", "train_score"])
    listed.resolve_layer_keys(["ctc"])  # the only loss layer is the main one, whatever its name
    assert listed.error_measure == ["dev_other_score", "dev_score_x/y", "train_score"]  # x/y: no loss layer
    reported = LearningRateControl(error_measure="dev_error_ctc")  # each loss layer's dev scores are reported
    reported.resolve_layer_keys(["output", "ctc"])
    assert reported.error_measure == "dev_error_ctc"
    other = LearningRateControl(error_measure="train_score_ctc")
    with pytest.raises(ConfigError, match="names 'train_score_ctc', the score of loss layer 'ctc' on "
                                          "'train'.*main loss layer 'output' only"):
        other.resolve_layer_keys(["output", "ctc"])


@pytest.mark.version_independent
def test_rnn_py_refuses_a_measure_naming_a_loss_layer_whose_score_is_not_reported(tmp_path):
    config = tmp_path / "two_losses.py"
    config.write_text(
        'task = "train"\n'
        'train = {"class": "Task12AXDataset", "num_seqs": 10}\n'
        'network = {"aux": {"class": "softmax", "loss": "ce", "n_out": 2},\n'
        '           "output": {"class": "softmax", "loss": "ce", "from": "aux"}}\n'
        'learning_rate_control = "newbob"\n'
        'learning_rate_control_error_measure = "train_score_aux"\n'
        f'model = {str(tmp_path / "net")!r}\n'
        'batch_size = 2000\nnum_epochs = 1\n')
    done = run_rnn([str(config)], timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "'learning_rate_control_error_measure' names 'train_score_aux', the score of loss layer " \
           "'aux'" in out
    assert "Traceback" not in out
    # rnn.py --check says so too, without TensorFlow; a network without 'output' reports its first loss
    # layer's train scores
    checked = run_rnn([str(config), "--check"], timeout=120)
    assert checked.returncode == 2 and "the score of loss layer 'aux'" in checked.stdout + checked.stderr
    config.write_text(config.read_text().replace('"output": {', '"main": {').replace("train_score_aux",
                                                                                     "train_score_main"))
    checked = run_rnn([str(config), "--check"], timeout=120)
    assert checked.returncode == 2 and "the score of loss layer 'main'" in checked.stdout + checked.stderr
    for measure in ("train_score_aux", "dev_error_main"):  # the main layer's; any layer's dev scores
        config.write_text(config.read_text().replace("train_score_main", measure))
        checked = run_rnn([str(config), "--check"], timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr


TWO_LOSSES = """
train = {"class": "DummyDataset", "input_dim": 4, "output_dim": 3, "num_seqs": 30, "seq_len": 12,
         "fixed_random_seed": 1}
dev = {"class": "DummyDataset", "input_dim": 4, "output_dim": 3, "num_seqs": 20, "seq_len": 12,
       "fixed_random_seed": 1}
network = {"lstm": {"class": "rec", "unit": "LSTMBlock", "n_out": 8},
           "aux": {"class": "softmax", "loss": "ce", "loss_scale": 0.5, "from": "lstm"},
           "output": {"class": "softmax", "loss": "ce", "from": "aux"}}
learning_rate_control = "newbob"
learning_rate_control_error_measure = "dev_error_aux"
batch_size = 120
learning_rate = 0.01
num_epochs = 1
"""


@pytest.mark.mpi
def test_each_loss_layers_dev_scores_are_reported_and_drive_newbob_on_one_and_two_ranks(tmp_path):
    """RETURNN's dev_score_<layer> and dev_error_<layer> of a loss layer besides the main one: in the
    log, in the learning-rate file (where newbob reads its measure), and the same sums on 2 ranks."""
    config = tmp_path / "two.py"
    config.write_text(TWO_LOSSES + f"model = {str(tmp_path / 'net')!r}\n"
                      f"learning_rate_file = {str(tmp_path / 'lr')!r}\n")
    trained = run_rnn([str(config)], timeout=180)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    line = re.compile(r"^dev: score_aux (\S+) error_aux (\S+)$", re.M)
    in_training = [float(v) for v in line.search(trained.stdout).groups()]
    history = parse_history((tmp_path / "lr").read_text(), str(tmp_path / "lr"))
    scores = history[1].scores
    np.testing.assert_allclose([scores["dev_score_aux"], scores["dev_error_aux"]], in_training, rtol=1e-5)
    assert scores["dev_score"] != scores["dev_score_aux"]  # the main layer's are its own
    one = run_rnn([str(config), "++task", "eval"], timeout=180)
    two = run_mpi(2, [str(ROOT / "rnn.py"), str(config), "++task", "eval", "++use_horovod", "1"], timeout=180)
    assert one.returncode == 0 and two.returncode == 0, two.stdout + two.stderr
    s1, s2 = (np.array(line.search(r.stdout).groups(), float) for r in (one, two))
    np.testing.assert_allclose(s1, in_training, rtol=1e-5)
    np.testing.assert_allclose(s2, s1, rtol=1e-5)
