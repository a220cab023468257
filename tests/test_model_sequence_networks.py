"""Networks of sequence layers (conv, pool, layer_norm, positional_encoding, self_attention, rec): built from
the config, gradients reach every parameter, a sequence alone equals its row of a padded batch, parameters
are deterministic with stable names, and bad options are refused naming the layer. The layers one by one:
test_model_sequence_layers.py."""
import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.runtime.errors import ConfigError

pytestmark = pytest.mark.tf_latest


def transformer(n_out=3):
    return {
        "in": {"class": "linear", "n_out": 8, "activation": None},
        "pos": {"class": "positional_encoding", "add_to_input": True, "from": "in"},
        "att": {"class": "self_attention", "num_heads": 2, "total_key_dim": 8, "n_out": 8,
                "attention_dropout": 0.1, "from": "pos"},
        "res": {"class": "combine", "kind": "add", "from": ["att", "pos"]},
        "norm": {"class": "layer_norm", "from": "res"},
        "ff": {"class": "linear", "n_out": 8, "activation": "gelu", "from": "norm"},
        "output": {"class": "softmax", "loss": "ce", "from": "ff", "n_out": n_out},
    }


def blstm_pool():
    return {
        "fw1": {"class": "rec", "unit": "nativelstm2", "n_out": 4},
        "bw1": {"class": "rec", "unit": "nativelstm2", "n_out": 4, "direction": -1},
        "conv": {"class": "conv", "filter_size": (3,), "padding": "same", "n_out": 5, "activation": "relu",
                 "with_bias": True, "from": ["fw1", "bw1"]},
        "pool": {"class": "pool", "mode": "max", "pool_size": (2,), "from": "conv"},
        "fw2": {"class": "rec", "n_out": 4, "from": "pool"},
        "bw2": {"class": "rec", "n_out": 4, "direction": -1, "from": "pool"},
        "act": {"class": "activation", "activation": "swish", "from": ["fw2", "bw2"]},
        "output": {"class": "softmax", "n_out": 3, "from": "act"},
    }


@pytest.mark.parametrize("network,out_len", [(transformer, lambda n: n), (blstm_pool, lambda n: n // 2)])
def test_encoders_build_and_gradients_reach_every_parameter(network, out_len):
    rng = np.random.RandomState(9)
    lengths = np.array([7, 4, 5], np.int32)
    data = rng.randn(3, 7, 3).astype("float32")
    model = build_model(network(), input_dim=3, input_sparse=False, target_dims={"classes": 3})
    assert model.recurrent
    with tf.GradientTape() as tape:
        out = model(data, lengths, training=True, seed=tf.constant([4, 5], tf.int64))
        out_lengths = out["output:lengths"]
        mask = tf.sequence_mask(out_lengths, tf.shape(out["output"])[1], tf.float32)[..., None]
        loss = tf.reduce_sum(tf.sin(3.0 * out["output:logits"]) * mask)
    assert out_lengths.dtype == tf.int32
    assert out_lengths.numpy().tolist() == [out_len(int(n)) for n in lengths]
    assert out["output"].shape == (3, out_len(7), 3)
    for name in model.layers:
        assert out[f"{name}:lengths"].shape == (3,)
    variables = model.named_variables()
    grads = tape.gradient(loss, list(variables.values()))
    for (name, var), grad in zip(variables.items(), grads):
        assert grad is not None, name
        assert np.all(np.isfinite(grad.numpy())), name
        assert np.any(grad.numpy() != 0), name
    names = set(variables)
    assert {"att/QKV", "norm/scale", "norm/bias"} <= names or {"conv/W", "conv/bias"} <= names


def test_network_sequences_alone_equal_the_padded_batch():
    rng = np.random.RandomState(10)
    lengths = np.array([7, 3, 5], np.int32)
    data = rng.randn(3, 7, 3).astype("float32")
    for network in (transformer(), blstm_pool()):
        model = build_model(network, input_dim=3, input_sparse=False, target_dims={"classes": 3})
        out = model(data, lengths)
        for b, n in enumerate(lengths):
            alone = model(data[b:b + 1, :n], lengths[b:b + 1])
            m = int(out["output:lengths"][b])
            assert int(alone["output:lengths"][0]) == m
            np.testing.assert_allclose(alone["output"][0].numpy(), out["output"][b, :m].numpy(),
                                       rtol=1e-5, atol=1e-6)


def test_network_parameters_are_deterministic_with_stable_names():
    build = lambda: build_model(transformer(), input_dim=3, input_sparse=False,  # noqa: E731
                                target_dims={"classes": 3}, random_seed=5)
    a, b = build().named_variables(), build().named_variables()
    assert list(a) == ["in/W", "in/b", "att/QKV", "norm/scale", "norm/bias", "ff/W", "ff/b", "output/W",
                       "output/b"]
    for name in a:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())


# ----- errors -----

def base(layer, **extra):
    return {"l": layer, "output": {"class": "copy", "from": "l"}, **extra}


@pytest.mark.parametrize("network,message", [
    (base({"class": "conv", "filter_size": (3, 3), "padding": "same", "n_out": 2}),
     r"'l': a window over two axes needs an input \(T, B, S, C\) with one static axis S; its input is "
     r"\(T, B, F=3\)"),
    (base({"class": "conv", "filter_size": (3, 3, 3), "padding": "same", "n_out": 2}),
     r"'l': 'filter_size' must be a tuple of one positive int like \(3,\).*3-D windows are not implemented"),
    (base({"class": "conv", "filter_size": 3, "padding": "same", "n_out": 2}), r"'l': 'filter_size' must be"),
    (base({"class": "conv", "filter_size": (3,), "n_out": 2}), r"'l': 'padding' is required"),
    (base({"class": "conv", "filter_size": (3,), "padding": "causal", "n_out": 2}),
     r"'l': 'padding' must be one of 'same', 'valid', got 'causal'"),
    (base({"class": "conv", "filter_size": (3,), "padding": "same", "n_out": 2, "strides": (1, 2)}),
     r"'l': 'strides' must be an int or a tuple of 1 positive int like \(3,\)"),
    (base({"class": "conv", "filter_size": (0,), "padding": "same", "n_out": 2}),
     r"'l': 'filter_size' must be a positive int"),
    (base({"class": "conv", "filter_size": (3,), "padding": "same"}), r"'l': 'n_out' must be a positive int"),
    (base({"class": "conv", "filter_size": (3,), "padding": "same", "n_out": 2, "groups": 2}),
     r"'l': 'groups' must be 1 or the input dim 3 \(depthwise"),
    (base({"class": "pool", "pool_size": (2,)}), r"'l': 'mode' is required"),
    (base({"class": "pool", "mode": "min", "pool_size": (2,)}), r"'l': 'mode' must be one of 'max', 'avg'"),
    (base({"class": "self_attention", "num_heads": 3, "total_key_dim": 8, "n_out": 6}),
     r"'l': total_key_dim 8 is not divisible by num_heads 3"),
    (base({"class": "self_attention", "num_heads": 4, "total_key_dim": 8, "n_out": 6}),
     r"'l': n_out 6 is not divisible by num_heads 4"),
    (base({"class": "self_attention", "num_heads": 2, "total_key_dim": 8, "n_out": 6,
           "attention_dropout": 1.5}), r"'l': attention_dropout must be a float in \[0, 1\)"),
    ({"a": {"class": "linear", "n_out": 3}, "b": {"class": "linear", "n_out": 4},
      "output": {"class": "combine", "kind": "add", "from": ["a", "b"]}},
     r"'output': combine needs sources of one feature dim, got 'a' 3, 'b' 4"),
    ({"a": {"class": "linear", "n_out": 3},
      "output": {"class": "combine", "kind": "logaddexp", "from": ["a", "data"]}},
     r"'output': combine kind 'logaddexp' is not supported"),
    ({"a": {"class": "linear", "n_out": 3},
      "output": {"class": "combine", "kind": "add", "from": ["a", "data"], "dropout": 0.1}},
     r"'output': RETURNN's combine layer takes no 'dropout'"),
    ({"p": {"class": "pool", "mode": "max", "pool_size": (2,)},
      "output": {"class": "combine", "kind": "add", "from": ["p", "data"]}},
     r"'output': its sources \['p', 'data'\] are on different time axes"),
    ({"p": {"class": "pool", "mode": "max", "pool_size": (2,)},
      "output": {"class": "softmax", "loss": "ce", "from": "p"}},
     r"'output' has a frame-wise loss .* layer 'p' changes the number of frames"),
    ({"ch": {"class": "time_chunking", "chunk_size": 4, "chunk_step": 2},
      "p": {"class": "pool", "mode": "avg", "pool_size": (2,), "from": "ch"},
      "un": {"class": "time_unchunking", "chunking_layer": "ch", "from": "p"},
      "output": {"class": "copy", "from": "un"}},
     r"'un': its frames went through 'p' after the chunking"),
    (base({"class": "positional_encoding", "add_to_input": True, "n_out": 5}),
     r"'l': with add_to_input, n_out must be the input dim 3"),
    (base({"class": "positional_encoding", "n_out": 2}), r"'l': the encoding needs n_out >= 4"),
    (base({"class": "layer_norm", "epsilon": "small"}), r"'l': 'epsilon' must be a number"),
    (base({"class": "activation"}), r"'l': 'activation' is required"),
    (base({"class": "activation", "activation": "relu+tanh"}), r"'l': unknown activation 'relu\+tanh'"),
])
def test_bad_options_name_the_layer(network, message):
    with pytest.raises(ConfigError, match=message):
        build_model(network, input_dim=3, input_sparse=False, target_dims={"classes": 3})


def test_dense_only_layers_refuse_sparse_data():
    with pytest.raises(ConfigError, match=r"'l': RETURNN's layer_norm layer takes dense input"):
        build_model(base({"class": "layer_norm"}), input_dim=3, input_sparse=True, target_dims={})


def test_conv_and_pool_that_keep_the_time_axis_allow_frame_losses():
    net = {"c": {"class": "conv", "filter_size": (3,), "padding": "same", "n_out": 4},
           "p": {"class": "pool", "mode": "avg", "pool_size": (3,), "strides": 1, "padding": "same",
                 "from": "c"},
           "output": {"class": "softmax", "loss": "ce", "from": ["p", "data"]}}
    model = build_model(net, input_dim=3, input_sparse=False, target_dims={"classes": 3})
    data = np.random.RandomState(11).randn(2, 5, 3).astype("float32")
    out = model(data, np.array([5, 2], np.int32))
    assert out["output:lengths"].numpy().tolist() == [5, 2]
    assert out["output"].shape == (2, 5, 3)
