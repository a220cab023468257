"""LSTM implementations on the engine benchmark's shape, side by side in one run.

Shape: 2-layer LSTM of 128 units on 40-dim input, softmax over 50 classes, batches of at most 5000 padded
frames and 40 sequences with lengths 50-250, Adam; forward + backward + update in one ``tf.function``,
one TensorFlow thread. Implementations:
- ``engine``: the engine's ``rec`` layer (``lstm.fused_lstm``: TensorFlow's fused ``BlockLSTM``
  kernel forward, on the CPU our own backward), via ``build_model``.
- ``blocklstmgrad``: the same ``BlockLSTM`` forward with TensorFlow's own gradient, ``BlockLSTMGrad``
  (what the engine ran before: its per-step packing of the transposed weights was 43% of a step).
- ``while_loop``: the same LSTM as a masked cell in ``tf.while_loop`` (input projection hoisted out).
- ``keras``: ``keras.layers.LSTM`` with a mask (Keras 2 on TF 2.15, Keras 3 on TF 2.21).

Run: ``TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 python benchmarks/bench_lstm.py [--rounds 5]``.
Prints ms per step, wall and CPU (median over rounds; the machine is noisy, so compare the ratios).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from engine.model import build_model  # noqa: E402
from engine.training.update.updater import Updater, optimizer_from_config  # noqa: E402

DIM, UNITS, CLASSES, BATCH_FRAMES, MAX_SEQS = 40, 128, 50, 5000, 40
NETWORK = {
    "lstm1": {"class": "rec", "unit": "nativelstm2", "n_out": UNITS},
    "lstm2": {"class": "rec", "unit": "nativelstm2", "n_out": UNITS, "from": "lstm1"},
    "output": {"class": "softmax", "loss": "ce", "from": "lstm2"},
}


def make_batches(rng: np.random.RandomState, count: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Batches as the engine's batcher builds them: add sequences while max_len * num_seqs fits."""
    batches = []
    for _ in range(count):
        lengths: list[int] = []
        while len(lengths) < MAX_SEQS:
            n = rng.randint(50, 251)
            if max(lengths + [n]) * (len(lengths) + 1) > BATCH_FRAMES:
                break
            lengths.append(n)
        t = max(lengths)
        x = rng.randn(len(lengths), t, DIM).astype("float32")
        y = rng.randint(0, CLASSES, size=(len(lengths), t)).astype("int32")
        batches.append((x, np.array(lengths, np.int32), y))
    return batches


def masked_ce(logits, labels, lengths):
    mask = tf.sequence_mask(lengths, tf.shape(labels)[1], tf.float32)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_sum(ce * mask) / tf.reduce_sum(mask)


def compiled_step(loss_fn, variables):
    updater = Updater(list(variables), optimizer_from_config("adam"), learning_rate=1e-3)
    spec = [
        tf.TensorSpec([None, None, DIM]),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None, None], tf.int32),
    ]

    @tf.function(input_signature=spec)
    def step(x, lengths, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(x, lengths, y)
        updater.apply_gradients(tape.gradient(loss, variables), variables)
        return loss

    return step


def engine_step():
    model = build_model(NETWORK, input_dim=DIM, input_sparse=False, target_dims={"classes": CLASSES})

    def loss(x, lengths, y):
        res = model.compute_losses(model(x, lengths, training=True), {"classes": y}, {"classes": lengths})
        return res.objective

    return compiled_step(loss, list(model.trainable_variables))


def block_lstm_grad_step():
    """BlockLSTM differentiated by TensorFlow's registered gradient."""
    model = build_model(NETWORK, input_dim=DIM, input_sparse=False, target_dims={"classes": CLASSES})
    params = model.named_variables()

    def lstm(x, lengths, w, b):
        steps = tf.cast(tf.reduce_max(lengths), tf.int64)
        zeros = tf.zeros([tf.shape(x)[1], UNITS])
        peephole = tf.zeros([UNITS])
        return tf.raw_ops.BlockLSTM(seq_len_max=steps, x=x, cs_prev=zeros, h_prev=zeros, w=w, wci=peephole,
                                    wcf=peephole, wco=peephole, b=b, forget_bias=0.0, cell_clip=-1.0,
                                    use_peephole=False)[6]

    return compiled_step(two_layer_loss(lstm, params, lambda x, lengths: lengths), list(params.values()))


def two_layer_loss(lstm, params, lstm_arg):
    """The benchmark network's loss with ``lstm(x, lstm_arg(x, lengths), W, b)`` as its LSTM layers."""
    def loss(x, lengths, y):
        extra = lstm_arg(x, lengths)
        h = tf.transpose(x, [1, 0, 2])
        h = lstm(h, extra, params["lstm1/W"], params["lstm1/b"])
        h = lstm(h, extra, params["lstm2/W"], params["lstm2/b"])
        logits = tf.einsum("tbf,fc->btc", h, params["output/W"]) + params["output/b"]
        return masked_ce(logits, y, lengths)

    return loss


def while_loop_step():
    """Masked LSTM cell in a while loop: state frozen on padded frames, inputs read via TensorArray."""
    model = build_model(NETWORK, input_dim=DIM, input_sparse=False, target_dims={"classes": CLASSES})
    params = model.named_variables()

    def lstm(x, mask, w, b):  # x (T, B, F) time-major, mask (T, B, 1)
        n_in = x.shape[-1]
        steps, batch = tf.shape(x)[0], tf.shape(x)[1]
        w_in, w_rec = w[:n_in], w[n_in:]  # sliced outside the loop: a slice's gradient per step is costly
        proj = tf.reshape(tf.matmul(tf.reshape(x, [-1, n_in]), w_in) + b, [steps, batch, 4 * UNITS])
        inputs = tf.TensorArray(tf.float32, size=steps).unstack(proj)
        masks = tf.TensorArray(tf.bool, size=steps).unstack(mask)

        def body(t, h, c, out):
            i, ci, f, o = tf.split(inputs.read(t) + tf.matmul(h, w_rec), 4, axis=1)
            c_new = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(ci)
            h_new = tf.sigmoid(o) * tf.tanh(c_new)
            m = masks.read(t)
            h, c = tf.where(m, h_new, h), tf.where(m, c_new, c)
            return t + 1, h, c, out.write(t, h_new)

        zeros = tf.zeros([batch, UNITS])
        out = tf.while_loop(
            lambda t, *_: t < steps, body, (0, zeros, zeros, tf.TensorArray(tf.float32, size=steps))
        )
        return out[3].stack()

    def time_major_mask(x, lengths):
        return tf.transpose(tf.sequence_mask(lengths, tf.shape(x)[1]))[:, :, None]

    return compiled_step(two_layer_loss(lstm, params, time_major_mask), list(params.values()))


def keras_step():
    tf.keras.utils.set_random_seed(0)
    layers = [
        tf.keras.layers.LSTM(UNITS, return_sequences=True),
        tf.keras.layers.LSTM(UNITS, return_sequences=True),
        tf.keras.layers.Dense(CLASSES),
    ]
    model = tf.keras.Sequential(layers)
    model.build((None, None, DIM))

    def loss(x, lengths, y):
        mask = tf.sequence_mask(lengths, tf.shape(x)[1])
        h = layers[1](layers[0](x, mask=mask), mask=mask)
        return masked_ce(layers[2](h), y, lengths)

    variables = [
        getattr(v, "value", v) if not isinstance(v, tf.Variable) else v for v in model.trainable_variables
    ]
    return compiled_step(loss, variables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=4, help="batches per round")
    args = parser.parse_args()
    batches = make_batches(np.random.RandomState(0), args.batches)
    frames = sum(int(lengths.sum()) for _, lengths, _ in batches)
    padded = sum(x.shape[0] * x.shape[1] for x, _, _ in batches)
    steps = {"engine": engine_step(), "blocklstmgrad": block_lstm_grad_step(),
             "while_loop": while_loop_step(), "keras": keras_step()}
    for step in steps.values():  # trace and warm up
        step(*batches[0])
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):  # interleaved, so drifting machine load hits all alike
        for name, step in steps.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for batch in batches:
                step(*batch).numpy()
            times[name].append((time.perf_counter() - start) / len(batches) * 1000)
            cpu[name].append((time.process_time() - start_cpu) / len(batches) * 1000)
    print(
        f"TensorFlow {tf.__version__}, {len(batches)} batches of {padded / len(batches):.0f} padded frames "
        f"({frames / padded:.0%} non-padded), {args.rounds} rounds, 1 thread"
    )
    base = float(np.median(times["engine"]))
    base_cpu = float(np.median(cpu["engine"]))
    for name, values in times.items():
        median, median_cpu = float(np.median(values)), float(np.median(cpu[name]))
        print(
            f"{name:13s} {median:7.1f} ms/step  {median / base:5.2f}x the engine's time  "
            f"{frames / len(batches) / median * 1000:8.0f} frames/s   CPU {median_cpu:7.1f} ms/step "
            f"{median_cpu / base_cpu:5.2f}x the engine's"
        )


if __name__ == "__main__":
    main()
