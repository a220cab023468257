"""``stop_on_nonfinite_train_score``: an Inf/NaN loss or gradient skips its update and ends training with
one message (epoch, step, the newest checkpoint), exit code 3, and nothing with an Inf/NaN is saved; the
same decision on every rank (grad mode: the reduced values; param mode: through the step signal). With
the key False every update is applied and training goes on, as in RETURNN."""
from __future__ import annotations

import os
import re
import signal
import sys

import h5py
import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.datasets import Batch
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.protocol import step_signal
from engine.distributed.strategy import Strategy
from engine.model import build_model
from engine.runtime.errors import DATA_ERROR_EXIT_CODE, NonFiniteTrainScore
from engine.training.checkpoints import stop_requests
from engine.training.checkpoints.policy import Checkpointer
from engine.training.nonfinite import (FINITE, NONFINITE_GRADIENT, NONFINITE_LOSS, NONFINITE_PARAMS,
                                       newest_checkpoint_text, nonfinite_error)
from engine.training.step import Steps
from engine.training.update.lr_control import LearningRateControl
from engine.training.update.updater import Updater, optimizer_from_config
from helpers import ROOT, run, run_mpi

pytestmark = pytest.mark.tf_latest
SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")
NETWORK = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 6},
           "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}


# ----- the step, in process -----
def make_steps(optimizer="adam", strategy=None, **kwargs):
    model = build_model(NETWORK, input_dim=5, input_sparse=False, target_dims={"classes": 3}, random_seed=1)
    updater = Updater(model.named_trainable_variables(), optimizer_from_config(optimizer), learning_rate=0.1)
    return Steps(model, updater, strategy or Strategy(LocalCommunicator()), **kwargs), updater


def batch(seed=0, nan=False) -> Batch:
    rng = np.random.RandomState(seed)
    data = rng.randn(2, 6, 5).astype(np.float32)
    if nan:
        data[1, 2, 3] = np.nan
    lengths = np.array([6, 4], np.int32)
    return Batch(data={"data": data, "classes": rng.randint(0, 3, (2, 6))}, lengths={"data": lengths,
                 "classes": lengths}, seq_tags=["a", "b"], seq_idx=np.arange(2), corpus_seq_idx=np.arange(2),
                 num_frames={"data": 10, "classes": 10})


def state(steps, updater) -> np.ndarray:
    return np.concatenate([v.numpy().ravel().astype(np.float64) for v in steps.params + updater.variables])


class InfGradients(Strategy):
    """One rank whose reduced gradient holds an Inf (the scores stay finite)."""

    def reduce_gradients(self, grads, scores):
        return [grads[0] + np.float32(np.inf)] + list(grads[1:]), scores


def test_a_nonfinite_loss_or_gradient_skips_the_update_and_says_so():
    steps, updater = make_steps()
    steps.train(batch(0))
    assert steps.nonfinite == FINITE
    before = state(steps, updater)
    scores = steps.train(batch(1, nan=True))
    assert np.isnan(scores[0]) and steps.nonfinite == NONFINITE_LOSS
    np.testing.assert_array_equal(state(steps, updater), before)  # parameters, Adam's moments, the count
    steps.train(batch(2))  # a good batch updates again
    assert steps.nonfinite == FINITE and not np.array_equal(state(steps, updater), before)

    steps, updater = make_steps(strategy=InfGradients(LocalCommunicator()))
    before = state(steps, updater)
    assert np.isfinite(steps.train(batch(0))).all() and steps.nonfinite == NONFINITE_GRADIENT
    np.testing.assert_array_equal(state(steps, updater), before)


def test_an_update_that_overflows_the_parameters_is_found_after_it():
    steps, updater = make_steps(optimizer="sgd")
    updater.set_learning_rate(np.inf)  # finite loss and gradients; the update makes Inf/NaN parameters
    steps.train(batch(0))
    assert steps.nonfinite == NONFINITE_PARAMS


def test_with_the_key_false_every_update_is_applied_as_in_returnn():
    steps, updater = make_steps(stop_on_nonfinite=False)
    scores = steps.train(batch(1, nan=True))
    assert np.isnan(scores[0]) and steps.nonfinite == FINITE
    assert np.isnan(state(steps, updater)).any() and int(updater.iterations.numpy()) == 1


def test_accumulated_groups_are_checked_at_their_update():
    steps, updater = make_steps(accum_steps=2)
    before = state(steps, updater)
    steps.train_accumulating(batch(0, nan=True))  # only accumulates: no update, nothing decided yet
    assert steps.nonfinite == FINITE
    _, reduced = steps.train_accumulating(batch(1))
    assert np.isnan(reduced[0]) and steps.nonfinite == NONFINITE_LOSS
    np.testing.assert_array_equal(state(steps, updater), before)


def test_the_step_signal_carries_each_ranks_nonfinite_step():
    comm = LocalCommunicator()
    assert step_signal(comm, True, False).nonfinite == ()
    assert step_signal(comm, True, False, nonfinite=(17, NONFINITE_GRADIENT)).nonfinite == \
        ((0, 17, NONFINITE_GRADIENT),)


def test_the_message_is_one_paragraph_naming_epoch_step_and_checkpoint():
    error = nonfinite_error([(0, 5, NONFINITE_LOSS)], 3, epoch_global_step=40, several_ranks=False, rank=0,
                            checkpoint=newest_checkpoint_text("out/net", "out/net.003.step44"))
    text = str(error)
    assert text.startswith("stop_on_nonfinite_train_score: in train epoch 3, step 5 (global step 45) had a "
                           "non-finite loss. That update was not applied; training stops without saving. "
                           "The last good checkpoint is 'out/net.003.step44'"), text
    assert "\n" not in text and "stop_on_nonfinite_train_score = False" in text
    assert error.exit_code == DATA_ERROR_EXIT_CODE and error.agreed and not error.quiet
    several = nonfinite_error([(1, 7, NONFINITE_GRADIENT), (2, 6, NONFINITE_PARAMS)], 1,
                              epoch_global_step=None, checkpoint=newest_checkpoint_text(None, None),
                              several_ranks=True, rank=2)
    assert "in train epoch 1, rank 1's step 7 had a non-finite gradient; rank 2's step 6 had non-finite " \
           "parameters after its update. The parameters in memory are broken" in str(several), str(several)
    assert "'model' is not set" in str(several) and several.quiet  # rank 2: rank 0 says it
    assert newest_checkpoint_text("out/net", None) == \
        "There is no checkpoint under 'out/net': a rerun starts afresh."


def test_no_checkpoint_with_inf_or_nan_is_written(tmp_path):
    config = Config({"model": str(tmp_path / "net"), "network": NETWORK})
    steps, updater = make_steps()
    checkpoints = Checkpointer(config, Strategy(LocalCommunicator()), steps.model, updater,
                               LearningRateControl.from_config(config))
    assert checkpoints.save_epoch(1, 0) == str(tmp_path / "net.001")
    steps.params[0].assign(tf.fill(steps.params[0].shape, np.inf))
    with pytest.raises(NonFiniteTrainScore, match=r"not saving checkpoint '.*net\.002': "
                                                  r"hidden/W hold Inf or NaN .* The last good checkpoint is "
                                                  r"'.*net\.001'"):
        checkpoints.save_epoch(2, 4)
    assert sorted(os.listdir(tmp_path)) == ["net.001"]  # no file, no temp file
    with stop_requests.installed():  # a stop request's checkpoint: the same refusal, not a stop with 99
        os.kill(os.getpid(), signal.SIGUSR1)
        with pytest.raises(NonFiniteTrainScore, match="not saving checkpoint"):
            checkpoints.stop_if_requested(2, 4, saved=None)
    assert sorted(os.listdir(tmp_path)) == ["net.001"]
    unguarded = Checkpointer(Config({"model": str(tmp_path / "net"), "stop_on_nonfinite_train_score": False}),
                             Strategy(LocalCommunicator()), steps.model, updater, LearningRateControl())
    unguarded.save_epoch(2, 4)  # as RETURNN: the key False saves what there is
    assert sorted(os.listdir(tmp_path)) == ["net.001", "net.002"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_the_checkpoint_check_finds_each_kind_of_non_finite_value(dtype):
    from engine.training.checkpoints.policy import _finite
    values = np.full(1000, 3e4 if dtype == "float16" else 3e38, dtype=np.dtype(dtype) if dtype != "bfloat16"
                     else tf.bfloat16.as_numpy_dtype)
    assert _finite(values)  # a float32 sum would overflow: the check must not call these Inf
    for bad in ([np.nan], [np.inf], [-np.inf], [np.inf, -np.inf]):  # +Inf and -Inf would sum to NaN
        broken = values.copy()
        broken[[3, 700][:len(bad)]] = bad
        assert not _finite(broken), (dtype, bad)
    assert _finite(np.arange(5)) and _finite(np.array([True]))


# ----- whole runs: one process, and 2 ranks under mpirun -----
def run_config(folder, **overrides) -> dict:
    config = {"train": {"class": "DummyDataset", "input_dim": 5, "output_dim": 3, "num_seqs": 48,
                        "seq_len": 10, "fixed_random_seed": 7},
              "network": NETWORK, "optimizer": {"class": "adam"}, "learning_rate": 0.01, "batch_size": 40,
              "num_epochs": 2, "log_verbosity": 3, "random_seed": 3, "model": str(folder / "net"),
              "checkpoint_interval": 2, "distributed_backend": "mpi"}
    config.update(overrides)
    return config


def train(folder, ranks: int, config: dict, *options: str):
    folder.mkdir(exist_ok=True)
    args = [SCRIPT, str(folder), repr(config), *options]
    r = run([sys.executable, *args], timeout=180) if ranks == 1 else run_mpi(ranks, args, timeout=240)
    return r, r.stdout + r.stderr


def saved_checkpoints(folder) -> dict[str, np.ndarray]:
    """Every checkpoint file in ``folder``: all its float arrays, flattened."""
    found = {}
    for name in sorted(os.listdir(folder)):
        if re.fullmatch(r"net\.\d{3}(\.step\d+)?", name):
            arrays = []
            with h5py.File(folder / name, "r") as f:
                f.visititems(lambda _, obj: arrays.append(np.ravel(obj[()])) if isinstance(obj, h5py.Dataset)
                             and obj.dtype.kind == "f" else None)
            found[name] = np.concatenate(arrays)
    return found


def assert_stopped(r, output: str, folder, where: str, newest: str) -> None:
    assert r.returncode == DATA_ERROR_EXIT_CODE, output
    assert output.count("stop_on_nonfinite_train_score: in train epoch") == 1, output  # one rank says it
    assert f"stop_on_nonfinite_train_score: in train epoch {where}" in output, output
    assert f"The last good checkpoint is '{folder}/{newest}': a rerun resumes from it" in output, output
    assert "Traceback" not in output and "Another rank failed" not in output, output
    saved = saved_checkpoints(folder)
    assert newest in saved and max(saved, key=lambda n: os.path.getmtime(folder / n)) == newest, sorted(saved)
    for name, values in saved.items():
        assert np.isfinite(values).all(), name


def test_one_process_stops_at_the_nan_step(tmp_path):
    # 12 batches per epoch; checkpoints every 2 steps; a NaN input in the 3rd step of epoch 2 (step 15)
    r, output = train(tmp_path, 1, run_config(tmp_path), "fail=nan", "fail_rank=0", "fail_step=14")
    assert_stopped(r, output, tmp_path, "2, step 3 (global step 15) had a non-finite loss. That update was "
                                        "not applied", "net.002.step14")


def test_with_the_key_false_one_process_trains_on_as_returnn(tmp_path):
    config = run_config(tmp_path, stop_on_nonfinite_train_score=False, num_epochs=1)
    r, output = train(tmp_path, 1, config, "fail=nan", "fail_rank=0", "fail_step=2")
    assert r.returncode == 0, output
    assert "train epoch 1: the score is nan (Inf/NaN); stop_on_nonfinite_train_score = False, so training " \
           "goes on, as in RETURNN." in output, output
    result = np.load(tmp_path / "rank0.npz")
    assert int(result["num_steps"]) == 12 and np.isnan(result["params"]).all()
    assert np.isnan(saved_checkpoints(tmp_path)["net.001"]).any()  # saved as it is, as RETURNN does


@pytest.mark.mpi
@pytest.mark.parametrize("mode", [
    pytest.param({}, id="grad"),
    pytest.param({"horovod_reduce_type": "param", "horovod_param_sync_step": 2}, id="param"),
    pytest.param({"horovod_reduce_type": "param", "horovod_param_sync_step": 100,
                  "horovod_dataset_distribution": "random_seed_offset"}, id="param-rso"),
])
def test_two_ranks_stop_together_with_one_message(tmp_path, mode):
    """Rank 1's 4th step of epoch 1 gets a NaN input. Grad mode: the reduced loss is NaN on both ranks,
    which both stop after that step. Param mode: rank 1 tells rank 0 in the next step signal (at once
    when the ranks signal every step; with random_seed_offset when rank 0 reaches its next signal)."""
    config = run_config(tmp_path, use_horovod=True, num_epochs=1, **mode)
    r, output = train(tmp_path, 2, config, "fail=nan", "fail_rank=1", "fail_step=3")
    if not mode:
        where, newest = "1, step 4 (global step 4) had a non-finite loss", "net.001.step2"
    else:
        where, newest = "1, rank 1's step 4 (global step 4) had a non-finite loss", "net.001.step2"
    if mode.get("horovod_dataset_distribution"):  # no checkpoint: the ranks meet only at rank 1's signal
        assert r.returncode == DATA_ERROR_EXIT_CODE, output
        assert output.count("stop_on_nonfinite_train_score: in train epoch") == 1, output
        assert f"stop_on_nonfinite_train_score: in train epoch {where}" in output, output
        assert "There is no checkpoint under" in output and "Traceback" not in output, output
        assert not saved_checkpoints(tmp_path)
        return
    assert_stopped(r, output, tmp_path, where, newest)
