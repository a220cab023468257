"""One update equals RETURNN's: from RETURNN's checkpoint and batch, the engine's parameters after one train
step and its change of the dev score are RETURNN's (tests/fixtures/returnn_parity, made by RETURNN with
benchmarks/bench_returnn_parity.py; RETURNN is not needed here).

Each case is an LSTM (RETURNN's unit ``lstm``, NativeLstm2), a tanh ``linear`` and a ``softmax`` with a
``ce`` or ``ctc`` loss, trained with sgd, adam or nadam and the keys it names (``L2``, ``darc1``,
``gradient_clip``, ``gradient_clip_norm``, ``gradient_clip_global_norm``). The engine takes the fixture's
checkpoint as ``load`` of a config that says what RETURNN's said and runs one step
(``mpi_scripts/returnn_parity_step.py``, which the 2-rank cases run under mpirun, each rank with half of
RETURNN's batch). Then ``gradient_clip_norm`` on the LSTM's weights, which this engine keeps in one
variable and RETURNN in two.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.strategy import Strategy
from engine.model import build_model
from engine.training.checkpoints.returnn_format import LSTM_LAYOUTS, ReturnnView
from engine.training.step import Steps
from engine.training.update.gradients import GradientOptions, process_gradients
from engine.training.update.updater import Updater
from helpers import ROOT, run, run_mpi
from mpi_scripts.returnn_parity_step import one_update, read_results

pytestmark = pytest.mark.tf_latest

FIXTURES = ROOT / "tests" / "fixtures" / "returnn_parity"
SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "returnn_parity_step.py")
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
ONE_RANK = sorted(n for n, c in CASES.items() if c["ranks"] == 1)
TWO_RANKS = sorted(n for n, c in CASES.items() if c["ranks"] == 2)
sys.path.insert(0, str(ROOT / "benchmarks"))
# the tolerances the script that makes the fixtures judges by: float32 rounding of parameters of size ~1
# after one update, and the dev score's change
from bench_returnn_parity import DEV_CHANGE_RTOL, PARAM_ATOL as ATOL, PARAM_RTOL as RTOL  # noqa: E402


def assert_equals_returnns(name: str, got: dict) -> None:
    case = CASES[name]
    expected = np.load(FIXTURES / f"{name}.after.npz")
    assert sorted(got["params"]) == sorted(expected.files)
    for key in expected.files:
        np.testing.assert_allclose(got["params"][key], expected[key], rtol=RTOL, atol=ATOL,
                                   err_msg=f"{name}: {key} after the update")
    ours = got["dev_score_after"] - got["dev_score_before"]
    theirs = case["dev_score_after"] - case["dev_score_before"]
    assert ours == pytest.approx(theirs, rel=DEV_CHANGE_RTOL), f"{name}: dev-score change"
    assert got["dev_score_before"] == pytest.approx(case["dev_score_before"], rel=1e-6)
    # RETURNN's loss sum of its train batch (the objective without the constraints; 2 ranks: both ranks')
    assert got["train_loss_sum"] == pytest.approx(case["train_loss_sum"], rel=1e-6)


@pytest.mark.parametrize("name", ONE_RANK)
def test_one_update_equals_returnns(name):
    assert_equals_returnns(name, one_update(str(FIXTURES), name))


@pytest.mark.tf_latest_mpi
@pytest.mark.mpi
def test_two_ranks_in_grad_mode_equal_returnns_update_on_the_union_batch(tmp_path):
    """Each rank takes 2 of the 4 sequences RETURNN trained on; the summed gradients (with each rank's
    L2 term, which RETURNN's reference doubles) make RETURNN's update."""
    r = run_mpi(2, [SCRIPT, str(FIXTURES), str(tmp_path), *TWO_RANKS], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in TWO_RANKS:
        networks = CASES[name]["engine"]["network"], CASES[name]["returnn"]["network"]
        assert [2 * networks[0][layer]["L2"] for layer in networks[0]] == [
            networks[1][layer]["L2"] for layer in networks[0]]
        assert_equals_returnns(name, read_results(str(tmp_path), name))


@pytest.mark.version_independent
def test_the_fixture_script_without_returnn_recomputes_nothing(tmp_path):
    r = run([sys.executable, str(ROOT / "benchmarks" / "bench_returnn_parity.py"), "--out", str(tmp_path)],
            env={"RETURNN_PYTHON": str(tmp_path / "no-python")}, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no RETURNN found" in r.stderr and "pip install tensorflow-cpu==2.15.1 returnn" in r.stderr
    assert list(tmp_path.iterdir()) == []


# ----- the fixtures test what they name -----

def test_every_key_is_active_in_its_cases():
    """The clipping keys clip (RETURNN's gradient norms before clipping exceed them), L2 and darc1 add to
    RETURNN's objective: a case whose key did nothing would prove nothing about it."""
    for name, case in CASES.items():
        keys, norms = case["engine"], case["grad_norms"]
        clips = [k for k in ("gradient_clip", "gradient_clip_norm", "gradient_clip_global_norm")
                 if keys.get(k)]
        if clips and keys["optimizer"]["class"] in ("adam", "nadam"):  # with epsilon 1e-16 their first step
            assert keys.get("optimizer_epsilon", 0) >= 0.01, name  # is g / |g|: clipping would not show
        if keys.get("gradient_clip"):
            assert case["grad_max_abs"] > keys["gradient_clip"], name
        if keys.get("gradient_clip_norm"):  # some tensors above the norm, some below; and the LSTM's W
            # and W_re together above it, so clipping them as one would give another update
            assert max(norms.values()) > keys["gradient_clip_norm"] > min(norms.values()), name
            assert np.hypot(norms["lstm/rec/W"], norms["lstm/rec/W_re"]) > keys["gradient_clip_norm"], name
        if keys.get("gradient_clip_global_norm"):
            assert case["grad_global_norm"] > keys["gradient_clip_global_norm"], name
        regularized = any("L2" in layer or "darc1" in layer for layer in keys["network"].values())
        assert (case["train_constraints"] > 0) == regularized, name
    assert {c["loss"] for c in CASES.values()} == {"ce", "ctc"}
    assert {c["engine"]["optimizer"]["class"] for c in CASES.values()} == {"sgd", "adam", "nadam"}


# ----- gradient_clip_norm: RETURNN clips each of its variables, the LSTM's W and W_re apart -----

def lstm_model(unit: str):
    network = {"lstm": {"class": "rec", "unit": unit, "n_out": 3},
               "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
    return build_model(Config({"network": network}), input_dim=2, input_sparse=False,
                       target_dims={"classes": 4})


def test_clip_norm_clips_each_row_block_on_its_own():
    grad = tf.constant([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0]])  # blocks of 2 and 1 rows: norms 5.02, 10
    out = process_gradients([grad], GradientOptions(clip_norm=1.0), tf.constant([1, 2], tf.int64),
                            parts=[(2, 1)])[0].numpy()
    top = np.array([[3.0, 4.0], [0.3, 0.4]])
    np.testing.assert_allclose(out[:2], top / np.sqrt(np.sum(top ** 2)), rtol=1e-6)
    np.testing.assert_allclose(out[2], [0.6, 0.8], rtol=1e-6)
    whole = process_gradients([grad], GradientOptions(clip_norm=1.0), tf.constant([1, 2], tf.int64))[0]
    np.testing.assert_allclose(whole.numpy(), grad.numpy() / np.linalg.norm(grad.numpy()), rtol=1e-6)


@pytest.mark.parametrize("unit", sorted(LSTM_LAYOUTS))
def test_the_lstm_parts_are_returnns_variables(unit):
    """``returnn_parts`` splits W where RETURNN's checkpoint layout has W and W_re, for every unit."""
    model = lstm_model(unit)
    layout = LSTM_LAYOUTS[unit]
    expected = {"lstm/W": (2, 3)} if layout.recurrent else {}
    assert model.returnn_parts() == expected
    shapes = ReturnnView(model).shapes()
    rows = [shapes[f"lstm/rec/{n}"][0] for n in (layout.kernel, layout.recurrent) if n]
    assert tuple(rows) == expected.get("lstm/W", (5,))


def test_an_updater_that_does_not_know_the_parts_is_refused_with_clip_norm():
    model = lstm_model("lstm")
    config = Config({"gradient_clip_norm": 1.0})
    updater = Updater.from_config(config, model.named_trainable_variables())
    with pytest.raises(ValueError, match="parts=model.returnn_parts"):
        Steps(model, updater, Strategy(LocalCommunicator()))
    # without gradient_clip_norm the parts change nothing, and are not needed
    Steps(model, Updater.from_config(Config({}), model.named_trainable_variables()),
          Strategy(LocalCommunicator()))
