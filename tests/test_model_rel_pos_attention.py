"""``relative_positional_encoding`` and ``self_attention``'s ``key_shift`` (a Conformer's self-attention):
numbers against numpy, the plumbing of an option that names a layer (build order, cycles, time axes) and
every refusal. RETURNN's own outputs and gradients: the ``rel_pos_attention`` case of
test_returnn_checkpoints.py."""
import math

import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.model.layers.attention import RelativePositionalEncoding, SelfAttention
from engine.model.spec import build_order, parse_network
from engine.runtime.errors import ConfigError

pytestmark = pytest.mark.tf_latest


def ref_encoding(matrix, n_time, clipping):
    """Shaw et al.: (query i, key j) -> row clip(j - i) + clipping, written out."""
    return np.array([[matrix[min(max(j - i, -clipping), clipping) + clipping] for j in range(n_time)]
                     for i in range(n_time)])


def ref_sinusoid(n_rows, n_out):
    half = n_out // 2
    rates = [math.exp(-k * math.log(1e4) / (half - 1)) for k in range(half)]
    rows = [[math.sin(t * r) for r in rates] + [math.cos(t * r) for r in rates] + [0.0] * (n_out % 2)
            for t in range(n_rows)]
    return np.array(rows)


def ref_attention(x, w, heads, key_total, left_only, shift):
    """One sequence x (n, F): per head softmax((q . (k_j + shift[i, j])) / sqrt(d)) over its keys."""
    n, d = len(x), key_total // heads
    qkv = (x @ w).reshape(n, heads, -1)
    out = []
    for h in range(heads):
        q, k, v = qkv[:, h, :d], qkv[:, h, d:2 * d], qkv[:, h, 2 * d:]
        energy = np.array([[q[i] @ (k[j] + shift[i, j]) for j in range(n)] for i in range(n)]) / math.sqrt(d)
        if left_only:
            energy = np.where(np.tril(np.ones((n, n), bool)), energy, -np.inf)
        weights = np.exp(energy - energy.max(-1, keepdims=True))
        out.append((weights / weights.sum(-1, keepdims=True)) @ v)
    return np.concatenate(out, axis=-1)


@pytest.mark.parametrize("clipping, fixed, n_out", [(2, False, 3), (16, False, 4), (1, True, 5)])
def test_encoding_is_the_clipped_distance_row_without_batch_axis(clipping, fixed, n_out):
    opts = {"n_out": n_out, "clipping": clipping, "fixed": fixed}
    layer = RelativePositionalEncoding("rel", opts, 7, random_seed=1)
    x = tf.zeros([6, 2, 7])
    y = layer(x, tf.constant([6, 3]), False).numpy()
    assert y.shape == (6, 6, n_out)
    if fixed:
        assert not layer.params
        matrix = ref_sinusoid(2 * clipping + 1, n_out)
    else:
        matrix = layer.params["encoding_matrix"].numpy()
        assert matrix.shape == (2 * clipping + 1, n_out)
    np.testing.assert_allclose(y, ref_encoding(matrix, 6, clipping), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("left_only", [False, True])
def test_key_shift_adds_the_encoding_to_each_heads_keys(left_only):
    rng = np.random.RandomState(3 + left_only)
    lengths = [5, 2]
    rel = RelativePositionalEncoding("rel", {"n_out": 3, "clipping": 2}, 4, random_seed=2)
    rel.params["encoding_matrix"].assign(rng.randn(5, 3).astype(np.float32))
    att = SelfAttention("att", {"num_heads": 2, "total_key_dim": 6, "n_out": 4, "key_shift": "rel",
                                "attention_left_only": left_only}, 4, random_seed=3, key_shift=rel)
    x = rng.randn(5, 2, 4).astype(np.float32)
    x[2:, 1] = 1e4  # padding: must not reach the valid frames
    shift = rel(tf.constant(x), tf.constant(lengths), False)
    y = att(tf.constant(x), tf.constant(lengths), False, key_shift=shift).numpy()
    w = att.params["QKV"].numpy().astype(np.float64)
    for b, n in enumerate(lengths):
        want = ref_attention(x[:n, b].astype(np.float64), w, 2, 6, left_only, shift.numpy()[:n, :n])
        np.testing.assert_allclose(y[:n, b], want, rtol=1e-4, atol=1e-5)


def conformer_piece(**att_opts):
    return {
        "in": {"class": "linear", "n_out": 8, "activation": None},
        "rel": {"class": "relative_positional_encoding", "n_out": 4, "clipping": 3, "from": "in"},
        "att": {"class": "self_attention", "num_heads": 2, "total_key_dim": 8, "n_out": 8, "from": "in",
                "key_shift": "rel", **att_opts},
        "output": {"class": "softmax", "loss": "ce", "from": "att", "n_out": 3},
    }


def model(network):
    return build_model(network, input_dim=5, input_sparse=False, target_dims={"classes": 3}, random_seed=1)


def test_key_shift_layer_is_built_first_and_its_output_kept_without_batch_axis():
    specs = parse_network(conformer_piece())
    assert build_order(specs) == ["in", "rel", "att", "output"]
    net = model(conformer_piece(attention_dropout=0.2))
    x = np.random.RandomState(0).randn(2, 6, 5).astype(np.float32)
    out = net(x, np.array([6, 4]), training=True)
    assert out["rel"].shape == (6, 6, 4) and out["att"].shape == (2, 6, 8)
    np.testing.assert_array_equal(out["rel:lengths"], [6, 4])
    assert "rel/encoding_matrix" in net.named_variables()
    again = tf.function(lambda d, n: net(d, n))(x, np.array([6, 4]))  # as the compiled steps run it
    np.testing.assert_allclose(again["output"], net(x, np.array([6, 4]))["output"], rtol=1e-6)


def refused(network, match):
    with pytest.raises(ConfigError, match=match):
        model(network)


@pytest.mark.parametrize("value, match", [
    ("nope", r"Network layer 'att': 'key_shift' names 'nope', which is not a layer of the network"),
    (3, r"Network layer 'att': 'key_shift' must be a layer name, got 3"),
    ("in", r"'att': key_shift 'in' must name a relative_positional_encoding layer"),
    ("data", r"'att': key_shift 'data' must name a relative_positional_encoding layer"),
])
def test_key_shift_must_name_a_relative_positional_encoding_layer(value, match):
    refused(conformer_piece(key_shift=value), match)


def test_refusals_of_the_pair():
    net = conformer_piece()
    refused({**net, "att": {**net["att"], "num_heads": 1}},
            r"key_shift layer 'rel' has n_out 4, but the keys have total_key_dim // num_heads = 8")
    refused({**net, "output": {**net["output"], "from": ["att", "rel"]}},
            r"'output': 'from' names 'rel', a relative_positional_encoding layer, whose output has no batch "
            r"axis; it is read only as a self_attention's key_shift")
    refused({**net, "output": net["rel"]},
            r"'output': a relative_positional_encoding layer's output has no batch axis")
    refused({**net, "rel": {**net["rel"], "from": "att"}},
            r"cycle: (att -> rel -> att|rel -> att -> rel) \(each layer reads the next, by 'from' or an "
            r"option")
    strided = {"class": "conv", "filter_size": (3,), "padding": "same", "strides": 2, "n_out": 8,
               "from": "in"}
    refused({**net, "down": strided, "att": {**net["att"], "from": "down"}},
            r"'att': key_shift 'rel' is on another time axis than its sources \['down'\]")


@pytest.mark.parametrize("opts, match", [
    ({"clipping": -1}, r"'rel': 'clipping' must be an int >= 0, got -1"),
    ({"clipping": True}, r"'rel': 'clipping' must be an int >= 0, got True"),
    ({"fixed": 1}, r"'rel': 'fixed' must be True or False, got 1"),
    ({"fixed": True, "n_out": 2}, r"'rel': with fixed, n_out must be >= 4 \(RETURNN's sinusoid divides by"),
    ({"n_out": None}, r"'rel': 'n_out' must be a positive int, got None"),
    ({"query_offset": 2}, r"'query_offset'"),
    ({"key_value_spatial_dim": "T"}, r"'key_value_spatial_dim'"),
])
def test_relative_positional_encoding_refusals(opts, match):
    net = conformer_piece()
    rel = {k: v for k, v in {**net["rel"], **opts}.items() if v is not None}
    refused({**net, "rel": rel}, match)
