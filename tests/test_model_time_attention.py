"""Attention pooling over time and a loss per sequence (``engine/model/layers/time_attention.py``,
``layers/per_sequence.py``'s ``SqueezeTime``, ``spec_readers.py``), as 2022-swb-conformer-hybrid-sat's speaker
branch uses them: ``softmax_over_spatial`` and ``generic_attention`` against numpy, the CE loss of a
speaker softmax on the pooled vector against a squeezed label per sequence, the DataError of a speaker
stream with more than one frame, the refusals, and a training epoch through ``rnn.py``. Parity with
RETURNN itself: the ``speaker_pooling`` case of ``tests/test_returnn_checkpoints.py``."""
from __future__ import annotations

import copy
import re
import textwrap

import numpy as np
import pytest

from engine.config.loader import Config
from engine.datasets import Batch, DataKeyInfo, HDFWriter
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.strategy import Strategy
from engine.main import main
from engine.model import build_model
from engine.model.spec import parse_network
from engine.runtime.errors import ConfigError, DataError
from engine.training.step import Steps
from engine.training.update.updater import Updater
from helpers import run_rnn

pytestmark = pytest.mark.tf_latest

IN_DIM, ENC, CLASSES, SPEAKERS = 5, 4, 3, 6
LENGTHS = np.array([7, 4, 1, 5], np.int32)  # unequal, one sequence of a single frame
TARGET_DIMS = {"classes": CLASSES, "speaker": SPEAKERS}


def network(heads: int = 1, auto_squeeze: bool = False, energy_factor: float | None = None) -> dict:
    """The speaker branch beside a frame-wise output: frames pooled by attention into one vector per
    sequence, a softmax over speakers on it, the squeezed speaker stream as its target."""
    weights = {"class": "softmax_over_spatial", "from": "att_e"}
    if energy_factor is not None:
        weights["energy_factor"] = energy_factor
    return {
        "enc": {"class": "linear", "activation": "tanh", "n_out": ENC, "from": "data"},
        "spk_label": {"class": "squeeze", "axis": "T", "from": "data:speaker",
                      "register_as_extern_data": "spk_label"},
        "att_ff": {"class": "linear", "activation": "tanh", "n_out": 3, "from": "enc"},
        "att_e": {"class": "linear", "activation": None, "with_bias": False, "n_out": heads,
                  "from": "att_ff"},
        "att_w": weights,
        "ctx": {"class": "generic_attention", "weights": "att_w", "base": "enc",
                "auto_squeeze": auto_squeeze},
        "vec": {"class": "merge_dims", "axes": "except_batch", "from": "ctx"},
        "vec_ff": {"class": "linear", "activation": None, "n_out": 5, "from": "vec"},
        "spk_out": {"class": "softmax", "from": "vec_ff", "loss": "ce", "target": "spk_label"},
        "output": {"class": "softmax", "from": "enc", "loss": "ce"},
    }


def model_of(net: dict):
    return build_model(net, input_dim=IN_DIM, input_sparse=False, target_dims=TARGET_DIMS)


def batch_arrays(seed: int = 0, speakers=None):
    """Data with random values on the padding too (the pooling must ignore them), frame-aligned classes,
    one speaker id per sequence as a one-frame stream."""
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((len(LENGTHS), LENGTHS.max(), IN_DIM)).astype(np.float32) * 2.0
    classes = rng.randint(0, CLASSES, x.shape[:2]).astype(np.int32)
    if speakers is None:
        speakers = rng.randint(0, SPEAKERS, len(LENGTHS))
    return x, classes, np.asarray(speakers, np.int32)[:, None]


def run(model, x, classes, speaker, speaker_lengths=None):
    ones = np.ones_like(LENGTHS) if speaker_lengths is None else speaker_lengths
    out = model(x, LENGTHS, training=False, streams={"classes": classes, "speaker": speaker},
                stream_lengths={"classes": LENGTHS, "speaker": ones})
    return {k: v.numpy() for k, v in out.items()}


def numpy_softmax_over_time(energies: np.ndarray, factor: float | None) -> np.ndarray:
    """(B, T, H) energies -> per sequence and head the softmax over its valid frames, 0 on the padding."""
    e = energies.astype(np.float64) * (factor if factor else 1.0)
    result = np.zeros_like(e)
    for b, n in enumerate(LENGTHS):
        valid = np.exp(e[b, :n] - e[b, :n].max(axis=0))
        result[b, :n] = valid / valid.sum(axis=0)
    return result


@pytest.mark.parametrize("heads, auto_squeeze, energy_factor", [
    (1, True, None), (1, False, None), (1, True, 0.5), (2, True, None), (2, False, 3.0)])
def test_pooling_equals_numpy(heads, auto_squeeze, energy_factor):
    model = model_of(network(heads, auto_squeeze, energy_factor))
    x, classes, speaker = batch_arrays()
    out = run(model, x, classes, speaker)
    batch, time = len(LENGTHS), LENGTHS.max()
    # the weights: frames of the energies' shape, softmax over each sequence's valid frames, 0 on padding
    assert out["att_w"].shape == (batch, time, heads) and out["att_e"].shape == (batch, time, heads)
    np.testing.assert_array_equal(out["att_w:lengths"], LENGTHS)
    expected_w = numpy_softmax_over_time(out["att_e"], energy_factor)
    np.testing.assert_allclose(out["att_w"], expected_w, rtol=1e-5, atol=1e-7)
    mask = np.arange(time)[None, :] < LENGTHS[:, None]
    assert np.all(out["att_w"][~mask] == 0.0)
    np.testing.assert_allclose(out["att_w"].sum(axis=1), 1.0, rtol=1e-5)
    if energy_factor is not None:  # the factor changes the weights (energies are not all equal)
        assert not np.allclose(expected_w, numpy_softmax_over_time(out["att_e"], None), atol=1e-4)
    # the pooled frames: one frame per sequence, batch-major (B, 1[, H], F)
    pooled = np.einsum("bth,btf->bhf", expected_w, out["enc"].astype(np.float64))  # padding weighted 0
    squeezed = auto_squeeze and heads == 1
    assert out["ctx"].shape == ((batch, 1, ENC) if squeezed else (batch, 1, heads, ENC)), out["ctx"].shape
    np.testing.assert_array_equal(out["ctx:lengths"], np.ones_like(LENGTHS))
    np.testing.assert_allclose(out["ctx"][:, 0], pooled[:, 0] if squeezed else pooled, rtol=1e-5, atol=1e-6)
    # merge_dims "except_batch" on the vectors: RETURNN's (H, F) merged head by head
    assert out["vec"].shape == (batch, 1, heads * ENC)
    np.testing.assert_allclose(out["vec"][:, 0], pooled.reshape(batch, heads * ENC), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["vec:lengths"], np.ones_like(LENGTHS))
    assert out["spk_out"].shape == (batch, 1, SPEAKERS)
    np.testing.assert_allclose(out["spk_out"].sum(axis=-1), 1.0, rtol=1e-5)
    # the frame-wise branch keeps its frames
    assert out["output"].shape == (batch, time, CLASSES)
    np.testing.assert_array_equal(out["output:lengths"], LENGTHS)


def test_pooling_ignores_what_is_past_each_sequence():
    """Changing the data past a sequence's frames changes nothing of its vector."""
    model = model_of(network(2))
    x, classes, speaker = batch_arrays(3)
    first = run(model, x, classes, speaker)
    mask = np.arange(LENGTHS.max())[None, :] < LENGTHS[:, None]
    x2 = x.copy()
    x2[~mask] = 100.0
    second = run(model, x2, classes, speaker)
    for name in ("att_w", "ctx", "vec", "spk_out"):
        np.testing.assert_allclose(first[name], second[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_the_speaker_loss_is_the_ce_per_sequence():
    model = model_of(network(2))
    x, classes, _ = batch_arrays(1)
    probe = run(model, x, classes, np.zeros((len(LENGTHS), 1), np.int32))
    best = probe["spk_out"][:, 0].argmax(axis=-1)
    # the first two sequences labelled with the best-scored speaker, the others with another one
    labels = np.array([best[0], best[1], (best[2] + 1) % SPEAKERS, (best[3] + 2) % SPEAKERS], np.int32)
    out = run(model, x, classes, labels[:, None])
    assert out["spk_label"].shape == (len(LENGTHS), 1) and out["spk_label"].dtype == np.int32
    np.testing.assert_array_equal(out["spk_label"][:, 0], labels)
    np.testing.assert_array_equal(out["spk_label:lengths"], np.ones_like(LENGTHS))
    assert model.registered == {"spk_label": "spk_label"}
    assert model.input_streams == {"speaker"}
    sums = {k: tuple(float(v) for v in s) for k, s in
            model.layer_loss_sums(out, {"classes": classes}, {"classes": LENGTHS}).items()}
    assert set(sums) == {"output", "spk_out"}
    p = out["spk_out"][:, 0].astype(np.float64)
    expected = -np.log(p[np.arange(len(LENGTHS)), labels]).sum()
    np.testing.assert_allclose(sums["spk_out"][0], expected, rtol=1e-5)
    assert sums["spk_out"][1:] == (2.0, float(len(LENGTHS))), sums["spk_out"]  # errors and count: sequences
    # the frame-wise loss counts frames
    q = out["output"].astype(np.float64)
    frame_loss = -sum(np.log(q[b, t, classes[b, t]]) for b, n in enumerate(LENGTHS) for t in range(n))
    assert sums["output"][2] == float(LENGTHS.sum())
    np.testing.assert_allclose(sums["output"][0], frame_loss, rtol=1e-5)


def test_a_speaker_stream_of_two_frames_is_a_data_error_eagerly():
    model = model_of(network())
    x, classes, speaker = batch_arrays()
    two = np.concatenate([speaker, speaker], axis=1)
    with pytest.raises(DataError) as caught:
        run(model, x, classes, two, speaker_lengths=np.array([1, 2, 1, 1], np.int32))
    message = str(caught.value)
    assert "Network layer 'spk_label'" in message and "one frame per sequence" in message, message
    assert "[1, 2, 1, 1]" in message, message


def test_a_speaker_stream_of_two_frames_stops_the_compiled_step_with_a_data_error():
    config = Config({"network": network(), "learning_rate": 0.01,
                     "extern_data": {"data": {"dim": IN_DIM},
                                     "classes": {"dim": CLASSES, "sparse": True},
                                     "speaker": {"dim": SPEAKERS, "sparse": True}}})
    model = build_model(config, input_dim=IN_DIM, input_sparse=False, target_dims=TARGET_DIMS)
    updater = Updater.from_config(config, model.named_trainable_variables())
    steps = Steps(model, updater, Strategy(LocalCommunicator()))
    x, classes, speaker = batch_arrays(2)

    def batch(spk, spk_lengths):
        return Batch(data={"data": x, "classes": classes, "speaker": spk},
                     lengths={"data": LENGTHS, "classes": LENGTHS, "speaker": spk_lengths},
                     seq_tags=[f"s{i}" for i in range(len(LENGTHS))], seq_idx=np.arange(len(LENGTHS)),
                     corpus_seq_idx=np.arange(len(LENGTHS)),
                     num_frames={"data": int(LENGTHS.sum()), "classes": int(LENGTHS.sum()),
                                 "speaker": int(spk_lengths.sum())})

    assert np.all(np.isfinite(steps.train(batch(speaker, np.ones_like(LENGTHS)))))
    two = np.concatenate([speaker, speaker], axis=1)
    with pytest.raises(DataError) as caught:
        steps.train(batch(two, np.array([1, 1, 2, 1], np.int32)))
    message = str(caught.value)
    assert "Network layer 'spk_label'" in message and "one frame per sequence" in message, message


def changed(**layers) -> dict:
    """The speaker network with layers replaced (None: removed) or added."""
    net = copy.deepcopy(network())
    for name, layer in layers.items():
        if layer is None:
            net.pop(name)
        else:
            net[name] = layer
    return net


LOSS_RULE = ("a loss here reads a label per sequence on vectors per sequence (a registered squeeze of a "
             "one-frame stream), labels per frame on frames.")
VECTOR_RULE = ("one vector per sequence (RETURNN's value without a time axis); here only rec units (as "
               "'base:...') and the classes linear, softmax, copy, activation, merge_dims, dropout read "
               "such a layer, each on such values alone.")
UNIT = {"h": {"class": "linear", "activation": None, "n_out": 3, "from": ["data:source", "base:spk_label"]},
        "output": {"class": "copy", "from": "h"}}


@pytest.mark.parametrize("net, words", [
    (changed(spk_out={"class": "softmax", "from": "vec_ff", "loss": "ce", "target": "classes"}),
     "Network layer 'spk_out': its loss compares one vector per sequence with target 'classes', labels per "
     "frame; " + LOSS_RULE),
    (changed(output={"class": "softmax", "from": "enc", "loss": "ce", "target": "spk_label"}),
     "Network layer 'output': its loss compares frames with target 'spk_label', a label per sequence; "
     + LOSS_RULE),
    (changed(mix={"class": "copy", "from": ["vec", "enc"]}),
     "Network layer 'mix' reads 'vec', " + VECTOR_RULE),
    (changed(mix={"class": "combine", "kind": "add", "from": ["enc", "vec"]}),
     "Network layer 'mix' reads 'vec', " + VECTOR_RULE),
    (changed(mix={"class": "linear", "n_out": 2, "from": ["vec_ff", "enc"]}),
     "Network layer 'mix' reads 'vec_ff', " + VECTOR_RULE),
    (changed(output={"class": "softmax", "from": "vec_ff", "loss": "ce", "target": "spk_label"},
             spk_out=None),
     "Network layer 'output' is one vector per sequence (RETURNN's value without a time axis): the output "
     "needs the frames."),
    (changed(ctx={"class": "generic_attention", "weights": "att_w", "base": "enc", "from": "enc"}),
     "Network layer 'ctx': generic_attention reads 'weights' and 'base', no 'from' (RETURNN asserts none), "
     "got 'enc'."),
    (changed(rnn={"class": "rec", "from": "enc", "unit": UNIT},
             output={"class": "softmax", "from": "rnn", "loss": "ce"}),
     "Network layer 'rnn' reads 'spk_label', a label per sequence (a squeeze of the time axis); here only "
     "losses read such a layer as their target (register_as_extern_data)."),
    (changed(output={"class": "softmax", "from": ["enc", "spk_label"], "loss": "ce"}),
     "Network layer 'output' reads 'spk_label', a label per sequence (a squeeze of the time axis); here only "
     "losses read such a layer as their target"),
])
def test_refused_by_the_check_without_tensorflow(net, words):
    with pytest.raises(ConfigError) as caught:
        parse_network(net)  # rnn.py --check
    assert words in str(caught.value), caught.value
    with pytest.raises(ConfigError) as built:
        model_of(net)
    assert words in str(built.value), built.value


@pytest.mark.parametrize("net, words", [
    (changed(att_w={"class": "softmax_over_spatial", "from": "att_e", "axis": "F"}),
     "Network layer 'att_w': softmax_over_spatial over axis 'F' is not implemented at the top level (over "
     "the time axis, RETURNN's default, it is)."),
    (changed(att_w={"class": "softmax_over_spatial", "from": "att_e", "energy_factor": "2"}),
     "Network layer 'att_w': energy_factor must be a number, got '2'."),
    (changed(att_w={"class": "softmax_over_spatial", "from": "att_e", "use_time_mask": False}),
     "Network layer 'att_w': use_time_mask False would weight the padding frames too; not implemented."),
    (changed(ctx={"class": "generic_attention", "weights": "att_w", "base": "enc", "auto_squeeze": 1}),
     "Network layer 'ctx': auto_squeeze must be True or False, got 1."),
    (changed(spk_label={"class": "squeeze", "axis": "F", "from": "data:speaker",
                        "register_as_extern_data": "spk_label"}),
     "Network layer 'spk_label': squeeze at the top level is implemented over the time axis ('axis': 'T') "
     "of a stream of class ids with one frame per sequence (a label per sequence), got axis 'F'."),
    (changed(sq={"class": "squeeze", "axis": "T", "from": "enc", "is_output_layer": True}),
     "Network layer 'sq': squeeze at the top level is implemented over the time axis ('axis': 'T') of a "
     "stream of class ids with one frame per sequence (a label per sequence), got axis 'T' of features."),
    (changed(spk_label={"class": "squeeze", "axis": "T", "from": "data:speaker", "allow_no_op": True,
                        "register_as_extern_data": "spk_label"}),
     "Network layer 'spk_label': squeeze takes enforce_batch_dim_axis 0 and allow_no_op False only"),
])
def test_refused_at_build(net, words):
    parse_network(net)  # these checks need the layers' shapes: the build makes them
    with pytest.raises(ConfigError) as caught:
        model_of(net)
    assert words in str(caught.value), caught.value


def test_a_squeeze_of_features_does_not_register():
    net = changed(sq={"class": "squeeze", "axis": "T", "from": "enc", "register_as_extern_data": "x"})
    with pytest.raises(ConfigError, match=re.escape(
            "Network layer 'sq': register_as_extern_data 'x': registering is implemented for eval layers "
            "whose out_type is sparse")):
        parse_network(net)


@pytest.mark.parametrize("base", ["red", "ctx", "vec_ff"])  # red: a reduce over time, a vector too
def test_a_rec_unit_reads_a_vector_per_sequence_as_base(base):
    """spec_readers.py: a vector per sequence is read by rec units as ``base:`` (unlike the label), one
    vector a step of the loop over the input frames."""
    unit = {"h": {"class": "linear", "activation": None, "n_out": 3, "from": ["data:source", f"base:{base}"]},
            "output": {"class": "copy", "from": "h"}}
    net = changed(red={"class": "reduce", "mode": "max", "axes": "T", "from": "enc"},
                  rnn={"class": "rec", "from": "enc", "unit": unit},
                  output={"class": "softmax", "from": "rnn", "loss": "ce"})
    net["ctx"]["auto_squeeze"] = True
    parse_network(net)
    model = model_of(net)
    out = run(model, *batch_arrays())
    assert out["rnn"].shape == (len(LENGTHS), LENGTHS.max(), 3)
    assert out["output"].shape == (len(LENGTHS), LENGTHS.max(), CLASSES)
    # every step reads the same vector: two frames differ by their own frames' part of the weights only
    w = model.named_variables()["rnn/h/W"].numpy()
    enc, h = out["enc"], out["rnn"]
    np.testing.assert_allclose(h[0, 1] - h[0, 0], (enc[0, 1] - enc[0, 0]) @ w[:enc.shape[-1]], atol=1e-5)


# ---- rnn.py on an HDF corpus of data, classes and a one-frame speaker stream ----

CONFIG = """\
    #!rnn.py
    extern_data = {"data": {"dim": %(in_dim)d},
                   "classes": {"dim": %(classes)d, "sparse": True, "dtype": "int32"},
                   "speaker": {"dim": %(speakers)d, "sparse": True, "dtype": "int32"}}
    task = "train"
    train = {"class": "HDFDataset", "files": [%(corpus)r]}
    network = %(network)r
    batch_size = 40
    max_seqs = 3
    num_epochs = 1
    learning_rate = 0.01
    optimizer = {"class": "adam"}
    model = %(model)r
    """


def write_corpus(path) -> str:
    """6 sequences: data (dense) and classes of each sequence's frames, one speaker id per sequence."""
    rng = np.random.RandomState(0)
    keys = {"data": DataKeyInfo(dim=IN_DIM), "classes": DataKeyInfo(dim=CLASSES, sparse=True),
            "speaker": DataKeyInfo(dim=SPEAKERS, sparse=True)}
    with HDFWriter(str(path), keys) as writer:
        for i in range(6):
            n = 3 + 2 * i
            writer.insert(f"seq-{i}", {"data": rng.standard_normal((n, IN_DIM)).astype(np.float32),
                                       "classes": rng.randint(0, CLASSES, n).astype(np.int32),
                                       "speaker": np.array([i % SPEAKERS], np.int32)})
    return str(path)


def config_file(tmp_path) -> str:
    path = tmp_path / "train.config"
    path.write_text(textwrap.dedent(CONFIG) % dict(
        in_dim=IN_DIM, classes=CLASSES, speakers=SPEAKERS, corpus=write_corpus(tmp_path / "corpus.hdf"),
        network=network(2, energy_factor=0.5), model=str(tmp_path / "out" / "net")))
    return str(path)


def test_rnn_trains_the_speaker_branch_beside_the_frames(tmp_path):
    r = run_rnn([config_file(tmp_path)])
    output = r.stdout + r.stderr
    assert r.returncode == 0, output
    assert "train epoch 1, finished after" in output, output
    assert (tmp_path / "out" / "net.001").exists(), sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "Traceback" not in output, output


def test_the_check_accepts_the_config(tmp_path, capsys, fresh_log):
    assert main([config_file(tmp_path), "--check"]) == 0
    assert "Training would start" in capsys.readouterr().out
