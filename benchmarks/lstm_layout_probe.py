"""The engine's cuDNN LSTM against an LSTM laid out independently of it; run by ``gpu_check.py``:

    python benchmarks/lstm_layout_probe.py gpu|cpu

The engine hands ``CudnnRNNV3`` its ``W``/``b`` converted into cuDNN's flat parameter vector
(``lstm_cudnn.cudnn_params``). Its CPU twin reads that vector back with the engine's own reading of
cuDNN's layout, so the twin against the engine's kernel (the dry mode's speed rows) cannot see a
layout error that the writing and the reading share. Independent of both is Keras: its LSTM takes the
same weights in Keras' layout (the gate blocks reordered here, by hand), and on a GPU Keras converts them
into cuDNN's vector itself. Two comparisons, printed as one line each:

- ``vector``: the engine's parameter vector against the one Keras builds for cuDNN from the same weights
  (on any device; a layout error shows here);
- ``outputs``: the engine's LSTM through cuDNN (on a GPU: ``CudnnRNNV3`` itself; on the CPU: the twin)
  against Keras' LSTM (on a GPU its cuDNN path, on the CPU its plain one), variable lengths, valid frames.

Exits 1 when either differs. TensorFloat-32 is off, so that both sides compute in float32.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the engine

N_IN, N_OUT, LENGTHS = 24, 16, (37, 12, 1, 29)  # right-padded to the longest
OUTPUT_TOLERANCE = 1e-4  # float32 rounding of two summation orders; a layout error is of order 0.1


def keras_layout(weights: np.ndarray, bias: np.ndarray) -> list[np.ndarray]:
    """The engine's W (rows [input; recurrent], gate columns i, c, f, o) and b as Keras' kernel,
    recurrent kernel and bias (gate columns i, f, c, o), by hand."""
    def to_keras(m: np.ndarray) -> np.ndarray:
        i, c, f, o = np.split(m, 4, axis=-1)
        return np.concatenate([i, f, c, o], axis=-1)
    return [to_keras(weights[:N_IN]), to_keras(weights[N_IN:]), to_keras(bias)]


def keras_cudnn_vector(kernel: np.ndarray, recurrent: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The vector Keras' own GPU LSTM hands ``CudnnRNNV3`` (Keras 2: ``gpu_lstm``; 3: ``_cudnn_lstm``)."""
    import tensorflow as tf

    try:
        from keras.src.layers.rnn.gru_lstm_utils import canonical_to_params as flatten  # Keras 2
    except ImportError:
        from keras.src.backend.tensorflow.rnn import _standardize_cudnn_weights as flatten  # Keras 3
    weights = tf.split(kernel, 4, axis=1) + tf.split(recurrent, 4, axis=1)
    biases = tf.split(tf.concat([tf.zeros_like(bias), bias], 0), 8)  # Keras too: zeros, then the bias
    return flatten(weights=weights, biases=biases, shape=tf.constant([-1]), transpose_weights=True).numpy()


def compare(device: str) -> tuple[float, float]:
    """(max |difference| of the vectors, of the outputs on valid frames) on ``device`` ("gpu" | "cpu")."""
    import keras
    import tensorflow as tf

    from engine.model.layers.lstm_cudnn import cudnn_lstm, cudnn_params, cudnn_twin

    rng = np.random.RandomState(11)
    weights = (rng.randn(N_IN + N_OUT, 4 * N_OUT) * 0.3).astype(np.float32)
    bias = (rng.randn(4 * N_OUT) * 0.3).astype(np.float32)
    x = rng.randn(max(LENGTHS), len(LENGTHS), N_IN).astype(np.float32)
    ours_vector = cudnn_params(tf.constant(weights), tf.constant(bias), N_IN, N_OUT).numpy()
    vector_diff = float(np.abs(ours_vector - keras_cudnn_vector(*keras_layout(weights, bias))).max())
    lengths = tf.constant(LENGTHS, tf.int32)
    with tf.device(f"/device:{device.upper()}:0"):
        lstm = cudnn_lstm if device == "gpu" else cudnn_twin
        ours = lstm(tf.constant(x), lengths, tf.constant(weights), tf.constant(bias), N_OUT).numpy()
        layer = keras.layers.LSTM(N_OUT, return_sequences=True)
        batch_major = tf.constant(x.transpose(1, 0, 2))
        mask = tf.sequence_mask(lengths, max(LENGTHS))
        layer(batch_major, mask=mask)  # builds it
        layer.set_weights(keras_layout(weights, bias))
        theirs = layer(batch_major, mask=mask).numpy().transpose(1, 0, 2)
    valid = np.arange(max(LENGTHS))[:, None] < np.array(LENGTHS)[None, :]
    return vector_diff, float(np.abs(ours[valid] - theirs[valid]).max())


def main() -> int:
    device = sys.argv[1] if len(sys.argv) == 2 else ""
    if device not in ("gpu", "cpu"):
        sys.exit("usage: lstm_layout_probe.py gpu|cpu")
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(False)
    vector_diff, output_diff = compare(device)
    kernel = "CudnnRNNV3" if device == "gpu" else "the CPU twin"
    ok_vector, ok_outputs = vector_diff == 0, output_diff <= OUTPUT_TOLERANCE
    print(f"lstm-layout: vector {'equal' if ok_vector else 'DIFFERENT'}: the engine's cuDNN parameter "
          f"vector against Keras' for the same weights (max |diff| {vector_diff:.2g})", flush=True)
    print(f"lstm-layout: outputs {'equal' if ok_outputs else 'DIFFERENT'}: the engine's LSTM through "
          f"{kernel} against Keras' LSTM on the {device.upper()} (max |diff| {output_diff:.2g} on valid "
          "frames)", flush=True)
    return 0 if ok_vector and ok_outputs else 1


if __name__ == "__main__":
    sys.exit(main())
