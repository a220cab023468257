"""Sequence layers with lengths: conv, pool, layer_norm, activation, combine, positional_encoding,
self_attention. Numbers against numpy; a sequence's valid output is the same alone or in a padded batch,
whatever stands in the padding; every layer reports its output lengths. Whole networks of them:
test_model_sequence_networks.py."""
import math

import numpy as np
import pytest
import tensorflow as tf

from engine.model.layers.attention import PositionalEncoding, SelfAttention
from engine.model.layers.conv import Conv, Pool
from engine.model.layers.elementwise import Activation, Combine
from engine.model.layers.norm import LayerNorm

pytestmark = pytest.mark.tf_latest


def ceil_div(a, b):
    return -(-a // b)


def ref_out_length(n, size, stride, dilation, padding):
    """RETURNN's ConvLayer.calc_out_dim, written out."""
    if padding == "same":
        return ceil_div(n, stride)
    return max(ceil_div(n - (size - 1) * dilation, stride), 0)


def ref_windows(x, size, stride, dilation, padding):
    """x (T, F) alone -> list of windows, each a list of (position j, frame or None outside)."""
    n = len(x)
    left = max((size - 1) * dilation + 1 - stride, 0) // 2 if padding == "same" else 0
    out = []
    for i in range(ref_out_length(n, size, stride, dilation, padding)):
        window = []
        for j in range(size):
            t = i * stride - left + j * dilation
            window.append((j, x[t] if 0 <= t < n else None))
        out.append(window)
    return out


def ref_conv(x, w, b, stride, dilation, padding):
    out = []
    for window in ref_windows(x, w.shape[0], stride, dilation, padding):
        out.append(sum(frame @ w[j] for j, frame in window if frame is not None) + b)
    return np.array(out).reshape(-1, w.shape[2])


def ref_pool(x, mode, size, stride, dilation, padding):
    out = []
    for window in ref_windows(x, size, stride, dilation, padding):
        frames = [frame for _, frame in window if frame is not None]
        out.append(np.max(frames, 0) if mode == "max" else np.mean(frames, 0))
    return np.array(out).reshape(-1, x.shape[1])


def padded(rng, lengths, dim, pad=0.0):
    """Time-major (T, B, F) with ``pad`` beyond each length, and the sequences alone."""
    x = rng.randn(max(lengths), len(lengths), dim).astype("float32")
    for b, n in enumerate(lengths):
        x[n:, b] = pad
    return x, [x[:n, b] for b, n in enumerate(lengths)]


def garbage_like(rng, x, lengths):
    """``x`` with big, varied values (no inf/nan) in the padding."""
    y = x.copy()
    for b, n in enumerate(lengths):
        y[n:, b] = rng.uniform(-1e6, 1e6, y[n:, b].shape)
    return y


def run(layer, x, lengths, **kw):
    return layer(tf.constant(x), tf.constant(lengths, tf.int32), False, **kw).numpy()


# ----- conv / pool: lengths, values -----

GEOMETRIES = [(size, stride, dilation, padding) for size in (1, 2, 3) for stride in (1, 2, 3)
              for dilation in (1, 2) for padding in ("same", "valid")]


@pytest.mark.parametrize("size,stride,dilation,padding", GEOMETRIES)
def test_conv_and_pool_lengths_follow_returnn_formula(size, stride, dilation, padding):
    ns = np.arange(0, 13, dtype=np.int32)
    conv = Conv("c", {"filter_size": (size,), "strides": stride, "dilation_rate": (dilation,),
                      "padding": padding.upper(), "n_out": 2}, 3, random_seed=1)
    pool = Pool("p", {"mode": "max", "pool_size": (size,), "strides": (stride,), "dilation_rate": dilation,
                      "padding": padding}, 3)
    expected = [ref_out_length(int(n), size, stride, dilation, padding) for n in ns]
    for layer in (conv, pool):
        assert layer.out_lengths(tf.constant(ns)).numpy().tolist() == expected
        x = np.ones((12, 2, 3), np.float32)
        assert run(layer, x, [12, 5]).shape[0] == expected[12]


def test_pool_strides_default_to_pool_size_and_padding_to_valid():
    pool = Pool("p", {"mode": "avg", "pool_size": (3,)}, 2)
    assert (pool.stride, pool.padding) == (3, "valid")
    assert pool.out_lengths(tf.constant([7, 9, 2])).numpy().tolist() == [2, 3, 0]


@pytest.mark.parametrize("size,stride,dilation,padding", GEOMETRIES)
def test_conv_values_against_numpy_and_padding_invariance(size, stride, dilation, padding):
    rng = np.random.RandomState(size * 100 + stride * 10 + dilation)
    lengths = [9, 4, 1, 7]
    x, alone = padded(rng, lengths, 3)
    conv = Conv("c", {"filter_size": (size,), "strides": stride, "dilation_rate": dilation,
                      "padding": padding, "n_out": 4, "activation": "tanh", "with_bias": True}, 3,
                random_seed=7)
    conv.params["bias"].assign(rng.randn(4).astype("float32"))
    w, b = conv.params["W"].numpy(), conv.params["bias"].numpy()
    y = run(conv, x, lengths)
    y_garbage = run(conv, garbage_like(rng, x, lengths), lengths)
    out_lengths = conv.out_lengths(tf.constant(lengths)).numpy()
    for i, seq in enumerate(alone):
        n = out_lengths[i]
        ref = np.tanh(ref_conv(seq.astype(np.float64), w, b, stride, dilation, padding))
        np.testing.assert_allclose(y[:n, i], ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y_garbage[:n, i], y[:n, i], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(run(conv, seq[:, None], [len(seq)])[:, 0], y[:n, i], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("size,stride,dilation,padding",
                         GEOMETRIES + [(8, 1, 1, "same"), (4, 3, 2, "same")])
def test_depthwise_conv_values_against_numpy_and_padding_invariance(size, stride, dilation, padding,
                                                                    multiplier):
    # groups = the input dim runs TensorFlow's depthwise kernel over (1, T, B, F): the same numbers as a
    # full convolution whose weights are zero off each output channel's own input channel
    rng = np.random.RandomState(size * 100 + stride * 10 + dilation + multiplier)
    lengths = [9, 4, 1, 7]
    x, alone = padded(rng, lengths, 3)
    conv = Conv("c", {"filter_size": (size,), "strides": stride, "dilation_rate": dilation,
                      "padding": padding, "n_out": 3 * multiplier, "groups": 3, "with_bias": True}, 3,
                random_seed=7)
    conv.params["bias"].assign(rng.randn(3 * multiplier).astype("float32"))
    w_depthwise, b = conv.params["W"].numpy(), conv.params["bias"].numpy()  # (size, 1, 3 * multiplier)
    w = np.zeros((size, 3, 3 * multiplier), np.float32)
    for out in range(3 * multiplier):
        w[:, out // multiplier, out] = w_depthwise[:, 0, out]
    y = run(conv, x, lengths)
    y_garbage = run(conv, garbage_like(rng, x, lengths), lengths)
    out_lengths = conv.out_lengths(tf.constant(lengths)).numpy()
    assert y.shape[0] == max(out_lengths)
    for i, seq in enumerate(alone):
        n = out_lengths[i]
        ref = ref_conv(seq.astype(np.float64), w, b, stride, dilation, padding)
        np.testing.assert_allclose(y[:n, i], ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y_garbage[:n, i], y[:n, i], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("size,stride,dilation", [(3, 1, 1), (3, 1, 2), (4, 2, 1), (3, 3, 1), (5, 2, 1)])
def test_conv_and_pool_equal_tensorflow_ops_when_length_is_a_multiple_of_the_stride(
        padding, size, stride, dilation):
    rng = np.random.RandomState(3)
    x = rng.randn(12, 1, 3).astype("float32")
    conv = Conv("c", {"filter_size": (size,), "strides": stride, "dilation_rate": dilation,
                      "padding": padding, "n_out": 2, "with_bias": False}, 3, random_seed=2)
    ours = run(conv, x, [12])[:, 0]
    theirs = tf.nn.convolution(x.transpose(1, 0, 2), conv.params["W"], strides=stride, padding=padding,
                               dilations=dilation).numpy()[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    if padding == "SAME" and dilation > 1:
        return  # tf.nn.pool does not implement this case; test_pool_values_* covers it against numpy
    for mode in ("MAX", "AVG"):
        pool = Pool("p", {"mode": mode, "pool_size": (size,), "strides": stride, "dilation_rate": dilation,
                          "padding": padding}, 3)
        theirs = tf.nn.pool(x.transpose(1, 0, 2), [size], mode, strides=[stride], padding=padding,
                            dilations=[dilation]).numpy()[0]
        np.testing.assert_allclose(run(pool, x, [12])[:, 0], theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("size,stride,dilation,padding", [g for g in GEOMETRIES if g[0] > 1])
def test_pool_values_see_only_valid_frames(mode, size, stride, dilation, padding):
    rng = np.random.RandomState(size + 7 * stride)
    lengths = [8, 3, 6]
    x, alone = padded(rng, lengths, 2, pad=-50.0 if mode == "max" else 50.0)  # would win / shift the mean
    pool = Pool("p", {"mode": mode, "pool_size": (size,), "strides": stride, "dilation_rate": dilation,
                      "padding": padding}, 2)
    y = run(pool, x, lengths)
    y_garbage = run(pool, garbage_like(rng, x, lengths), lengths)
    out_lengths = pool.out_lengths(tf.constant(lengths)).numpy()
    for i, seq in enumerate(alone):
        n = out_lengths[i]
        windows = ref_windows(seq, size, stride, dilation, padding)
        covered = [k for k, window in enumerate(windows) if any(f is not None for _, f in window)]
        ref = ref_pool(seq, mode, size, stride, dilation, padding) if len(covered) == n else None
        if ref is not None:
            np.testing.assert_allclose(y[:n, i], ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(y_garbage[:n, i], y[:n, i])


# ----- frame-wise layers -----

def test_layer_norm_against_numpy_and_per_frame():
    rng = np.random.RandomState(4)
    lengths = [5, 2]
    x, _ = padded(rng, lengths, 6)
    norm = LayerNorm("n", {}, 6)
    assert norm.epsilon == 1e-6
    norm.params["scale"].assign(rng.randn(6).astype("float32"))
    norm.params["bias"].assign(rng.randn(6).astype("float32"))
    xd = x.astype(np.float64)
    ref = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-6)
    ref = ref * norm.params["scale"].numpy() + norm.params["bias"].numpy()
    y = run(norm, x, lengths)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    y_garbage = run(norm, garbage_like(rng, x, lengths), lengths)
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(y_garbage[:n, b], y[:n, b])
    wide = LayerNorm("n", {"epsilon": 0.5}, 6)
    ref = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 0.5)
    np.testing.assert_allclose(run(wide, x, lengths), ref, rtol=1e-4, atol=1e-5)


ERF = np.vectorize(math.erf)
ACTIVATION_REFS = {
    "gelu": lambda x: 0.5 * x * (1 + ERF(x / np.sqrt(2))),
    "swish": lambda x: x / (1 + np.exp(-x)),
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "softplus": lambda x: np.log1p(np.exp(x)),
    "log_sigmoid": lambda x: -np.log1p(np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "square": np.square,
    "neg": np.negative,
}


@pytest.mark.parametrize("name", sorted(ACTIVATION_REFS))
def test_activation_layer_against_numpy(name):
    x = np.random.RandomState(5).uniform(0.1, 3.0, (4, 2, 3)).astype("float32") * np.array([1, -1, 1])
    if name == "log":
        x = np.abs(x)
    y = run(Activation("a", {"activation": name}, 3), x, [4, 4])
    np.testing.assert_allclose(y, ACTIVATION_REFS[name](x.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,ref3,ref2", [
    ("add", lambda a, b, c: a + b + c, lambda a, b: a + b),
    ("sub", lambda a, b, c: a - b - c, lambda a, b: a - b),
    ("mul", lambda a, b, c: a * b * c, lambda a, b: a * b),
    ("truediv", lambda a, b, c: a / b / c, lambda a, b: a / b),
    ("average", lambda a, b, c: (a + b + c) / 3, lambda a, b: (a + b) / 2),
    ("maximum", lambda a, b, c: np.maximum(np.maximum(a, b), c), np.maximum),
    ("minimum", lambda a, b, c: np.minimum(np.minimum(a, b), c), np.minimum),
])
def test_combine_kinds_fold_left_over_sources(kind, ref3, ref2):
    rng = np.random.RandomState(6)
    xs = [rng.uniform(0.5, 2.0, (3, 2, 4)).astype("float32") for _ in range(3)]
    lengths = tf.constant([3, 2])
    layer = Combine("c", {"kind": kind}, {"a": 4, "b": 4, "c": 4})
    assert not layer.params
    y = layer([tf.constant(x) for x in xs], lengths, False).numpy()
    np.testing.assert_allclose(y, ref3(*xs), rtol=1e-5)
    biased = Combine("c", {"kind": kind, "with_bias": True, "activation": "tanh"}, {"a": 4, "b": 4})
    biased.params["b"].assign(np.arange(4, dtype=np.float32) / 4)
    y = biased([tf.constant(x) for x in xs[:2]], lengths, False).numpy()
    np.testing.assert_allclose(y, np.tanh(ref2(xs[0], xs[1]) + np.arange(4) / 4), rtol=1e-5)


# ----- positional encoding, self-attention -----

def ref_signal(n_time, n_out):
    half = n_out // 2
    inv = np.exp(np.arange(half) * -(np.log(1e4) / (half - 1)))
    scaled = np.arange(n_time)[:, None] * inv[None, :]
    signal = np.concatenate([np.sin(scaled), np.cos(scaled)], -1)
    return np.pad(signal, [(0, 0), (0, n_out % 2)])


@pytest.mark.parametrize("n_out", [4, 7, 16])
def test_positional_encoding_against_numpy(n_out):
    x = np.random.RandomState(7).randn(6, 2, 3).astype("float32")
    y = run(PositionalEncoding("p", {"n_out": n_out}, 3, ("data",)), x, [6, 3])
    assert y.shape == (6, 2, n_out)
    np.testing.assert_allclose(y, np.repeat(ref_signal(6, n_out)[:, None], 2, axis=1), rtol=1e-5, atol=1e-5)
    x = np.random.RandomState(7).randn(6, 2, n_out).astype("float32")
    added = run(PositionalEncoding("p", {"add_to_input": True}, n_out, ("data",)), x, [6, 3])
    np.testing.assert_allclose(added, x + ref_signal(6, n_out)[:, None], rtol=1e-5, atol=1e-5)


def ref_self_attention(seq, w, heads, key_total, left_only):
    """One sequence (T, F) alone; w (F, 2K+V) laid out per head as [q | k | v]."""
    n_time, n_out = len(seq), w.shape[1] - 2 * key_total
    dk, dv = key_total // heads, n_out // heads
    qkv = (seq @ w).reshape(n_time, heads, 2 * dk + dv)
    out = []
    for h in range(heads):
        q, k, v = qkv[:, h, :dk] / np.sqrt(dk), qkv[:, h, dk:2 * dk], qkv[:, h, 2 * dk:]
        energy = q @ k.T
        if left_only:
            energy = np.where(np.tril(np.ones((n_time, n_time))) > 0, energy, -np.inf)
        weights = np.exp(energy - energy.max(-1, keepdims=True))
        out.append((weights / weights.sum(-1, keepdims=True)) @ v)
    return np.concatenate(out, axis=-1)


@pytest.mark.parametrize("left_only", [False, True])
@pytest.mark.parametrize("heads,key_total,n_out", [(1, 4, 6), (2, 4, 6), (3, 6, 9)])
def test_self_attention_against_numpy_and_padding_masked(left_only, heads, key_total, n_out):
    rng = np.random.RandomState(heads * 10 + left_only)
    lengths = [6, 2, 4]
    x, alone = padded(rng, lengths, 5)
    att = SelfAttention("att", {"num_heads": heads, "total_key_dim": key_total, "n_out": n_out,
                                "attention_left_only": left_only}, 5, random_seed=3)
    assert att.params["QKV"].shape == (5, 2 * key_total + n_out)
    w = att.params["QKV"].numpy().astype(np.float64)
    y = run(att, x, lengths)
    y_garbage = run(att, garbage_like(rng, x, lengths), lengths)
    for b, seq in enumerate(alone):
        n = lengths[b]
        np.testing.assert_allclose(y[:n, b], ref_self_attention(seq.astype(np.float64), w, heads, key_total,
                                                                left_only), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(y_garbage[:n, b], y[:n, b], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(run(att, seq[:, None], [n])[:, 0], y[:n, b], rtol=1e-5, atol=1e-6)


def test_attention_dropout_is_stateless_and_only_in_training():
    x = np.random.RandomState(8).randn(5, 2, 4).astype("float32")
    att = SelfAttention("att", {"num_heads": 2, "total_key_dim": 4, "n_out": 4, "attention_dropout": 0.5},
                        4, random_seed=1)
    args = (tf.constant(x), tf.constant([5, 3]))
    seed_a, seed_b = tf.constant([1, 2], tf.int64), tf.constant([1, 3], tf.int64)
    first, again = att(*args, True, seed=seed_a).numpy(), att(*args, True, seed=seed_a).numpy()
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, att(*args, True, seed=seed_b).numpy())
    plain = SelfAttention("att", {"num_heads": 2, "total_key_dim": 4, "n_out": 4}, 4, random_seed=1)
    np.testing.assert_array_equal(att(*args, False, seed=seed_a).numpy(), plain(*args, False).numpy())
