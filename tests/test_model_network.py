"""The network dict -> model: layer math against numpy, masking, losses, determinism, config errors."""

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.model import build_model
from engine.runtime.errors import ConfigError, DataError

pytestmark = pytest.mark.tf_latest


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def ref_lstm(x, w, b):
    """Plain numpy LSTM over one sequence x (T, F); gates in the kernel's column order i, c, f, o."""
    n = b.shape[0] // 4
    h, c, out = np.zeros(n), np.zeros(n), []
    for frame in x:
        z = np.concatenate([frame, h]) @ w + b
        i, ci, f, o = z[:n], z[n : 2 * n], z[2 * n : 3 * n], z[3 * n :]
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(ci)
        h = sigmoid(o) * np.tanh(c)
        out.append(h)
    return np.array(out)


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def padded_batch(rng, lengths, dim, pad_value=0.0):
    x = rng.randn(len(lengths), max(lengths), dim).astype("float32")
    for b, n in enumerate(lengths):
        x[b, n:] = pad_value
    return x


BLSTM = {
    "fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 6},
    "bw": {"class": "rec", "unit": "LSTMBlock", "n_out": 5, "direction": -1, "from": "data"},
    "output": {"class": "softmax", "loss": "ce", "from": ["fw", "bw"]},
}


def test_rec_matches_reference_lstm_both_directions():
    rng = np.random.RandomState(0)
    model = build_model(BLSTM, input_dim=4, input_sparse=False, target_dims={"classes": 3})
    lengths = [7, 3, 5]
    x = padded_batch(rng, lengths, 4)
    out = model(x, np.array(lengths, np.int32))
    weights = {k: v.numpy() for k, v in model.named_variables().items()}
    for b, n in enumerate(lengths):
        fw = ref_lstm(x[b, :n], weights["fw/W"], weights["fw/b"])
        bw = ref_lstm(x[b, :n][::-1], weights["bw/W"], weights["bw/b"])[::-1]
        np.testing.assert_allclose(out["fw"][b, :n], fw, atol=1e-5)
        np.testing.assert_allclose(out["bw"][b, :n], bw, atol=1e-5)
        logits = np.concatenate([fw, bw], -1) @ weights["output/W"] + weights["output/b"]
        np.testing.assert_allclose(out["output:logits"][b, :n], logits, atol=1e-5)
        np.testing.assert_allclose(out["output"][b, :n], np.exp(log_softmax(logits)), atol=1e-5)
    assert out["output"].shape == (3, 7, 3) and out["fw"].shape == (3, 7, 6) and out["bw"].shape == (3, 7, 5)


def test_padding_never_reaches_valid_frames_loss_or_gradients():
    rng = np.random.RandomState(1)
    model = build_model(BLSTM, input_dim=4, input_sparse=False, target_dims={"classes": 3})
    lengths = np.array([6, 2, 4], np.int32)
    clean = padded_batch(rng, lengths, 4)
    dirty = clean.copy()
    y_clean = rng.randint(0, 3, size=(3, 6)).astype("int32")
    y_dirty = y_clean.copy()
    for b, n in enumerate(lengths):
        dirty[b, n:] = rng.randn(6 - n, 4) * 1e4
        y_dirty[b, n:] = 999  # out of range: must not even reach the loss op
    dirty[1, 3] = np.nan

    def loss_and_grads(x, y):
        with tf.GradientTape() as tape:
            out = model(x, lengths, training=False)
            res = model.compute_losses(out, {"classes": y}, {"classes": lengths})
        return out, res, tape.gradient(res.objective, model.trainable_variables)

    out_a, res_a, grads_a = loss_and_grads(clean, y_clean)
    out_b, res_b, grads_b = loss_and_grads(dirty, y_dirty)
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(out_a["output"][b, :n], out_b["output"][b, :n])
    assert res_a.loss.numpy() == res_b.loss.numpy() and np.isfinite(res_b.loss.numpy())
    for ga, gb in zip(grads_a, grads_b):
        np.testing.assert_array_equal(ga.numpy(), gb.numpy())
    # A sequence alone gives the same outputs as inside a padded batch.
    alone = model(clean[1:2, :2], lengths[1:2])
    np.testing.assert_allclose(alone["output"][0], out_a["output"][1, :2], atol=1e-6)


def test_losses_equal_manual_computation_with_two_loss_layers():
    rng = np.random.RandomState(2)
    net = {
        "hidden": {"class": "linear", "activation": "tanh", "n_out": 7},
        "aux": {"class": "softmax", "loss": "ce", "target": "phones", "loss_scale": 0.3, "from": "hidden"},
        "output": {"class": "softmax", "loss": "ce", "from": "hidden"},
    }
    model = build_model(net, input_dim=3, input_sparse=False, target_dims={"classes": 4, "phones": 5})
    lengths = np.array([5, 3], np.int32)
    x = padded_batch(rng, lengths, 3)
    targets = {
        "classes": rng.randint(0, 4, (2, 5)).astype("int32"),
        "phones": rng.randint(0, 5, (2, 5)).astype("int32"),
    }
    phone_lengths = np.array([4, 3], np.int32)
    out = model(x, lengths)
    res = model.compute_losses(out, targets, {"classes": lengths, "phones": phone_lengths})

    def manual(name, target, lens):
        lp = log_softmax(out[f"{name}:logits"].numpy())
        ce = err = 0.0
        for b, n in enumerate(lens):
            labels = targets[target][b, :n]
            ce -= lp[b, np.arange(n), labels].sum()
            err += (lp[b, :n].argmax(-1) != labels).sum()
        return ce, err, float(sum(lens))

    ce_out, err_out, n_out = manual("output", "classes", lengths)
    ce_aux, _, n_aux = manual("aux", "phones", phone_lengths)
    np.testing.assert_allclose(res.loss, ce_out, rtol=1e-5)  # the main layer's, unscaled (RETURNN's score)
    assert res.error.numpy() == err_out and res.num_frames.numpy() == n_out == 8
    np.testing.assert_allclose(res.objective, ce_out + 0.3 * ce_aux, rtol=1e-5)  # RETURNN's: loss sums
    net["aux"]["loss_opts"] = {"use_normalized_loss": True}
    normalized = build_model(net, input_dim=3, input_sparse=False, target_dims={"classes": 4, "phones": 5})
    for mine, theirs in zip(normalized.variables, model.variables):
        mine.assign(theirs)
    res = normalized.compute_losses(out, targets, {"classes": lengths, "phones": phone_lengths})
    np.testing.assert_allclose(res.objective, ce_out + 0.3 * ce_aux / n_aux, rtol=1e-5)
    with pytest.raises(DataError, match="'aux' needs target 'phones'"):
        model.compute_losses(out, {"classes": targets["classes"]}, {"classes": lengths})


def test_linear_copy_dropout_and_sparse_input():
    rng = np.random.RandomState(3)
    net = {
        "emb": {"class": "linear", "activation": None, "n_out": 4, "with_bias": False},  # embedding lookup
        "hot": {
            "class": "linear",
            "activation": "relu",
            "n_out": 3,
            "from": ["data", "emb"],
        },  # one-hot + concat
        "both": {"class": "copy", "from": ["emb", "hot"]},
        "drop": {"class": "dropout", "dropout": 0.5, "from": "both"},
        "output": {"class": "softmax", "loss": "ce", "from": "drop"},
    }
    model = build_model(net, input_dim=6, input_sparse=True, target_dims={"classes": 2})
    assert list(model.named_variables()) == ["emb/W", "hot/W", "hot/b", "output/W", "output/b"]
    ids = rng.randint(0, 6, (2, 5)).astype("int32")
    lengths = np.array([5, 5], np.int32)
    out = model(ids, lengths, training=False)
    w = {k: v.numpy() for k, v in model.named_variables().items()}
    emb = w["emb/W"][ids]
    hot = np.maximum(np.concatenate([np.eye(6)[ids], emb], -1) @ w["hot/W"] + w["hot/b"], 0)
    np.testing.assert_allclose(out["emb"], emb, atol=1e-6)
    np.testing.assert_allclose(out["hot"], hot, atol=1e-5)
    np.testing.assert_allclose(out["drop"], np.concatenate([emb, hot], -1), atol=1e-5)
    # Dropout only in training: eval is deterministic, training zeroes about half and rescales the rest.
    np.testing.assert_array_equal(model(ids, lengths)["drop"], out["drop"])
    dropped = model(ids, lengths, training=True)["drop"].numpy()
    kept = dropped != 0
    assert 0.2 < kept.mean() < 0.8
    np.testing.assert_allclose(dropped[kept], 2 * out["drop"].numpy()[kept], rtol=1e-5)
    # The embedding's gradient is dense (no IndexedSlices), like every other weight's.
    with tf.GradientTape() as tape:
        res = model.compute_losses(
            model(ids, lengths, training=True), {"classes": ids % 2}, {"classes": lengths}
        )
    grads = tape.gradient(res.objective, model.trainable_variables)
    assert all(isinstance(g, tf.Tensor) for g in grads)


def test_variables_are_deterministic_and_only_needed_layers_are_built():
    net = dict(BLSTM, unused={"class": "linear", "n_out": 3, "from": "fw"})
    a = build_model(net, input_dim=4, input_sparse=False, target_dims={"classes": 3}, random_seed=7)
    b = build_model(
        Config({"network": net, "random_seed": 7}),
        input_dim=4,
        input_sparse=False,
        target_dims={"classes": 3},
    )
    c = build_model(net, input_dim=4, input_sparse=False, target_dims={"classes": 3}, random_seed=8)
    assert list(a.named_variables()) == ["fw/W", "fw/b", "bw/W", "bw/b", "output/W", "output/b"]
    for (name, va), vb, vc in zip(a.named_variables().items(), b.variables, c.variables):
        np.testing.assert_array_equal(va.numpy(), vb.numpy())
        if name.endswith("/W"):
            assert not np.array_equal(va.numpy(), vc.numpy())
    assert len(a.trainable_variables) == 6 and "unused" not in a(np.zeros((1, 2, 4), "float32"), [2])


def test_get_network_hook_and_missing_model():
    calls = []

    def get_network(epoch, **kwargs):
        calls.append(epoch)
        return {"output": {"class": "softmax", "loss": "ce"}}

    model = build_model(
        Config({"get_network": get_network}),
        input_dim=3,
        input_sparse=False,
        target_dims={"classes": 2},
        epoch=4,
    )
    assert calls == [4] and list(model.named_variables()) == ["output/W", "output/b"]
    with pytest.raises(ConfigError, match="defines no model"):
        build_model(Config({}), input_dim=3, input_sparse=False, target_dims={"classes": 2})


def test_an_info_entry_is_skipped_as_in_returnn():
    network = {"#info": {"author": "x"}, "output": {"class": "softmax", "loss": "ce"}}
    model = build_model(network, input_dim=3, input_sparse=False, target_dims={"classes": 2})
    assert list(model.layers) == ["output"]


def test_target_config_key_is_the_default_target_of_loss_layers():
    network = {"hidden": {"class": "linear", "n_out": 4, "activation": "tanh"},
               "output": {"class": "softmax", "loss": "ce", "from": "hidden"},
               "aux": {"class": "softmax", "loss": "ce", "target": "classes", "from": "hidden"}}
    dims = dict(input_dim=3, input_sparse=False, target_dims={"bpe": 5, "classes": 2})
    for config in (Config({"network": network, "target": "bpe"}),
                   Config({"get_network": lambda epoch, **_: network, "target": "bpe"})):
        model = build_model(config, **dims)
        assert (model.layers["output"].target, model.layers["aux"].target) == ("bpe", "classes")
        assert model.layers["output"].n_out == 5 and "target" not in network["output"]
    x = np.random.RandomState(0).standard_normal((2, 6, 3)).astype("float32")
    outputs = model(x, np.array([6, 4]))
    labels = {"bpe": np.array([[1, 4, 0, 2, 3, 1], [0, 0, 1, 1, 0, 0]]), "classes": np.zeros((2, 6), int)}
    lengths = {"bpe": np.array([6, 4]), "classes": np.array([6, 4])}
    result = model.compute_losses(outputs, labels, lengths)
    logits = outputs["output:logits"].numpy()
    expected = -sum(tf.nn.log_softmax(logits[b, t]).numpy()[labels["bpe"][b, t]]
                    for b in range(2) for t in range(lengths["bpe"][b]))
    assert model.loss_targets == {"bpe", "classes"} and np.isclose(float(result.loss), expected, rtol=1e-5)

    def get_model(**_):
        return tf.keras.Sequential([tf.keras.layers.Dense(5)])

    with pytest.raises(ConfigError, match="'target' is 'bpe', but the model comes from get_model"):
        build_model(Config({"get_model": get_model, "target": "bpe"}), **dims)


@pytest.mark.parametrize(
    "network, message",
    [
        ({"output": {"class": "softmax", "loss": "ce", "from": "hidden"}}, r"'output'.*names 'hidden'"),
        ({"out": {"class": "softmax"}}, r"no layer called 'output'"),
        ({"output": {"class": "gating", "from": "data"}},
         r"'output': 'activation' is required for class 'gating'"),
        ({"h": {"class": "linear", "n_out": 5},
          "output": {"class": "gating", "activation": "tanh", "from": "h"}},
         r"'output': gating splits .* dim 5, an odd number"),
        ({"output": {"class": "reduce_out", "mode": "max", "num_pieces": 3}},
         r"'output': its input's dim 4 is not a multiple of num_pieces 3"),
        ({"output": {"class": "reduce_out", "mode": "min", "num_pieces": 2}},
         r"reduce_out mode 'min' is not"),
        ({"output": {"class": "slice", "axis": "T", "slice_start": 1}},
         r"'output': slice along axis 'T' is not implemented; .* feature axis only"),
        ({"output": {"class": "slice", "axis": "F", "slice_start": 4}},
         r"the slice \[4, None, None\] .* is empty"),
        ({"output": {"class": "slice", "axis": "F", "slice_start": 1, "n_out": 2}}, r"n_out 2 must be 3"),
        ({"#config": {"batch_size": 3}, "output": {"class": "softmax", "n_out": 3}},
         r"Network entry '#config' \(config keys that hold while this network trains.*not implemented"),
        ({"output": {"class": "gather_nd"}},
         r"'output': class 'gather_nd' is a RETURNN layer class this engine does not implement"),
        ({"output": {"class": "sofmax", "n_out": 3}}, r"'output': unknown class 'sofmax' \(did you mean"),
        (
            {
                "a": {"class": "linear", "n_out": 2, "from": "b"},
                "b": {"class": "linear", "n_out": 2, "from": "a"},
                "output": {"class": "softmax", "from": "a"},
            },
            r"cycle: a -> b -> a",
        ),
        (
            {"h": {"class": "linear"}, "output": {"class": "softmax", "from": "h"}},
            r"'h': 'n_out' must be a positive int",
        ),
        (
            {
                "h": {"class": "linear", "n_out": 2, "activation": "swish9"},
                "output": {"class": "softmax", "from": "h"},
            },
            r"'h': unknown activation 'swish9'",
        ),
        (
            {"h": {"class": "rec", "n_out": 2, "unit": "gru"}, "output": {"class": "softmax", "from": "h"}},
            r"'h': unit 'gru' is not supported",
        ),
        (
            {"h": {"class": "rec", "n_out": 2, "direction": 0}, "output": {"class": "softmax", "from": "h"}},
            r"'h': direction must be 1 or -1",
        ),
        ({"output": {"class": "softmax", "loss": "mse"}}, r"'output': loss 'mse' is not supported"),
        ({"output": {"class": "softmax", "loss": "ce", "target": "words"}}, r"'output'.*'words'"),
        (
            {"output": {"class": "softmax", "loss": "ce", "n_out": 9}},
            r"'output': n_out 9 does not match the dim 3",
        ),
        (
            {"output": {"class": "softmax", "loss": "ce", "loss_scale": "1"}},
            r"'output': loss_scale must be a number",
        ),
        ({"output": {"class": "softmax", "dropout": 1.5}}, r"'output': dropout must be a float in \[0, 1\)"),
        ({"output": {"class": "softmax", "loss": "ce", "use_transposed_weights": 1}},
         r"'output': use_transposed_weights must be True or False"),
        ({"output": {"class": "softmax", "from": []}}, r"'output': 'from' must be"),
        ({"data": {"class": "copy"}, "output": {"class": "softmax"}}, r"name 'data' is not allowed"),
        ([1, 2], r"'network' must be a non-empty dict"),
    ],
)
def test_network_errors_name_the_layer(network, message):
    with pytest.raises(ConfigError, match=message):
        build_model(network, input_dim=4, input_sparse=False, target_dims={"classes": 3})


LM = {"input": {"class": "linear", "n_out": 4, "activation": "identity", "from": "data:delayed"},
      "lstm0": {"class": "rec", "unit": "lstm", "n_out": 5, "from": "input"},
      "mix": {"class": "linear", "n_out": 3, "activation": "tanh", "from": ["lstm0", "data:delayed"]},
      "output": {"class": "softmax", "loss": "ce", "target": "data", "from": "mix"}}


def test_a_sparse_stream_as_source_is_that_stream_as_the_input():
    """RETURNN's LM setups read 'data:delayed' and train on 'data': the same loss and gradients as the
    network that reads the delayed words as 'data' and trains on them as 'classes'."""
    renamed = {**LM, "input": {**LM["input"], "from": "data"},
               "mix": {**LM["mix"], "from": ["lstm0", "data"]},
               "output": {**LM["output"], "target": "classes"}}
    lm = build_model(LM, input_dim=7, input_sparse=True, target_dims={"delayed": 7})
    plain = build_model(renamed, input_dim=7, input_sparse=True, target_dims={"classes": 7})
    assert lm.input_streams == {"delayed"} and lm.loss_targets == {"data"}
    rng = np.random.RandomState(0)
    lengths = np.array([5, 3], np.int32)
    words = rng.randint(1, 7, (2, 5)).astype("int32")
    delayed = np.concatenate([np.zeros((2, 1), "int32"), words[:, :-1]], 1)
    words[1, 3:], delayed[1, 3:] = 99, -5  # padding may hold anything
    for name, var in lm.named_variables().items():
        var.assign(rng.uniform(-0.5, 0.5, var.shape))
        plain.named_variables()[name].assign(var)
    losses, grads = [], []
    for model, call, targets in (
            (lm, dict(data=words, streams={"data": words, "delayed": delayed},
                      stream_lengths={"data": lengths, "delayed": lengths}), {"data": words}),
            (plain, dict(data=delayed), {"classes": words})):
        with tf.GradientTape() as tape:
            result = model.compute_losses(model(lengths=lengths, training=True, **call), targets,
                                          {k: lengths for k in targets})
        losses.append(float(result.objective))
        variables = list(model.named_variables().values())
        grads.append([g.numpy() for g in tape.gradient(result.objective, variables)])
    assert losses[0] == losses[1]
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError, match=r"read the data stream\(s\) \['delayed'\].*forward and search"):
        lm.output_lengths(lengths)
    with pytest.raises(ConfigError, match=r"read the data stream\(s\) \['delayed'\]"):
        lm(words, lengths)


@pytest.mark.parametrize("network, message", [
    ({"output": {"class": "softmax", "loss": "ce", "target": "data", "from": "data:words"}},
     r"'output': 'from' names 'data:words', but the data has no sparse stream 'words' \(its sparse streams: "
     r"data, data:delayed\)"),
    ({"h": {"class": "conv", "filter_size": [3], "n_out": 2, "padding": "same", "from": "data:delayed"},
      "output": {"class": "softmax", "loss": "ce", "target": "data", "from": "h"}},
     r"'h': RETURNN's conv layer takes dense input, but 'data:delayed' is sparse"),
    ({"output": {"class": "softmax", "loss": "ce", "target": "data", "from": "data:"}},
     r"'output': 'from' names 'data:', which is not a layer"),
])
def test_stream_sources_are_checked(network, message):
    with pytest.raises(ConfigError, match=message):
        build_model(network, input_dim=7, input_sparse=True, target_dims={"delayed": 7})


def test_a_loss_this_engine_lacks_is_refused_by_the_check():
    """The check parses without building layers: it must still refuse what building would (RETURNN's LM
    setups' sampling_loss passed the check and failed only at the first step)."""
    from engine.model.spec import parse_network

    sampled = {"class": "softmax", "loss": "sampling_loss", "target": "classes", "from": "data"}
    with pytest.raises(ConfigError, match=r"'output': loss 'sampling_loss' is not supported on a softmax "
                                          r"layer; supported: 'ce', 'ctc'"):
        parse_network({"output": sampled})
    unit = {"output": {**sampled, "from": "data:source"}}
    with pytest.raises(ConfigError, match=r"unit layer 'output': loss 'sampling_loss' is not supported"):
        parse_network({"rnn": {"class": "rec", "unit": unit, "from": "data"},
                       "output": {"class": "copy", "from": "rnn"}})
    with pytest.raises(ConfigError, match=r"'output': loss 'ce' is not supported on a copy layer; supported: "
                                          r"'edit_distance'"):
        parse_network({"output": {"class": "copy", "loss": "ce", "from": "data"}})
    native = {"class": "softmax", "loss": "ctc", "loss_opts": {"use_native": True}, "from": "data"}
    with pytest.raises(ConfigError, match=r"'output': loss_opts use_native=True needs beam_width 1: "
                                          r"RETURNN's label error with its native CTC decodes greedily"):
        parse_network({"output": native})
    flagged = {"class": "softmax", "loss": "ce", "loss_only_on_non_search": "yes", "from": "data"}
    with pytest.raises(ConfigError, match=r"'output': loss_only_on_non_search must be True or False"):
        parse_network({"output": flagged})
    parse_network({"output": {**flagged, "loss_only_on_non_search": True}})
