"""A Conformer hybrid's output path: transposed_conv back up to the frame rate, reinterpret_data onto the
targets' frames, and reuse_params. Their numbers against RETURNN's are fixtures (cases transposed_conv and
transposed_conv_valid of tests/test_returnn_checkpoints.py); here: lengths, batch invariance, parameter
sharing in training, and every refusal."""
import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.model.layers.transposed_conv import TransposedConv
from engine.runtime.errors import ConfigError
from engine.training.update.updater import Updater, optimizer_from_config

HYBRID = {
    "down": {"class": "conv", "filter_size": (3,), "strides": 3, "padding": "same", "n_out": 6,
             "from": "data"},
    "up": {"class": "transposed_conv", "filter_size": [3], "strides": [3], "n_out": 5, "L2": 0.01,
           "from": "down"},
    "up2": {"class": "transposed_conv", "filter_size": [3], "strides": [3], "n_out": 5, "L2": 0.01,
            "reuse_params": "up", "from": "down"},
    "aligned": {"class": "reinterpret_data", "size_base": "data:classes", "from": "up"},
    "aligned2": {"class": "reinterpret_data", "size_base": "data:classes", "from": "up2"},
    "aux": {"class": "softmax", "loss": "ce", "loss_scale": 0.3, "from": "aligned2"},
    "output": {"class": "softmax", "loss": "ce", "from": "aligned"},
}


def hybrid(**changes):
    return build_model({**HYBRID, **changes}, input_dim=4, input_sparse=False, target_dims={"classes": 3})


@pytest.mark.parametrize("size,stride,padding,remove", [
    (3, 3, "same", 0), (4, 2, "same", 0), (2, 3, "same", 0), (4, 2, "valid", 1), (3, 1, "valid", 0)])
def test_transposed_conv_lengths_are_tensorflows_and_a_sequence_gives_its_output_alone(size, stride, padding,
                                                                                       remove):
    rng = np.random.RandomState(size * 10 + stride)
    layer = TransposedConv("t", {"filter_size": [size], "strides": [stride], "padding": padding,
                                 "remove_padding": remove, "n_out": 2}, 3, random_seed=1)
    lengths = [5, 3, 1]
    x = rng.randn(5, 3, 3).astype(np.float32)
    x[3:, 1], x[1:, 2] = 1e3, -1e3  # padding must not reach a sequence's frames
    y = layer(tf.constant(x), tf.constant(lengths), False).numpy()
    out = layer.out_lengths(tf.constant(lengths)).numpy()
    reference = tf.nn.conv2d_transpose(tf.zeros([1, 5, 1, 3]), layer.params["W_native_transposed_conv"],
                                       [1, int(layer.out_lengths(5)) + 2 * remove, 1, 2], [1, stride, 1, 1],
                                       padding.upper())
    assert y.shape[0] == reference.shape[1] - 2 * remove
    for b, n in enumerate(lengths):
        alone = layer(tf.constant(x[:n, b:b + 1]), tf.constant([n]), False).numpy()
        np.testing.assert_allclose(alone[:out[b], 0], y[:out[b], b], rtol=1e-5, atol=1e-5)


def test_reuse_params_shares_one_variable_counted_once_in_training_and_in_l2():
    model = hybrid()
    assert sorted(model.named_variables()) == sorted(["down/W", "up/W_native_transposed_conv", "up/bias",
                                                      "aux/W", "aux/b", "output/W", "output/b"])
    assert model.layers["up2"].params["W_native_transposed_conv"] is model.layers["up"].params[
        "W_native_transposed_conv"]
    assert len(model.trainable_variables) == 7  # the shared ones once: one update each per step
    rng = np.random.RandomState(2)
    data, lengths = rng.randn(2, 7, 4).astype(np.float32), np.array([7, 4], np.int32)
    labels = rng.randint(0, 3, (2, 7)).astype(np.int32)
    out = model(data, lengths, stream_lengths={"classes": lengths})
    assert out["aligned"].shape[1] == 7 and out["output:lengths"].numpy().tolist() == [7, 4]
    losses = model.compute_losses(out, {"classes": labels}, {"classes": lengths})
    shared = [model.layers["up"].params[k] for k in ("W_native_transposed_conv", "bias")]
    squares = sum(float(tf.reduce_sum(v ** 2)) for v in shared)
    # RETURNN adds a reused parameter to its owner's parameters only, so only the owner's L2 counts it
    np.testing.assert_allclose(losses.regularizer, 0.01 * squares, rtol=1e-5)
    updater = Updater(model.named_trainable_variables(), optimizer_from_config("adam"), learning_rate=0.1)
    before = shared[0].numpy()
    with tf.GradientTape() as tape:
        outputs = model(data, lengths, training=True, stream_lengths={"classes": lengths})
        objective = model.compute_losses(outputs, {"classes": labels}, {"classes": lengths}).objective
    params = list(model.trainable_variables)
    updater.apply_gradients(tape.gradient(objective, params), params)
    assert np.abs(shared[0].numpy() - before).max() == pytest.approx(0.1, rel=1e-3)  # one adam step, not two


@pytest.mark.parametrize("owner, reuser, trained", [(False, False, False), (True, False, True)])
def test_trainable_of_a_reusing_layer_is_its_owners(owner, reuser, trained):
    """RETURNN trains a shared parameter when a layer holding it is trainable (2022-swb-conformer-hybrid-sat
    sets False on the owner and its reusers alike)."""
    model = hybrid(up={**HYBRID["up"], "trainable": owner}, up2={**HYBRID["up2"], "trainable": reuser})
    shared = model.layers["up2"].params["W_native_transposed_conv"]
    assert shared is model.layers["up"].params["W_native_transposed_conv"]
    assert shared.trainable is trained
    assert ("up/W_native_transposed_conv" in model.named_trainable_variables()) is trained


def test_size_base_lengths_longer_than_the_frames_stop_the_step():
    model = hybrid()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="'aligned2?': size_base 'data:classes' gives a sequence more frames than"):
        model(np.zeros((1, 3, 4), np.float32), np.array([3]), stream_lengths={"classes": np.array([4])})


def test_size_base_of_a_stream_needs_its_lengths():
    with pytest.raises(ConfigError, match=r"'aligned2?': size_base 'data:classes' needs the lengths of data "
                                          r"stream "
                                          r"'classes', which this run does not read"):
        hybrid()(np.zeros((1, 3, 4), np.float32), np.array([3]))


@pytest.mark.parametrize("changes,message", [
    ({"up2": {**HYBRID["up2"], "reuse_params": {"map": {"W": None}}}}, r"'up2': 'reuse_params' must name "
                                                                       r"another"),
    ({"up2": {**HYBRID["up2"], "reuse_params": "down"}}, r"'up2': 'reuse_params' names 'down', which must "
                                                         r"be a "
                                                         r"transposed_conv layer"),
    ({"up2": {**HYBRID["up2"], "n_out": 4}}, r"'up2': reuse_params 'up' has the parameters"),
    ({"up": {**HYBRID["up"], "trainable": False}, "up2": {**HYBRID["up2"], "trainable": True}},
     r"'up2': 'trainable' True on a layer with reuse_params of 'up', whose parameters are frozen"),
    ({"aligned": {"class": "reinterpret_data", "size_base": "nowhere", "from": "up"}},
     r"'aligned': 'size_base' must name a layer of the network or a data stream"),
    ({"aligned": {"class": "reinterpret_data", "size_base": "data:classes", "enforce_batch_major": True,
                  "set_axes": {"F": 1, "T": 2}, "from": "up"}},
     r"'aligned': set_axes \{'F': 1, 'T': 2\} is implemented only with enforce_batch_major True and naming "
     r"the axes the input \(T, B, F=5\) already has as RETURNN numbers them batch-major "
     r"\(\{'T': 1, 'F': 2\}\)"),
    ({"aligned": {"class": "reinterpret_data", "size_base": "data:classes", "set_axes": {"T": 1},
                  "from": "up"}},
     r"'aligned': set_axes \{'T': 1\} is implemented only with enforce_batch_major"),
    ({"aligned": {"class": "copy", "from": "up"}}, r"'output' has a frame-wise loss .* but layer 'up' "
                                                   r"changes"),
    ({"up": {**HYBRID["up"], "output_padding": [1]}}, r"'up': 'output_padding' is not implemented"),
    ({"up": {**HYBRID["up"], "filter_size": [3, 3]}}, r"'up': 'filter_size' must be a list of one positive "
                                                      r"int"),
])
def test_refusals_name_the_layer(changes, message):
    with pytest.raises(ConfigError, match=message):
        hybrid(**changes)
