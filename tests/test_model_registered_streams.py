"""RETURNN's ``register_as_extern_data`` (``engine/model/spec_streams.py``), ``eval`` layers of class ids
(``out_type`` sparse, ``engine/model/layers/eval.py``) and networks without an ``output`` layer, as
2022-swb-factored-hybrid uses them: targets derived from the alignment inside the network, losses on those
targets, a layer reading ``data:<registered stream>``, ``same_dim_tags_as`` on data and classes. Values and
loss sums against numpy, training through ``rnn.py`` on a corpus of data and classes only, and each
refusal's message. Parity with RETURNN itself: the ``registered_ids`` case of
``tests/test_returnn_checkpoints.py``."""
from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest

from engine.config.dim_tags import DimensionTag
from engine.config.loader import Config
from engine.datasets import Batch, DataKeyInfo, HDFWriter
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.strategy import Strategy
from engine.main import main
from engine.model import build_model
from engine.runtime.errors import ConfigError
from engine.training.step import Steps
from engine.training.update.updater import Updater
from helpers import run_rnn

pytestmark = pytest.mark.tf_latest

PHONES, STATES = 4, 3  # classes = phone * STATES + state, as the factored hybrid's alignment
CLASSES = PHONES * STATES
LENGTHS = np.array([7, 5, 2], np.int32)


def ids(eval_: str, source, dim: int, register: str | None = None) -> dict:
    layer = {"class": "eval", "eval": eval_, "from": source,
             "out_type": {"dim": dim, "dtype": "int32", "sparse": True}}
    return {**layer, "register_as_extern_data": register} if register else layer


# no 'output' layer: RETURNN trains on the loss layers
NETWORK = {
    "phone": ids(f"tf.math.floordiv(source(0), {STATES})", "data:classes", PHONES),
    "state": ids(f"tf.math.floormod(source(0), {STATES})", "data:classes", STATES, register="stateId"),
    "center": ids(f"source(0) * {STATES} + source(1)", ["phone", "state"], CLASSES, register="centerState"),
    "past": ids(f"tf.math.floormod(source(0) + 1, {PHONES})", "phone", PHONES, register="pastLabel"),
    "lstm": {"class": "rec", "unit": "lstm", "n_out": 4, "from": "data"},
    "pastEmbed": {"class": "linear", "activation": None, "with_bias": False, "n_out": 3,
                  "from": "data:pastLabel"},
    "joint": {"class": "copy", "from": ["lstm", "pastEmbed"]},
    "center-output": {"class": "softmax", "loss": "ce", "target": "centerState", "from": "joint"},
    "state-output": {"class": "softmax", "loss": "ce", "target": "stateId", "from": "lstm",
                     "loss_opts": {"focal_loss_factor": 2.0, "label_smoothing": 0.2}},
    "left-output": {"class": "softmax", "loss": "ce", "target": "pastLabel", "from": "lstm",
                    "loss_opts": {"focal_loss_factor": 1.0}},
}


def extern_data(tagged: bool = True) -> dict:
    tag = DimensionTag(kind=DimensionTag.Types.Spatial, description="time")
    same = {"same_dim_tags_as": {"t": tag}} if tagged else {}
    return {"data": {"dim": 3, **same}, "classes": {"dim": CLASSES, "sparse": True, "dtype": "int32", **same}}


def model_of(network: dict = NETWORK, tagged: bool = True):
    config = Config({"extern_data": extern_data(tagged), "network": network, "learning_rate": 0.01})
    return build_model(config, input_dim=3, input_sparse=False, target_dims={"classes": CLASSES}), config


def batch_arrays(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((len(LENGTHS), LENGTHS.max(), 3)).astype(np.float32)
    classes = rng.randint(0, CLASSES, x.shape[:2]).astype(np.int32)
    for b, n in enumerate(LENGTHS):
        x[b, n:], classes[b, n:] = 0.0, 0
    return x, classes


def numpy_ce_sums(probs: np.ndarray, target: np.ndarray, focal: float = 0.0, smoothing: float = 0.0):
    """Loss sum, error sum and frame count over the frames t < LENGTHS[b] (``masked_ce_sums``): -log p_y,
    with label smoothing the CE against (1 - s on y, s / (C - 1) elsewhere) minus that distribution's
    entropy, times (1 - p_y) ** focal."""
    num_classes = probs.shape[-1]
    loss = err = frames = 0.0
    for b, n in enumerate(LENGTHS):
        for t in range(n):
            p, y = probs[b, t].astype(np.float64), target[b, t]
            value = -np.log(p[y])
            if smoothing:
                soft = np.full(num_classes, smoothing / (num_classes - 1))
                soft[y] = 1.0 - smoothing
                value = -(soft * np.log(p)).sum() + (soft * np.log(soft)).sum()
            loss += value * (1.0 - p[y]) ** focal
            err += float(np.argmax(p) != y)
            frames += 1
    return loss, err, frames


def test_registered_streams_and_their_losses_against_numpy():
    model, _ = model_of()
    assert model.registered == {"stateId": "state", "centerState": "center", "pastLabel": "past"}
    assert model.computed_targets == {"stateId", "centerState", "pastLabel"}
    assert model.input_streams == {"classes"}
    assert model.loss_layers[0] == "center-output"  # its score is the one reported (no 'output' layer)
    order = list(model.order)
    assert order.index("past") < order.index("pastEmbed")  # data:pastLabel is the layer 'past'
    for loss_layer, layer in (("center-output", "center"), ("state-output", "state"),
                              ("left-output", "past")):
        assert order.index(layer) < order.index(loss_layer)
    x, classes = batch_arrays()
    out = {k: v.numpy() for k, v in model(x, LENGTHS, streams={"classes": classes},
                                          stream_lengths={"classes": LENGTHS}).items()}
    phone, state = classes // STATES, classes % STATES
    expected = {"phone": phone, "state": state, "center": phone * STATES + state,
                "past": (phone + 1) % PHONES}
    mask = np.arange(LENGTHS.max())[None, :] < LENGTHS[:, None]
    for name, values in expected.items():
        assert out[name].dtype == np.int32 and out[name].shape == classes.shape, (name, out[name].dtype)
        np.testing.assert_array_equal(out[name][mask], values[mask], err_msg=name)
        np.testing.assert_array_equal(out[f"{name}:lengths"], LENGTHS)
    np.testing.assert_array_equal(expected["center"], classes)  # the combination gives the alignment back
    # pastEmbed reads the ids of 'past' as a one-hot: its output is the weight row of each id
    weights = [v.numpy() for v in model.trainable_variables if "pastEmbed" in v.name]
    assert len(weights) == 1 and weights[0].shape == (PHONES, 3)
    np.testing.assert_allclose(out["pastEmbed"][mask], weights[0][expected["past"][mask]], rtol=1e-6)
    np.testing.assert_allclose(out["joint"][..., 4:][mask], out["pastEmbed"][mask], rtol=1e-6)
    # the batch's targets hold none of the registered streams: the losses read the layers' outputs
    sums = {k: tuple(float(v) for v in s) for k, s in model.layer_loss_sums(out, {}, {}).items()}
    assert set(sums) == {"center-output", "state-output", "left-output"}
    loss, err, frames = numpy_ce_sums(out["center-output"], expected["center"])  # no loss_opts: -log p_y
    assert frames == LENGTHS.sum() and sums["center-output"][1:] == (err, frames), sums["center-output"]
    np.testing.assert_allclose(sums["center-output"][0], loss, rtol=1e-5)
    np.testing.assert_allclose(sums["state-output"], numpy_ce_sums(out["state-output"], expected["state"],
                                                                   focal=2.0, smoothing=0.2), rtol=1e-4)
    np.testing.assert_allclose(sums["left-output"], numpy_ce_sums(out["left-output"], expected["past"],
                                                                  focal=1.0), rtol=1e-5)
    # batch streams of the registered names (had the corpus any) are replaced by the layers' outputs
    zeros = np.zeros_like(classes)
    again = model.layer_loss_sums(out, dict.fromkeys(model.registered, zeros),
                                  dict.fromkeys(model.registered, np.ones_like(LENGTHS)))
    assert {k: tuple(float(v) for v in s) for k, s in again.items()} == sums


def test_a_train_step_reads_data_and_classes_only():
    model, config = model_of()
    updater = Updater.from_config(config, model.named_trainable_variables())
    steps = Steps(model, updater, Strategy(LocalCommunicator()))
    assert steps.batch_keys == ["data", "classes"]
    x, classes = batch_arrays(1)
    batch = Batch(data={"data": x, "classes": classes}, lengths={"data": LENGTHS, "classes": LENGTHS},
                  seq_tags=["a", "b", "c"], seq_idx=np.arange(3), corpus_seq_idx=np.arange(3),
                  num_frames={"data": int(LENGTHS.sum()), "classes": int(LENGTHS.sum())})
    before = [v.numpy().copy() for v in model.trainable_variables]
    scores = steps.train(batch)
    assert np.all(np.isfinite(scores))
    assert all(np.any(v.numpy() != b) for v, b in zip(model.trainable_variables, before))


CONFIG = """\
    #!rnn.py
    from TFUtil import DimensionTag
    time_tag = DimensionTag(kind=DimensionTag.Types.Spatial, description="time")
    extern_data = {"data": {"dim": 3, "same_dim_tags_as": {"t": time_tag}},
                   "classes": {"dim": %(classes)d, "sparse": True, "dtype": "int32",
                               "same_dim_tags_as": {"t": time_tag}}}
    task = "train"
    train = {"class": "HDFDataset", "files": [%(corpus)r]}
    network = %(network)r
    batch_size = 100
    num_epochs = 1
    learning_rate = 0.01
    model = %(model)r
    %(more)s
    """


def write_corpus(path) -> str:
    """8 sequences of data (dim 3) and classes of the same lengths: no stream of a registered name."""
    rng = np.random.RandomState(0)
    keys = {"data": DataKeyInfo(dim=3), "classes": DataKeyInfo(dim=CLASSES, sparse=True)}
    with HDFWriter(str(path), keys) as writer:
        for i in range(8):
            n = 4 + i
            writer.insert(f"seq-{i}", {"data": rng.standard_normal((n, 3)).astype(np.float32),
                                       "classes": rng.randint(0, CLASSES, n).astype(np.int32)})
    return str(path)


def config_file(tmp_path, more: str = "") -> str:
    path = tmp_path / "train.config"
    path.write_text(textwrap.dedent(CONFIG) % dict(
        classes=CLASSES, corpus=write_corpus(tmp_path / "corpus.hdf"), network=NETWORK,
        model=str(tmp_path / "out" / "net"), more=more))
    return str(path)


def test_rnn_trains_the_network_on_data_and_classes(tmp_path):
    path = config_file(tmp_path)
    r = run_rnn([path])
    output = r.stdout + r.stderr
    assert r.returncode == 0, output
    assert "train epoch 1, finished after" in output, output
    assert (tmp_path / "out" / "net.001").exists(), sorted(p.name for p in (tmp_path / "out").iterdir())
    # the epoch's frames: the corpus' 60, read from data and classes
    assert re.search(r"^train epoch 1: [\d.]+ frames/sec \(60 frames", output, re.M), output
    assert "Traceback" not in output, output


# 2022-swb-factored-hybrid declares the streams its layers register in extern_data too (its dataset gives
# data and classes only); RETURNN's register_as_extern_data replaces such an entry, and its batches feed
# only the streams the network reads from the dataset
DECLARED = """\
extern_data.update({name: {"dim": dim, "dtype": "int32", "sparse": True, "same_dim_tags_as": {"t": time_tag}}
                    for name, dim in (("stateId", 3), ("centerState", 12), ("pastLabel", 4))})
"""


def test_rnn_trains_when_extern_data_declares_the_registered_streams(tmp_path):
    r = run_rnn([config_file(tmp_path, more=DECLARED)])
    output = r.stdout + r.stderr
    assert r.returncode == 0 and "train epoch 1, finished after" in output, output


def test_the_check_accepts_the_config(tmp_path, capsys, fresh_log):
    assert main([config_file(tmp_path), "--check"]) == 0
    assert "Training would start" in capsys.readouterr().out


def refused(network: dict, words: str, tagged: bool = True) -> None:
    with pytest.raises(ConfigError) as caught:
        model, _ = model_of(network, tagged)
        x, classes = batch_arrays()
        model(x, LENGTHS, streams={"classes": classes}, stream_lengths={"classes": LENGTHS})
    assert words in str(caught.value), caught.value


def test_only_an_eval_of_class_ids_registers_and_each_name_once():
    linear = {**NETWORK, "pastEmbed": {**NETWORK["pastEmbed"], "register_as_extern_data": "embedded"}}
    refused(linear, "Network layer 'pastEmbed': register_as_extern_data 'embedded': registering is "
                    "implemented for eval layers whose out_type is sparse")
    refused(linear, "a linear layer's output is no such stream here")
    twice = {**NETWORK, "phone": {**NETWORK["phone"], "register_as_extern_data": "stateId"}}
    refused(twice, "Network layer 'state': register_as_extern_data 'stateId': layer 'phone' registers that "
                   "stream already.")
    unregistered = {**NETWORK, "state": {**NETWORK["state"], "register_as_extern_data": None}}
    refused(unregistered, "Network layer 'state-output': 'n_out' is not given and target 'stateId' is not a "
                          "known data stream (known: ['centerState', 'classes', 'pastLabel'])")  # None: none
    for bad in ("data", "data:x", ""):
        named = {**NETWORK, "phone": {**NETWORK["phone"], "register_as_extern_data": bad}}
        refused(named, f"Network layer 'phone': register_as_extern_data must be a stream name (not 'data'), "
                       f"got {bad!r}")


def test_an_eval_of_class_ids_reads_and_returns_class_ids():
    dense = {**NETWORK, "phone": ids(f"tf.math.floordiv(source(0), {STATES})", "lstm", PHONES)}
    refused(dense, "Network layer 'phone': an eval of class ids (out_type sparse) reads class ids here (data "
                   "streams of class ids, or evals of them); some of its sources are features.")
    mixed = {**NETWORK, "center": ids("source(0) * 3 + source(1)", ["phone", "data"], CLASSES,
                                      register="centerState")}
    refused(mixed, "Network layer 'center': an eval of class ids (out_type sparse) reads class ids here")
    floats = {**NETWORK, "state": ids("tf.cast(source(0), tf.float32)", "data:classes", STATES,
                                      register="stateId")}
    refused(floats, "Network layer 'state': eval 'tf.cast(source(0), tf.float32)' returned float32 of shape "
                    "(3, 7); its out_type says class ids, so the output must be integers (batch, time), as "
                    "source(0).")
    as_data = {**NETWORK, "state": ids("source(0, as_data=True).placeholder", "data:classes", STATES,
                                       register="stateId")}
    refused(as_data, "source(0, as_data=True): RETURNN's Data of class ids is not provided by this engine")


def test_a_network_needs_an_output_or_a_loss():
    heads = {k: v for k, v in NETWORK.items() if not k.endswith("-output")}
    refused(heads, "The network has no layer called 'output' and no layer with a loss or is_output_layer, "
                   "so nothing would be computed (layers: phone, state, center, past, lstm, pastEmbed, joint")
    marked = {**heads, "joint": {**heads["joint"], "is_output_layer": True}}
    model, _ = model_of(marked)  # is_output_layer is enough to build it
    assert "joint" in model.order and "lstm" in model.order


def test_forward_needs_the_output_layer():
    model, _ = model_of()
    with pytest.raises(ConfigError) as caught:
        model.output_lengths(np.array(LENGTHS))
    assert str(caught.value).startswith("The network has no layer called 'output', whose values a forward "
                                        "pass writes (RETURNN's default output layer); its layers: phone, "
                                        "state, center, past, lstm, pastEmbed, joint, "), caught.value
    # task 'forward' (engine/tasks/forward.py) traces the forward step first: this network reads
    # data:classes, which forward does not feed
    with pytest.raises(ConfigError, match=r"The network's layers read the data stream\(s\) "
                                          r"\['classes'\] \('data:<stream>'\), but this task feeds the "
                                          r"network 'data' only"):
        Steps(model).trace("forward")


def test_forward_of_a_network_without_output_is_refused_by_name():
    network = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 4, "from": "data"},
               "center-output": {"class": "softmax", "loss": "ce", "target": "classes", "from": "lstm"}}
    model, _ = model_of(network)
    with pytest.raises(ConfigError, match="The network has no layer called 'output', whose values a forward "
                                          "pass writes"):
        Steps(model).trace("forward")


def test_frames_of_data_and_classes_mix_only_on_one_time_tag():
    model_of()  # tagged: the concatenation of the LSTM's frames and those of the classes is built
    refused(NETWORK, "Network layer 'joint': its sources ['lstm', 'pastEmbed'] are on different time axes",
            tagged=False)
