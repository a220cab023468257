"""RETURNN's window, pad and swap_axes. Their numbers against RETURNN's are in the fixtures (cases window,
window_stride, pad_time, pad_swap of tests/test_returnn_checkpoints.py); here: each layer against numpy,
its output axes and lengths, the network's checks of time axes, and every refusal."""
import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.model.axes import Layout
from engine.model.layers.window_pad import Pad, SwapAxes, Window, changes_time
from engine.runtime.errors import ConfigError

LENGTHS = np.array([6, 4, 1], np.int32)


def _batch(shape: tuple[int, ...]) -> np.ndarray:
    """(T, B, ...) values, nonzero in the padding too (a layer must not read it)."""
    return np.random.RandomState(0).standard_normal(shape).astype(np.float32)


def _windows(x: np.ndarray, lengths: np.ndarray, size: int, left: int, stride: int,
             n_out: int) -> np.ndarray:
    """numpy: output frame t of sequence b holds input frames t*stride - left + k, k < size, as
    (T', B, W, ...); frames outside the sequence are 0."""
    out = np.zeros((n_out, x.shape[1], size) + x.shape[2:], np.float32)
    for t in range(n_out):
        for b, n in enumerate(lengths):
            for k in range(size):
                pos = t * stride - left + k
                if 0 <= pos < n:
                    out[t, b, k] = x[pos, b]
    return out


@pytest.mark.parametrize("opts,left,n_out,out_lengths", [
    ({"window_size": 3}, 1, 6, [6, 4, 1]),
    ({"window_size": 4}, 1, 6, [6, 4, 1]),  # even: one frame more on the right
    ({"window_size": 5, "window_left": 4}, 4, 6, [6, 4, 1]),
    ({"window_size": 5, "window_right": 0, "window_left": 4}, 4, 6, [6, 4, 1]),
    ({"window_size": 3, "window_right": 2, "stride": 3}, 0, 2, [2, 2, 1]),  # feature stacking
    ({"window_size": 4, "stride": 2}, 1, 3, [3, 2, 1]),
    ({"window_size": 3, "padding": "valid"}, 0, 4, [4, 2, 0]),
    ({"window_size": 2, "padding": "valid", "stride": 2}, 0, 3, [3, 2, 0]),
])
def test_window_is_numpys_sliding_window_over_each_sequence(opts, left, n_out, out_lengths):
    x = _batch((6, 3, 2, 5))  # (T, B, S, F): the window goes before S, right after B
    layer = Window("w", {**opts, "axis": "T"}, Layout((2,), 5))
    assert (layer.spatial, layer.n_out) == ((opts["window_size"], 2), 5)
    got = layer(tf.constant(x), tf.constant(LENGTHS), False).numpy()
    np.testing.assert_array_equal(got, _windows(x, LENGTHS, opts["window_size"], left, opts.get("stride", 1),
                                                n_out))
    assert layer.out_lengths(tf.constant(LENGTHS)).numpy().tolist() == out_lengths
    assert layer.changes_time == changes_time("window", opts) == (n_out != 6)


def test_pad_on_time_adds_frames_of_value_and_lengths():
    x = _batch((4, 3, 2))
    lengths = np.array([4, 3, 1], np.int32)
    left = Pad("p", {"axes": "T", "padding": (1, 0), "mode": "constant", "value": 0.5}, Layout((), 2))
    got = left(tf.constant(x), tf.constant(lengths), False).numpy()
    np.testing.assert_array_equal(got, np.concatenate([np.full((1, 3, 2), 0.5, np.float32), x]))
    assert left.out_lengths(tf.constant(lengths)).numpy().tolist() == [5, 4, 2]
    both = Pad("p", {"axes": "t", "padding": (1, 2), "value": -1, "handle_dynamic_dims": True}, Layout((), 2))
    got = both(tf.constant(x), tf.constant(lengths), False).numpy()
    assert got.shape == (7, 3, 2) and both.out_lengths(tf.constant(lengths)).numpy().tolist() == [7, 6, 4]
    for b, n in enumerate(lengths):  # each sequence: -1, its frames, -1 up to its new length (and beyond)
        np.testing.assert_array_equal(got[1:1 + n, b], x[:n, b])
        assert (got[0, b] == -1).all() and (got[1 + n:, b] == -1).all()


@pytest.mark.parametrize("opts,np_pad", [
    ({"axes": ("s:0", "s:1"), "padding": [(0, 0), (2, 2)]},
     lambda x: np.pad(x, [(0, 0), (0, 0), (2, 2), (0, 0)])),
    ({"axes": ["F", "s:1"], "padding": 1, "value": 0.25},
     lambda x: np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=0.25)),
    ({"axes": "F", "padding": (1, 2), "mode": "REFLECT", "value": 3},  # value: only for "constant"
     lambda x: np.pad(x, [(0, 0), (0, 0), (0, 0), (1, 2)], mode="reflect")),
    ({"axes": "s:1", "padding": 3, "mode": "symmetric"},
     lambda x: np.pad(x, [(0, 0), (0, 0), (3, 3), (0, 0)], mode="symmetric")),
    ({"axes": "f", "padding": (2, 1), "mode": "replication"},
     lambda x: np.pad(x, [(0, 0), (0, 0), (0, 0), (2, 1)], mode="edge")),
])
def test_pad_on_static_axes_is_numpys_pad(opts, np_pad):
    x = _batch((5, 3, 3, 4))
    layer = Pad("p", opts, Layout((3,), 4))
    want = np_pad(x)
    np.testing.assert_array_equal(layer(tf.constant(x), tf.constant(LENGTHS), False).numpy(), want)
    assert (layer.spatial, layer.n_out) == (want.shape[2:3], want.shape[3])
    assert not layer.changes_time and not changes_time("pad", opts)


def test_swap_axes_swaps_static_axes_and_the_last_stays_the_features():
    x = _batch((5, 3, 2, 4, 3))
    layer = SwapAxes("s", {"axis1": "s:1", "axis2": "f"}, Layout((2, 4), 3))
    np.testing.assert_array_equal(layer(tf.constant(x), None, False).numpy(), np.swapaxes(x, 2, 4))
    assert (layer.spatial, layer.n_out) == ((3, 4), 2)
    inner = SwapAxes("s", {"axis1": "s:2", "axis2": "static:0"}, Layout((2, 4), 3))
    assert (inner.spatial, inner.n_out) == ((4, 2), 3)


def test_a_network_windows_pads_and_swaps_in_returnns_axis_order():
    network = {"win": {"class": "window", "window_size": 3, "from": "data"},  # (T, B, 3, 4)
               "ff_in": {"class": "merge_dims", "axes": "except_time", "from": "win"},  # window major
               "split": {"class": "split_dims", "axis": "F", "dims": (2, 2), "from": "data"},
               "swapped": {"class": "swap_axes", "axis1": "s:1", "axis2": "f", "from": "split"},
               "padded": {"class": "pad", "axes": "s:1", "padding": (0, 1), "from": "swapped"},
               "flat": {"class": "merge_dims", "axes": "static", "from": "padded"},
               "output": {"class": "softmax", "n_out": 3, "loss": "ce", "from": ["ff_in", "flat"]}}
    model = build_model(network, input_dim=4, input_sparse=False, target_dims={"classes": 3}, random_seed=1)
    data = _batch((3, 5, 4))
    out = model(data, np.array([5, 3, 2]))
    assert out["ff_in"].shape == (3, 5, 12) and out["flat"].shape == (3, 5, 6)
    np.testing.assert_array_equal(out["ff_in"][0, 1].numpy(), data[0, 0:3].reshape(-1))
    want = np.pad(np.swapaxes(data.reshape(3, 5, 2, 2), 2, 3), [(0, 0), (0, 0), (0, 1), (0, 0)])
    np.testing.assert_array_equal(out["flat"].numpy()[0], want[0].reshape(5, 6))


@pytest.mark.parametrize("network,message", [
    ({"win": {"class": "window", "window_size": 3, "stride": 3, "from": "data"},
      "m": {"class": "merge_dims", "axes": "static", "from": "win"},
      "output": {"class": "softmax", "n_out": 3, "loss": "ce", "from": "m"}},
     r"'output' has a frame-wise loss .* layer 'win' changes the number of frames"),
    ({"pad": {"class": "pad", "axes": "T", "padding": (1, 0), "from": "data"},
      "output": {"class": "softmax", "n_out": 3, "loss": "ctc", "from": ["pad", "data"]}},
     r"'output': its sources \['pad', 'data'\] are on different time axes"),
    ({"win": {"class": "window", "window_size": 3, "window_dim": 3, "from": "data"},
      "output": {"class": "copy", "from": "win"}}, r"layer 'win' \(window\) option 'window_dim'"),
    ({"pad": {"class": "pad", "axes": "F", "padding": 1, "out_dims": None, "from": "data"},
      "output": {"class": "copy", "from": "pad"}}, r"layer 'pad' \(pad\) option 'out_dims'"),
])
def test_the_network_checks_their_time_axes_and_options(network, message):
    with pytest.raises(ConfigError, match=message):
        build_model(network, input_dim=4, input_sparse=False, target_dims={"classes": 3}, random_seed=1)


def test_sparse_data_is_refused():
    network = {"win": {"class": "window", "window_size": 3, "from": "data"},
               "output": {"class": "copy", "from": "win"}}
    with pytest.raises(ConfigError, match=r"'win': RETURNN's window layer takes dense input"):
        build_model(network, input_dim=4, input_sparse=True, target_dims={}, random_seed=1)


FLAT, SPLIT = Layout((), 4), Layout((2,), 3)


@pytest.mark.parametrize("make,message", [
    (lambda: Window("w", {}, FLAT), r"'w': 'window_size' must be a positive int"),
    (lambda: Window("w", {"window_size": 3, "stride": 0}, FLAT), r"'stride' must be a positive int"),
    (lambda: Window("w", {"window_size": 3, "padding": "SAME"}, FLAT), r"'same' or 'valid' \(lower case"),
    (lambda: Window("w", {"window_size": 3, "axis": "F"}, FLAT), r"'axis' 'F' is not the time axis"),
    (lambda: Window("w", {"window_size": 3, "axis": "static"}, SPLIT), r"must name one axis"),
    (lambda: Window("w", {"window_size": 3, "window_left": 3}, FLAT),
     r"'window_left' must be an int from 0 to"),
    (lambda: Window("w", {"window_size": 3, "window_right": -1}, FLAT), r"'window_right' must be an int"),
    (lambda: Window("w", {"window_size": 3, "window_left": 1, "window_right": 0}, FLAT),
     r"window_left 1 \+ window_right 0 \+ 1 must be window_size 3"),
    (lambda: Window("w", {"window_size": 3, "window_left": 1, "padding": "valid"}, FLAT),
     r"go with padding 'same' only"),
    (lambda: Pad("p", {"axes": "T", "padding": (0, 1)}, FLAT), r"right padding of the time axis needs"),
    (lambda: Pad("p", {"axes": "T", "padding": (1, 0), "mode": "reflect"}, FLAT),
     r"mode 'reflect' on the time axis reads frames past"),
    (lambda: Pad("p", {"axes": "spatial", "padding": (1, 0)}, FLAT), r"name it 'T' to pad it"),
    (lambda: Pad("p", {"axes": "B", "padding": 1}, FLAT), r"must name different axes .*, not the batch"),
    (lambda: Pad("p", {"axes": ["F", "f"], "padding": 1}, FLAT), r"must name different axes"),
    (lambda: Pad("p", {"axes": "static", "padding": 1}, SPLIT), r"must name one axis"),
    (lambda: Pad("p", {"axes": "F", "padding": -1}, FLAT), r"'padding' must hold ints >= 0"),
    (lambda: Pad("p", {"axes": ["F", "s:1"], "padding": [(1, 1)]}, SPLIT), r"one pair per axis"),
    (lambda: Pad("p", {"axes": "F", "padding": 1, "mode": "circular"}, FLAT),
     r"'mode' must be one of constant, reflect, symmetric, replication"),
    (lambda: Pad("p", {"axes": ["F", "s:1"], "padding": 1, "mode": "replication"}, SPLIT),
     r"'replication' pads one axis only"),
    (lambda: Pad("p", {"axes": "F", "padding": 4, "mode": "reflect"}, FLAT), r"by at most 3 on a side"),
    (lambda: Pad("p", {"axes": "F", "padding": 1, "value": "const"}, FLAT), r"'value' must be a number"),
    (lambda: Pad("p", {"axes": "F", "padding": 1, "handle_dynamic_dims": 1.0}, FLAT),
     r"'handle_dynamic_dims' must be True or False"),
    (lambda: SwapAxes("s", {"axis1": "T", "axis2": "F"}, SPLIT), r"swapping the time or batch axis"),
    (lambda: SwapAxes("s", {"axis1": "s:0", "axis2": "s:1"}, SPLIT), r"swapping the time or batch axis"),
    (lambda: SwapAxes("s", {"axis1": "F", "axis2": "f"}, SPLIT), r"name the same axis"),
    (lambda: SwapAxes("s", {"axis1": "F"}, SPLIT), r"'axis1' and 'axis2' are required"),
])
def test_refusals_name_the_layer_and_the_reason(make, message):
    with pytest.raises(ConfigError, match=message):
        make()
