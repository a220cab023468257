"""Static axes besides the features: RETURNN's axis strings, split_dims, merge_dims, 2-D conv and pool.
Their numbers against RETURNN's are in the fixtures (cases conv2d, conv2d_added_axis, split_merge of
tests/test_returnn_checkpoints.py); here: axis resolution, reshapes against numpy, the batch invariance
of the 2-D windows, and every refusal."""
import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.model.axes import Layout, resolve_axes
from engine.model.layers.conv import Window
from engine.model.layers.conv2d import Conv2D, Pool2D, padded, same_as_tensorflow, static_out_size
from engine.model.layers.reduce import Reduce
from engine.model.layers.reshape import MergeDims, SplitDims
from engine.runtime.errors import ConfigError

LAYOUT = Layout((4, 3), 2)  # (T, B, 4, 3, F=2)


@pytest.mark.parametrize("description,axes", [
    ("T", [0]), ("b", [1]), ("F", [4]), ("feature", [4]), ("static", [2, 3, 4]), ("except_time", [2, 3, 4]),
    ("except_batch", [0, 2, 3, 4]), ("spatial", [0, 2, 3]), ("s:0", [0]), ("s:1", [2]), ("s:-1", [3]),
    ("static:0", [2]), ("static:-1", [4]), ("dim:3", [3]), ("bt", [1, 0]), (["s:1", "f", "F"], [2, 4]),
    ("spatial_except_time", [2, 3]), ("T?", [0]), ("dyn:0", [0]),
])
def test_axis_strings_resolve_as_in_returnns_batch_major_view(description, axes):
    assert resolve_axes(LAYOUT, description, layer="l", option="'axes'") == axes


@pytest.mark.parametrize("description,message", [
    ("s:3", r"'l': 'axes' 's:3' names no axis of its input \(T, B, 4, 3, F=2\)"),
    ("dim:7", r"'dim:7' must name exactly one axis"),
    ("stag:heads", r"names a dim tag; this engine's axes carry no tag names"),
    ("X", r"'X' is not one of RETURNN's axis strings"),
    (2, r"axes by number are not taken"),
])
def test_bad_axis_strings_are_named(description, message):
    with pytest.raises(ConfigError, match=message):
        resolve_axes(LAYOUT, description, layer="l", option="'axes'")


def test_split_and_merge_are_numpys_reshapes_in_returnns_order():
    x = np.arange(2 * 3 * 12, dtype=np.float32).reshape(2, 3, 12)
    split = SplitDims("s", {"axis": "F", "dims": (2, -1, 3)}, Layout((), 12))
    assert (split.spatial, split.n_out) == ((2, 2), 3)
    y = split(tf.constant(x), None, False).numpy()
    np.testing.assert_array_equal(y, x.reshape(2, 3, 2, 2, 3))
    layout = Layout(split.spatial, split.n_out)
    sorted_merge = MergeDims("m", {"axes": ["f", "s:2"]}, layout)  # keep_order False: the tensor's order
    np.testing.assert_array_equal(sorted_merge(tf.constant(y), None, False).numpy(), y.reshape(2, 3, 2, 6))
    apart = MergeDims("m", {"axes": ["f", "s:1"]}, layout)  # moved together at the features' place
    np.testing.assert_array_equal(apart(tf.constant(y), None, False).numpy(),
                                  y.transpose(0, 1, 3, 2, 4).reshape(2, 3, 2, 6))
    kept = MergeDims("m", {"axes": ["f", "s:2"], "keep_order": True}, layout)  # F major, as listed
    assert (kept.spatial, kept.n_out) == ((2,), 6)
    np.testing.assert_array_equal(kept(tf.constant(y), None, False).numpy(),
                                  y.transpose(0, 1, 2, 4, 3).reshape(2, 3, 2, 6))
    inner = MergeDims("m", {"axes": ["s:1", "s:2"]}, layout)  # not the features: they stay last
    assert (inner.spatial, inner.n_out) == ((4,), 3)
    np.testing.assert_array_equal(inner(tf.constant(y), None, False).numpy(), y.reshape(2, 3, 4, 3))


@pytest.mark.parametrize("layer,message", [
    (lambda: SplitDims("s", {"axis": "T", "dims": (-1, 2)}, LAYOUT), r"'s': 'axis' names the time or batch"),
    (lambda: SplitDims("s", {"axis": "F", "dims": (-1, -1)}, LAYOUT), r"at most one -1"),
    (lambda: SplitDims("s", {"axis": "F", "dims": (3, -1)}, LAYOUT), r"do not divide the axis of size 2"),
    (lambda: SplitDims("s", {"axis": "F", "dims": (1, 1)}, LAYOUT), r"do not divide the axis of size 2"),
    (lambda: SplitDims("s", {"axis": "F", "dims": (2, 1), "pad_to_multiples": True}, LAYOUT),
     r"'pad_to_multiples' and 'pad_value' are not taken"),
    (lambda: SplitDims("s", {"axis": "static", "dims": (2, 1)}, LAYOUT), r"must name one axis"),
    (lambda: MergeDims("m", {"axes": "except_batch"}, LAYOUT), r"'m': 'axes' names the time or batch axis"),
    (lambda: MergeDims("m", {"axes": "static", "n_out": 5}, LAYOUT), r"'n_out' is 5, but merging .* gives "
                                                                     r"24"),
    (lambda: Conv2D("c", {"filter_size": (3, 3), "padding": "same", "n_out": 2}, LAYOUT, random_seed=1),
     r"needs an input \(T, B, S, C\) with one static axis S; its input is \(T, B, 4, 3, F=2\)"),
    (lambda: Conv2D("c", {"filter_size": (3, 3), "padding": "same", "n_out": 2, "dilation_rate": (1, 2)},
                    Layout((5,), 1), random_seed=1), r"'dilation_rate' must be 1 for a window over two axes"),
    (lambda: Conv2D("c", {"filter_size": (3, 3), "padding": "valid", "n_out": 2}, Layout((2,), 1),
                    random_seed=1), r"the window 3 is wider than the static axis 2"),
    (lambda: Conv2D("c", {"filter_size": (3, 3), "padding": "same", "n_out": 3, "groups": 2}, Layout((5,), 4),
                    random_seed=1), r"'groups' must be 1 or the input dim 4"),
    (lambda: Pool2D("p", {"pool_size": (1, 2)}, Layout((5,), 1)), r"'p': 'mode' is required"),
    (lambda: Reduce("r", {"mode": "mean", "axes": ["T", "F"]}, LAYOUT),
     r"'r': 'axes' \['T', 'F'\] of its input .* must be static spatial axes"),
    (lambda: Reduce("r", {"mode": "mean", "axes": "F"}, LAYOUT), r"must be static spatial axes"),
    (lambda: Reduce("r", {"mode": "argmax", "axes": "s:1"}, LAYOUT), r"'mode' 'argmax' is not taken"),
    (lambda: Reduce("r", {"mode": "sum", "axes": "s:1", "axis": "s:2"}, LAYOUT), r"'axes' or 'axis', not"),
])
def test_refusals_name_the_layer(layer, message):
    with pytest.raises(ConfigError, match=message):
        layer()


def test_networks_refuse_static_axes_where_a_layer_takes_none():
    split = {"class": "split_dims", "axis": "F", "dims": (-1, 1), "from": "data"}
    with pytest.raises(ConfigError, match=r"'output': its input \(T, B, 4, F=1\) has static axes besides the "
                                          r"features, which a softmax layer"):
        build_model({"s": split, "output": {"class": "softmax", "loss": "ce", "from": "s"}}, input_dim=4,
                    input_sparse=False, target_dims={"classes": 3})
    with pytest.raises(ConfigError, match=r"'output': its sources have different static axes"):
        build_model({"s": split, "output": {"class": "copy", "from": ["s", "data"]}}, input_dim=4,
                    input_sparse=False, target_dims={"classes": 3})


def _windows_2d(seed: int):
    rng = np.random.RandomState(seed)
    lengths = [7, 4, 1]
    x = rng.randn(7, 3, 5, 2).astype(np.float32)
    for b, n in enumerate(lengths):
        x[n:, b] = rng.randn(*x[n:, b].shape) * 100  # garbage in the padding must not matter
    layout = Layout((5,), 2)
    return x, lengths, [
        Conv2D("c", {"filter_size": (3, 2), "strides": (2, 1), "padding": "same", "n_out": 3,
                     "with_bias": True}, layout, random_seed=seed),
        Conv2D("d", {"filter_size": (2, 3), "padding": "valid", "n_out": 4, "groups": 2}, layout,
               random_seed=seed),
        Pool2D("p", {"mode": "max", "pool_size": (2, 2), "padding": "same"}, layout),
        Pool2D("a", {"mode": "avg", "pool_size": (3, 2), "strides": (1, 2), "padding": "same"}, layout),
        Conv2D("s", {"filter_size": (3, 3), "padding": "same", "n_out": 3, "with_bias": True}, layout,
               random_seed=seed),  # TensorFlow's own "SAME" instead of an explicit pad
    ]


def test_2d_conv_with_tensorflows_same_equals_the_explicit_padding():
    x, lengths, layers = _windows_2d(5)
    conv = layers[4]
    assert same_as_tensorflow(conv.time, conv.space)
    assert not same_as_tensorflow(layers[0].time, layers[0].space)
    batch_major = padded(tf.transpose(x, [1, 0, 2, 3]), tf.constant(lengths), conv.time, conv.space, 0.0)
    expected = tf.nn.bias_add(tf.nn.conv2d(batch_major, conv.params["W"], [1, 1, 1, 1], "VALID"),
                              conv.params["bias"])
    np.testing.assert_allclose(conv(tf.constant(x), tf.constant(lengths), False).numpy(),
                               tf.transpose(expected, [1, 0, 2, 3]).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("index", range(5))
def test_2d_windows_give_a_sequence_the_same_output_alone_or_in_a_batch(index):
    x, lengths, layers = _windows_2d(index)
    layer = layers[index]
    batch = layer(tf.constant(x), tf.constant(lengths), False).numpy()
    out_lengths = layer.out_lengths(tf.constant(lengths)).numpy()
    assert batch.shape[2:] == (layer.spatial[0], layer.n_out)
    for b, n in enumerate(lengths):
        alone = layer(tf.constant(x[:n, b:b + 1]), tf.constant([n]), False).numpy()
        np.testing.assert_allclose(alone[:out_lengths[b], 0], batch[:out_lengths[b], b], rtol=1e-5, atol=1e-5)


def test_avg_pool_over_two_axes_averages_the_frames_inside_the_sequence():
    x = np.arange(4 * 1 * 2 * 1, dtype=np.float32).reshape(4, 1, 2, 1)  # T=4, one sequence of 3 frames
    pool = Pool2D("a", {"mode": "avg", "pool_size": (2, 2), "padding": "same"}, Layout((2,), 1))
    y = pool(tf.constant(x), tf.constant([3]), False).numpy()
    assert pool.out_lengths(tf.constant([3])).numpy().tolist() == [2]
    np.testing.assert_allclose(y[:2, 0, :, 0], [[x[0:2, 0].mean()], [x[2, 0].mean()]])  # frame 3 left out


def test_static_out_sizes_are_tensorflows():
    for size in range(3, 9):
        for window in (Window(3, 2, 1, "same"), Window(2, 3, 1, "valid"), Window(3, 1, 1, "valid")):
            probe = tf.nn.conv2d(tf.zeros([1, 1, size, 1]), tf.zeros([1, window.size, 1, 1]),
                                 [1, 1, window.stride, 1], window.padding.upper())
            assert static_out_size(size, window) == probe.shape[2]


def test_reduce_over_static_axes_is_numpys():
    x = np.random.RandomState(0).randn(5, 2, 4, 3, 2).astype(np.float32)
    both = Reduce("r", {"mode": "max", "axes": ["s:1", "s:2"]}, LAYOUT)
    np.testing.assert_allclose(both(tf.constant(x), None, False).numpy(), x.max(axis=(2, 3)))
    assert (both.spatial, both.n_out) == ((), 2)
    kept = Reduce("r", {"mode": "avg", "axes": "s:2", "keep_dims": True}, LAYOUT)
    np.testing.assert_allclose(kept(tf.constant(x), None, False).numpy(), x.mean(axis=3, keepdims=True),
                               rtol=1e-6)
    assert kept.spatial == (4, 1)


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_one_frame_windows_run_time_major_and_equal_the_batch_major_ops(padding):
    rng = np.random.RandomState(4)
    lengths = [6, 3]
    x = rng.randn(6, 2, 7, 3).astype(np.float32)
    x[3:, 1] = 1e6  # the padding reaches no frame inside a sequence
    layout = Layout((7,), 3)
    conv = Conv2D("c", {"filter_size": (1, 3), "strides": (1, 2), "padding": padding, "n_out": 4,
                        "with_bias": True}, layout, random_seed=1)
    pool = Pool2D("p", {"mode": "max", "pool_size": (1, 2), "padding": padding}, layout)
    assert conv.frame_by_frame and pool.frame_by_frame
    for layer, reference in ((conv, lambda v: tf.nn.bias_add(tf.nn.conv2d(v, conv.params["W"], [1, 1, 2, 1],
                                                                          "VALID"), conv.params["bias"])),
                             (pool, lambda v: tf.nn.max_pool2d(v, [1, 2], [1, 2], "VALID"))):
        fill = 0.0 if layer is conv else np.finfo(np.float32).min
        batch_major = padded(tf.transpose(x, [1, 0, 2, 3]), tf.constant(lengths), layer.time, layer.space,
                             fill)
        expected = tf.transpose(reference(batch_major), [1, 0, 2, 3]).numpy()
        got = layer(tf.constant(x), tf.constant(lengths), False).numpy()
        for b, n in enumerate(lengths):
            np.testing.assert_allclose(got[:n, b], expected[:n, b], rtol=1e-6, atol=1e-6)


def test_a_chain_of_2d_windows_runs_batch_major_and_equals_the_layers_one_by_one():
    # c1 -> act -> p (one-frame pool) -> c2 (strided), and c3 reading the chain and the time-major input
    network = {
        "split": {"class": "split_dims", "axis": "F", "dims": (4, 2), "from": "data"},
        "c1": {"class": "conv", "filter_size": (3, 3), "padding": "same", "n_out": 3, "with_bias": True,
               "from": "split"},
        "act": {"class": "activation", "activation": "relu", "from": "c1"},
        "p": {"class": "pool", "mode": "max", "pool_size": (1, 2), "padding": "same", "from": "act"},
        "c2": {"class": "conv", "filter_size": (3, 2), "strides": (2, 1), "padding": "same", "n_out": 2,
               "from": "p"},
        "c3": {"class": "conv", "filter_size": (2, 1), "padding": "valid", "n_out": 2,
               "from": ["split", "c1"]},
        "merged": {"class": "merge_dims", "axes": "static", "from": "c2"},
        "merged3": {"class": "merge_dims", "axes": "static", "from": "c3"},
        "output": {"class": "copy", "from": "merged"},
        "aux": {"class": "copy", "from": "merged3", "is_output_layer": True},
    }
    model = build_model(network, input_dim=8, input_sparse=False, target_dims={"classes": 3})
    rng = np.random.RandomState(9)
    lengths = tf.constant([9, 5, 2])
    data = tf.constant(rng.randn(3, 9, 8).astype(np.float32))
    outputs = model(data, lengths)
    layers, x = model.layers, tf.transpose(tf.reshape(data, [3, 9, 4, 2]), [1, 0, 2, 3])
    c1 = layers["c1"](x, lengths, False)
    p = layers["p"](layers["act"](c1, lengths, False), lengths, False)
    c2 = layers["c2"](p, lengths, False)
    c3 = layers["c3"](tf.concat([x, c1], axis=-1), lengths, False)
    out_lengths = layers["c2"].out_lengths(lengths).numpy()
    c3_lengths = layers["c3"].out_lengths(lengths).numpy()
    for name, expected, frames in (("c1", c1, lengths.numpy()), ("c2", c2, out_lengths),
                                   ("c3", c3, c3_lengths)):
        got = outputs[name].numpy()  # batch-major
        for b, n in enumerate(frames):
            np.testing.assert_allclose(got[b, :n], expected.numpy()[:n, b], rtol=1e-6, atol=1e-6)
