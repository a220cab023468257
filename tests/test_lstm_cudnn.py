"""The cuDNN path of ``rec`` layers, proved on the CPU through its twin (``layers/lstm_cudnn.py``).

No GPU run has been made here. What these tests prove: the twin reads the parameter vector the GPU op
``CudnnRNNV3`` gets (``cudnn_params``), and computes what our own LSTM computes, forward and gradients
(inputs, W, b), for variable lengths, both directions and the units with and without forget bias; the
vector is laid out as Keras lays out its own for that op, for an LSTM that Keras' CPU LSTM shows to be
ours; the choice of kernel (``lstm_implementation``) and the one log line naming each layer's kernel."""

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.model import build_model
from engine.model.layers import lstm_choice
from engine.model.layers.lstm import fused_lstm
from engine.model.layers.lstm_choice import (CUDNN, CUDNN_TWIN, NATIVE, NATIVE_SCAN, check_kernel_on,
                                             choose_lstm)
from engine.model.layers.lstm_cudnn import cudnn_params, cudnn_twin
from engine.model.layers.recurrent import Rec
from engine.model.placement import placement_line
from engine.runtime.errors import ConfigError

pytestmark = pytest.mark.tf_latest

N_IN, N_OUT = 5, 4
LENGTHS = [7, 3, 0, 5]  # right-padded to T = 8; a sequence of length 0 too


def batch(seed=0, time=8):
    rng = np.random.RandomState(seed)
    x = rng.randn(time, len(LENGTHS), N_IN).astype("float32")
    upstream = rng.randn(time, len(LENGTHS), N_OUT).astype("float32")
    mask = (np.arange(time)[:, None] < np.array(LENGTHS)[None, :]).astype("float32")[:, :, None]
    return tf.constant(x), tf.constant(LENGTHS, tf.int32), tf.constant(upstream * mask)


def run_layer(layer, x, lengths, upstream):
    """Outputs on valid frames and d/d(x, W, b) of sum(h * upstream), upstream 0 on padded frames (later
    layers and losses read only valid frames)."""

    @tf.function(input_signature=[tf.TensorSpec([None, None, N_IN]), tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([None, None, N_OUT])])
    def run(x, lengths, upstream):
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = layer(x, lengths, True)
            loss = tf.reduce_sum(h * upstream)
        return [h * tf.cast(upstream != 0, h.dtype)] + tape.gradient(loss, [x, layer.params["W"],
                                                                            layer.params["b"]])
    return [t.numpy() for t in run(x, lengths, upstream)]


@pytest.mark.parametrize("unit", ["lstm", "standardlstm", "nativelstmlowmem"])
@pytest.mark.parametrize("direction", [1, -1])
def test_twin_equals_our_lstm_forward_and_gradients(unit, direction):
    opts = {"n_out": N_OUT, "unit": unit, "direction": direction}
    native = Rec("l", opts, N_IN, random_seed=3, implementation="native")
    twin = Rec("l", opts, N_IN, random_seed=3, implementation="cudnn")
    assert (native.kernel, twin.kernel) == (NATIVE, CUDNN_TWIN)
    for key in ("W", "b"):  # the same variables: a checkpoint fits either
        assert native.params[key].shape == twin.params[key].shape
        np.testing.assert_array_equal(native.params[key].numpy(), twin.params[key].numpy())
    rng = np.random.RandomState(1)
    for layer in (native, twin):  # a bias that is not 0, the same in both
        layer.params["b"].assign(rng.randn(4 * N_OUT).astype("float32") * 0.3)
        rng = np.random.RandomState(1)
    ours, theirs = run_layer(native, *batch()), run_layer(twin, *batch())
    assert np.abs(ours[0]).max() > 0.1 and np.abs(ours[2]).max() > 0.1  # not trivially equal
    for name, a, b in zip(("h", "dx", "dW", "db"), ours, theirs):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6, err_msg=name)


def test_twin_outputs_zero_past_each_length():
    x, lengths, _ = batch()
    rng = np.random.RandomState(2)
    weights = tf.constant(rng.randn(N_IN + N_OUT, 4 * N_OUT).astype("float32"))
    h = cudnn_twin(x, lengths, weights, tf.zeros([4 * N_OUT]), N_OUT).numpy()
    for b, length in enumerate(LENGTHS):
        assert not h[length:, b].any() and (length == 0 or np.abs(h[length - 1, b]).max() > 0)


def keras_layout(weights, bias):
    """Our W (rows [input; recurrent], gates i, c, f, o) as Keras' kernel, recurrent kernel and bias
    (gates i, f, c, o), written here independently of the engine's conversion."""
    def reorder(m):
        i, c, f, o = np.split(m, 4, axis=-1)
        return np.concatenate([i, f, c, o], axis=-1)
    return reorder(weights[:N_IN]), reorder(weights[N_IN:]), reorder(bias)


def keras_cudnn_vector(kernel, recurrent, bias):
    """The vector Keras' own GPU LSTM hands ``CudnnRNNV3`` (Keras 2: ``gpu_lstm``; 3: ``_cudnn_lstm``)."""
    weights = tf.split(kernel, 4, axis=1) + tf.split(recurrent, 4, axis=1)
    biases = tf.split(tf.concat([tf.zeros_like(bias), bias], 0), 8)
    try:
        from keras.src.layers.rnn.gru_lstm_utils import canonical_to_params as flat  # Keras 2
    except ImportError:
        from keras.src.backend.tensorflow.rnn import _standardize_cudnn_weights as flat  # Keras 3
    return flat(weights=weights, biases=biases, shape=tf.constant([-1]), transpose_weights=True).numpy()


def test_parameter_vector_is_the_one_keras_gives_cudnn():
    rng = np.random.RandomState(4)
    weights = rng.randn(N_IN + N_OUT, 4 * N_OUT).astype("float32")
    bias = rng.randn(4 * N_OUT).astype("float32")
    ours = cudnn_params(tf.constant(weights), tf.constant(bias), N_IN, N_OUT).numpy()
    np.testing.assert_array_equal(ours, keras_cudnn_vector(*keras_layout(weights, bias)))


def test_keras_lstm_with_that_layout_is_our_lstm():
    """Keras' LSTM on the CPU (its standard path, which its GPU path is tested against upstream) with our
    weights in Keras' layout computes our LSTM: the layout of the test above is the right one."""
    import keras

    rng = np.random.RandomState(5)
    weights = rng.randn(N_IN + N_OUT, 4 * N_OUT).astype("float32") * 0.5
    bias = rng.randn(4 * N_OUT).astype("float32") * 0.3
    x, lengths, upstream = batch()
    layer = keras.layers.LSTM(N_OUT, return_sequences=True)
    batch_major = tf.transpose(x, [1, 0, 2])
    mask = tf.sequence_mask(lengths, tf.shape(x)[0])
    layer(batch_major, mask=mask)  # builds it
    layer.set_weights(list(keras_layout(weights, bias)))
    theirs = tf.transpose(layer(batch_major, mask=mask), [1, 0, 2]).numpy()
    ours = fused_lstm(x, lengths, tf.constant(weights), tf.constant(bias), N_OUT).numpy()
    valid = upstream.numpy() != 0
    np.testing.assert_allclose(theirs[valid], ours[valid], rtol=2e-5, atol=2e-6)


def test_choice_of_kernel():
    assert choose_lstm(None, gpu=False) == NATIVE
    assert choose_lstm("auto", gpu=True) == CUDNN
    assert choose_lstm("AUTO", gpu=False) == NATIVE
    assert choose_lstm("cudnn", gpu=False) == CUDNN_TWIN
    assert choose_lstm("cudnn", gpu=True) == CUDNN
    assert choose_lstm("native", gpu=True) == NATIVE
    assert choose_lstm("auto", gpu=True, twice_differentiable=True) == NATIVE_SCAN
    with pytest.raises(ConfigError, match="'lstm_implementation' is 'cudnn', but maximize_grad_norm"):
        choose_lstm("cudnn", gpu=True, twice_differentiable=True)
    with pytest.raises(ConfigError, match="'lstm_implementation' is 'fast'; expected one of"):
        choose_lstm("fast", gpu=False)


def test_an_op_without_gpu_kernel_is_refused_on_a_gpu(monkeypatch):
    assert "CPU" in lstm_choice.kernel_devices("BlockLSTM")  # the registry of the running TensorFlow
    monkeypatch.setattr(lstm_choice, "kernel_devices", lambda op: {"CPU"})
    with pytest.raises(ConfigError, match="layer 'enc'.*CudnnRNNV3 and CudnnRNNBackpropV3.*silently run on"):
        check_kernel_on(CUDNN, "GPU", "enc")
    check_kernel_on(CUDNN, "CPU", "enc")  # on the CPU nothing is moved
    check_kernel_on(CUDNN_TWIN, "GPU", "enc")  # plain ops
    with pytest.raises(ConfigError, match="BlockLSTM and BlockLSTMGrad"):
        check_kernel_on(NATIVE, "GPU", "enc")
    monkeypatch.setattr(lstm_choice, "kernel_devices", lambda op: {"CPU", "GPU"})
    check_kernel_on(CUDNN, "GPU", "enc")


NETWORK = {"fw": {"class": "rec", "unit": "standardlstm", "n_out": 4, "from": "data"},
           "bw": {"class": "rec", "unit": "lstm", "n_out": 4, "direction": -1, "from": "data"},
           "output": {"class": "softmax", "loss": "ce", "from": ["fw", "bw"]}}


@pytest.mark.parametrize("setting, shown", [(None, "native (BlockLSTM)"),
                                            ("cudnn", "cudnn-twin (plain ops (tf.scan))")])
def test_one_line_names_device_and_each_layers_kernel(setting, shown, capsys):
    config = Config({"network": NETWORK, **({"lstm_implementation": setting} if setting else {})})
    model = build_model(config, input_dim=N_IN, input_sparse=False, target_dims={"classes": 3})
    line = f"model on the CPU, computing in float32: fw: rec {shown}, bw: rec {shown}, output: softmax"
    assert placement_line(model) == line
    assert capsys.readouterr().out.count(line) == 1


def test_network_gives_the_same_scores_with_either_kernel():
    dims = dict(input_dim=N_IN, input_sparse=False, target_dims={"classes": 3})
    native = build_model(Config({"network": NETWORK, "lstm_implementation": "native"}), **dims)
    twin = build_model(Config({"network": NETWORK, "lstm_implementation": "cudnn"}), **dims)
    assert list(native.named_variables()) == list(twin.named_variables())
    x, lengths, _ = batch(seed=6)
    data = tf.transpose(x, [1, 0, 2])
    targets = {"classes": tf.constant(np.random.RandomState(7).randint(0, 3, (4, 8)), tf.int32)}
    scores = []
    for model in (native, twin):
        with tf.GradientTape() as tape:
            losses = model.compute_losses(model(data, lengths), targets, {"classes": lengths})
        grads = tape.gradient(losses.objective, model.trainable_variables)
        scores.append([losses.objective.numpy()] + [g.numpy() for g in grads])
    for a, b in zip(*scores):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
