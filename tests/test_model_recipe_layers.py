"""What RETURNN recipes put into the network dict: every LSTM unit name, ``L2``, ``loss_opts`` (focal loss,
label smoothing), ``time_chunking``/``time_unchunking``, reproducible dropout; numbers against numpy."""
import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.model.layers.lstm import fused_lstm, scan_lstm
from engine.model.layers.time_chunking import chunk_time, unchunk_time
from engine.model.spec import LSTM_UNITS
from engine.runtime.errors import ConfigError

pytestmark = pytest.mark.tf_latest


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def batch(rng, lengths, dim):
    x = rng.randn(len(lengths), max(lengths), dim).astype("float32")
    y = rng.randint(0, 3, (len(lengths), max(lengths))).astype("int32")
    return x, np.array(lengths, np.int32), y


def unit_outputs(units, x, lengths, weights=None):
    """Each unit's rec layer on ``x``; with ``weights`` (W, b) all of them get those parameters."""
    outputs = []
    for unit in units:
        network = {"l": {"class": "rec", "unit": unit, "n_out": 3}, "output": {"class": "copy", "from": "l"}}
        model = build_model(network, input_dim=4, input_sparse=False, target_dims={"classes": 3})
        if weights is not None:
            model.layers["l"].params["W"].assign(weights[0])
            model.layers["l"].params["b"].assign(weights[1])
        outputs.append(model(x, lengths)["output"].numpy())
    return outputs


@pytest.mark.parametrize("unit", ["LSTMBlockFused", "lstmp", "CudnnLSTM", "LSTMBlock",
                                  "VanillaLSTM", "nativelstm", "NativeLstm2"])
def test_every_native_lstm_unit_name_is_returnns_nativelstm2(unit):
    """In RETURNN on TF 2 these units all run NativeLSTM2 (no forget bias); so do they here."""
    assert unit.lower() in LSTM_UNITS
    x, lengths, _ = batch(np.random.RandomState(0), [5, 3], 4)
    outputs = unit_outputs(["lstm", unit], x, lengths)
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_tf_cell_units_add_forget_bias_1_at_run_time_and_start_as_returnn():
    rng = np.random.RandomState(1)
    x, lengths, _ = batch(rng, [5, 3], 4)
    weights = (rng.randn(4 + 3, 12).astype("float32") * 0.5, rng.randn(12).astype("float32") * 0.1)
    lstm, basic, standard = unit_outputs(["lstm", "BasicLSTM", "StandardLSTM"], x, lengths, weights)
    np.testing.assert_array_equal(basic, standard)
    shifted = (weights[0], weights[1] + np.repeat([0.0, 0.0, 1.0, 0.0], 3).astype("float32"))
    np.testing.assert_allclose(standard, unit_outputs(["lstm"], x, lengths, shifted)[0], atol=1e-6)
    assert not np.allclose(lstm, standard)
    # initialisation: bias 0; NativeLSTM2 draws input and recurrent weights each glorot (RETURNN's
    # xavier), a TF cell one glorot matrix over both
    for unit, limits in (("lstm", [(6 / (4 + 12)) ** 0.5, (6 / (3 + 12)) ** 0.5]),
                         ("StandardLSTM", [(6 / (7 + 12)) ** 0.5] * 2),
                         ("NativeLstmLowMem", [(6 / (7 + 12)) ** 0.5] * 2)):  # one kernel, no forget bias
        model = build_model({"output": {"class": "rec", "unit": unit, "n_out": 3}}, input_dim=4,
                            input_sparse=False, target_dims={})
        w, b = (model.layers["output"].params[k].numpy() for k in ("W", "b"))
        assert not b.any()
        for block, limit in zip((w[:4], w[4:]), limits):
            assert np.abs(block).max() <= limit and np.abs(block).max() > 0.7 * limit


@pytest.mark.parametrize("unit", ["GRU", "ZoneoutLSTM", "LayerNormLSTM", 3])
def test_other_units_are_refused_naming_the_supported_ones(unit):
    with pytest.raises(ConfigError, match=r"unit .* is not supported; supported: LSTM, lstmp, .* "
                                          r"\(each a plain LSTM\), and LayerNormVariantsLSTM"):
        build_model({"output": {"class": "rec", "unit": unit, "n_out": 3}}, input_dim=4, input_sparse=False,
                    target_dims={})


def test_scan_lstm_equals_the_fused_kernel_with_gradients():
    rng = np.random.RandomState(1)
    x = tf.constant(rng.randn(6, 3, 4).astype("float32"))
    lengths = tf.constant([6, 2, 4])
    w = tf.Variable(rng.randn(4 + 5, 20).astype("float32") * 0.4)
    b = tf.Variable(rng.randn(20).astype("float32") * 0.1)
    mask = tf.cast(tf.transpose(tf.sequence_mask(lengths, 6)), tf.float32)[:, :, None]
    results = []
    for lstm in (fused_lstm, scan_lstm):
        with tf.GradientTape() as tape:
            h = lstm(x, lengths, w, b, 5) * mask
            loss = tf.reduce_sum(tf.sin(h))
        results.append([h.numpy()] + [g.numpy() for g in tape.gradient(loss, [w, b])])
    for fused, scanned in zip(*results):
        np.testing.assert_allclose(scanned, fused, rtol=1e-5, atol=1e-6)


def test_l2_adds_factor_times_sum_of_squares_of_each_layers_parameters():
    net = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 5, "L2": 0.01},
           "lstm": {"class": "rec", "n_out": 4, "from": "hidden", "L2": 0.1},
           "copy": {"class": "copy", "from": "lstm", "L2": 3.0},  # no parameters: nothing to add
           "output": {"class": "softmax", "loss": "ce", "from": "copy"}}
    model = build_model(net, input_dim=3, input_sparse=False, target_dims={"classes": 3})
    x, lengths, y = batch(np.random.RandomState(2), [4, 2], 3)
    losses = model.compute_losses(model(x, lengths), {"classes": y}, {"classes": lengths})
    v = {k: w.numpy().astype(np.float64) for k, w in model.named_variables().items()}
    expected = 0.01 * ((v["hidden/W"] ** 2).sum() + (v["hidden/b"] ** 2).sum()) + 0.1 * (
        (v["lstm/W"] ** 2).sum() + (v["lstm/b"] ** 2).sum())
    np.testing.assert_allclose(float(losses.regularizer), expected, rtol=1e-5)
    plain = build_model({"output": {"class": "softmax", "loss": "ce"}}, input_dim=3, input_sparse=False,
                        target_dims={"classes": 3})
    assert plain.compute_losses(plain(x, lengths), {"classes": y}, {"classes": lengths}).regularizer == 0.0


@pytest.mark.parametrize("loss_opts", [{}, {"label_smoothing": 0.1}, {"focal_loss_factor": 2.0},
                                       {"label_smoothing": 0.2, "focal_loss_factor": 1.5, "scale": 0.5,
                                        "use_fused": False}])
def test_ce_loss_options_follow_returnns_formulas(loss_opts):
    net = {"output": {"class": "softmax", "loss": "ce", "loss_opts": loss_opts}}
    model = build_model(net, input_dim=3, input_sparse=False, target_dims={"classes": 3})
    x, lengths, y = batch(np.random.RandomState(3), [5, 3], 3)
    outputs = model(x, lengths)
    losses = model.compute_losses(outputs, {"classes": y}, {"classes": lengths})
    p = softmax(outputs["output:logits"].numpy().astype(np.float64))
    s, g, v = loss_opts.get("label_smoothing", 0.0), loss_opts.get("focal_loss_factor", 0.0), 3
    expected = 0.0
    for bi, n in enumerate(lengths):
        for t in range(n):
            q = np.full(v, s / (v - 1))
            q[y[bi, t]] = 1 - s
            entropy = -sum(qi * np.log(qi) for qi in q if qi > 0)
            frame = -(q * np.log(p[bi, t])).sum() - entropy
            expected += frame * (1 - p[bi, t, y[bi, t]]) ** g
    expected *= loss_opts.get("scale", 1.0)
    np.testing.assert_allclose(float(losses.loss), expected / loss_opts.get("scale", 1.0), rtol=1e-5)
    np.testing.assert_allclose(float(losses.objective), expected, rtol=1e-5)


@pytest.mark.parametrize("layer, message", [
    ({"loss": "ce", "loss_opts": {"label_smoothing_gaussian": True}},
     r"loss_opts \['label_smoothing_gaussian'\]"),
    ({"loss": "ce", "loss_opts": {"label_smoothing": 1.0}}, r"label_smoothing must be a number in \[0, 1\)"),
    ({"loss": "ce", "loss_scale": 2.0, "loss_opts": {"scale": 3.0}}, "disagree"),
    ({"loss_opts": {"focal_loss_factor": 1.0}}, "has no loss"),
    ({"loss": "ce", "L2": -1.0}, "L2 must be a number >= 0"),
])
def test_bad_loss_options_are_clear_errors(layer, message):
    with pytest.raises(ConfigError, match=message):
        build_model({"output": {"class": "softmax", **layer}}, input_dim=3, input_sparse=False,
                    target_dims={"classes": 3})


def numpy_chunks(x, lengths, size, step):
    """RETURNN's Chunking op, loop by loop: (T, B, D) -> (size, B * n, D), chunk k of b in column
    b * n + k."""
    n_time, n_batch, dim = x.shape
    n = max(n_time - size + step - 1, 0) // step + 1
    out, out_len = np.zeros((size, n_batch * n, dim)), np.zeros(n_batch * n, int)
    for b in range(n_batch):
        for k in range(n):
            for t in range(size):
                if k * step + t < lengths[b]:
                    out[t, b * n + k] = x[k * step + t, b]
                    out_len[b * n + k] += 1
    return out, out_len


def numpy_unchunk(y, chunk_lengths, size, step, n_time, n_batch):
    n = y.shape[1] // n_batch
    out = np.zeros((n_time, n_batch, y.shape[2]))
    for b in range(n_batch):
        for t in range(n_time):
            frames = [y[t - k * step, b * n + k] for k in range(n)
                      if 0 <= t - k * step < size and t - k * step < chunk_lengths[b * n + k]]
            if frames:
                out[t, b] = np.mean(frames, axis=0)
    return out


@pytest.mark.parametrize("size, step, lengths", [(4, 2, [9, 5, 1]), (5, 5, [7, 10]), (6, 4, [3, 3]),
                                                 (4, 3, [0, 8])])
def test_time_chunking_and_unchunking_are_returnns_ops(size, step, lengths):
    rng = np.random.RandomState(4)
    x = rng.randn(max(max(lengths), 1), len(lengths), 2).astype("float32")
    chunks, chunk_lengths = chunk_time(tf.constant(x), tf.constant(lengths), size, step)
    ref, ref_lengths = numpy_chunks(x, lengths, size, step)
    np.testing.assert_allclose(chunks.numpy(), ref, rtol=1e-6)
    np.testing.assert_array_equal(chunk_lengths.numpy(), ref_lengths)
    y = rng.randn(*ref.shape).astype("float32")  # chunks that disagree where they overlap
    back = unchunk_time(tf.constant(y), chunk_lengths, size, step, tf.shape(x)[0])
    np.testing.assert_allclose(back.numpy(), numpy_unchunk(y, ref_lengths, size, step, *x.shape[:2]),
                               rtol=1e-5)
    # the gradient of chunking sums over the chunks that copied a frame
    weights = rng.randn(*ref.shape).astype("float32")
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        total = tf.reduce_sum(chunk_time(xt, tf.constant(lengths), size, step)[0] * weights)
    grad, expected = tf.convert_to_tensor(tape.gradient(total, xt)).numpy(), np.zeros_like(x)
    n = ref.shape[1] // len(lengths)
    for b in range(len(lengths)):
        for k in range(n):
            for t in range(size):
                if k * step + t < lengths[b]:
                    expected[k * step + t, b] += weights[t, b * n + k]
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


CHUNKED_BLSTM = {  # RETURNN's demo-tf-chunking-blstm.12ax.config network, smaller
    "in": {"class": "time_chunking", "chunk_size": 6, "chunk_step": 3, "from": "data"},
    "fw0": {"class": "rec", "unit": "BasicLSTM", "n_out": 4, "from": "in"},
    "bw0": {"class": "rec", "unit": "BasicLSTM", "n_out": 4, "direction": -1, "from": "in"},
    "out": {"class": "time_unchunking", "chunking_layer": "in", "from": ["fw0", "bw0"]},
    "output": {"class": "softmax", "loss": "ce", "from": "out"},
}


def test_chunked_blstm_network_runs_the_lstm_on_the_chunks():
    model = build_model(CHUNKED_BLSTM, input_dim=3, input_sparse=False, target_dims={"classes": 3})
    assert model.recurrent
    x, lengths, y = batch(np.random.RandomState(5), [10, 4], 3)
    outputs = model(x, lengths)
    assert outputs["output"].shape == (2, 10, 3)
    # the same LSTM run on each chunk on its own, unchunked by hand
    chunks, chunk_lengths = chunk_time(tf.constant(x.transpose(1, 0, 2)), tf.constant(lengths), 6, 3)
    lstm = model.layers["fw0"]
    fw = lstm(chunks, chunk_lengths, False)
    expected = unchunk_time(fw, chunk_lengths, 6, 3, tf.constant(10)).numpy().transpose(1, 0, 2)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(outputs["out"][b, :n, :4], expected[b, :n], rtol=1e-5, atol=1e-6)
    losses = model.compute_losses(outputs, {"classes": y}, {"classes": lengths})
    assert float(losses.num_frames) == 14


@pytest.mark.parametrize("edit, message", [
    ({"output": {"class": "softmax", "loss": "ce", "from": "fw0"}}, "add a time_unchunking layer"),
    ({"out": {"class": "time_unchunking", "chunking_layer": "fw0", "from": "fw0"}},
     "must be the time_chunking layer"),
    ({"out": {"class": "time_unchunking", "chunking_layer": "in", "from": ["fw0", "data"]}},
     "different time axes"),
    ({"in": {"class": "time_chunking", "chunk_size": 0, "chunk_step": 3}},
     "'chunk_size' must be a positive int"),
])
def test_time_chunking_mistakes_are_clear_errors(edit, message):
    with pytest.raises(ConfigError, match=message):
        build_model({**CHUNKED_BLSTM, **edit}, input_dim=3, input_sparse=False, target_dims={"classes": 3})


def test_dropout_is_a_function_of_the_seed():
    net = {"output": {"class": "linear", "n_out": 4, "dropout": 0.5}}
    model = build_model(net, input_dim=6, input_sparse=False, target_dims={})
    x = np.ones((2, 5, 6), np.float32)
    lengths = np.array([5, 5], np.int32)
    run = [model(x, lengths, training=True, seed=tf.constant(s, tf.int64))["output"].numpy()
           for s in ([1, 2], [1, 2], [1, 3])]
    np.testing.assert_array_equal(run[0], run[1])
    assert not np.array_equal(run[0], run[2])
    # no dropout in eval
    np.testing.assert_array_equal(model(x, lengths)["output"], model(x, lengths)["output"])
