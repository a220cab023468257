#!/usr/bin/env python3
"""Read throughput of the engine's batch pipeline against a plain h5py loop, measured side by side.

    .venv/bin/python benchmarks/bench_data.py [--dir DIR] [--mb 120] [--no-step]

Generates a corpus of ``--mb`` MB (speech-like: 200-1000 frames of 40 float32 features plus a sparse
target per frame) in two layouts -- chunked (the streaming writer's, also ours) and contiguous (RETURNN's
``hdf_dump``) -- then reads one random-order epoch with:
  * plain:     ``ds[start:stop]`` per sequence and key, in the same order (nothing else);
  * engine:    ``generate_batches`` + ``BatchPrefetcher`` (padded batches of ``--batch_size`` frames),
               with ``cache_size`` 0 and with a cache holding the whole corpus (first epoch includes
               the preload; the second is served from memory).
Each variant runs ``--repeat`` times interleaved; medians are printed with ratios to the plain loop
(target: >= 0.8x). The file is in the page cache, so this is the demanding case: reading costs about a
memcpy and every overhead of the pipeline shows. Finally (unless ``--no-step``) a 2x128 LSTM train step
on one batch is timed, to say what fraction of a step batch production costs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time

import h5py
import numpy as np

from engine.datasets import (BatchOptions, BatchPrefetcher, DataKeyInfo, HDFDataset, HDFWriter,
                             generate_batches)

DIM, CLASSES = 40, 100


def make_corpus(folder: str, megabytes: float) -> tuple[str, str]:
    rng = np.random.RandomState(0)
    row_bytes = DIM * 4 + 4
    lengths = []
    while sum(lengths) * row_bytes < megabytes * 1e6:
        lengths.append(int(rng.randint(200, 1001)))
    chunked, contiguous = os.path.join(folder, "chunked.hdf"), os.path.join(folder, "contiguous.hdf")
    keys = {"data": DataKeyInfo(dim=DIM), "classes": DataKeyInfo(dim=CLASSES, sparse=True)}
    feats = rng.standard_normal((sum(lengths), DIM)).astype(np.float32)
    labels = rng.randint(0, CLASSES, sum(lengths)).astype(np.int32)
    with HDFWriter(chunked, keys) as writer:
        pos = 0
        for i, n in enumerate(lengths):
            writer.insert(f"seq-{i}", {"data": feats[pos:pos + n], "classes": labels[pos:pos + n]})
            pos += n
    with h5py.File(contiguous, "w") as f:  # RETURNN hdf_dump's layout: fixed-size datasets, S<n> tags
        f.attrs["inputPattSize"] = DIM
        f.create_dataset("seqTags", data=np.array([f"seq-{i}".encode() for i in range(len(lengths))]))
        f.create_dataset("seqLengths", data=np.stack([lengths, lengths], axis=1).astype(np.int32))
        f.create_dataset("inputs", data=feats)
        for sub in ("data", "size", "labels"):
            f.create_group(f"targets/{sub}")
        f["targets/data"].create_dataset("classes", data=labels)
        f["targets/size"].attrs["classes"] = [CLASSES, 1]
        f["targets/labels"].create_dataset("classes", data=np.array([b"c%d" % i for i in range(CLASSES)]))
    return chunked, contiguous


def plain_loop(f: h5py.File, order: np.ndarray) -> tuple[int, int]:
    """The baseline: slice every stream per sequence, in the given order, and nothing else."""
    streams = [f["inputs"], f["targets/data/classes"]]
    lengths = f["seqLengths"][...].astype(np.int64)
    starts = np.cumsum(lengths, axis=0) - lengths
    frames = nbytes = 0
    for i in order.tolist():
        for col, ds in enumerate(streams):
            a = ds[starts[i, col]:starts[i, col] + lengths[i, col]]
            nbytes += a.nbytes
        frames += int(lengths[i, 0])
    return frames, nbytes


def engine_epoch(dataset: HDFDataset, batch_size: int, epoch: int, prefetch: bool) -> tuple[int, int, int]:
    dataset.init_seq_order(epoch)
    batches = generate_batches(dataset, BatchOptions(batch_size))
    frames = nbytes = count = 0
    with BatchPrefetcher(batches) if prefetch else contextlib.nullcontext(batches) as it:
        for batch in it:
            count += 1
            frames += batch.num_frames["data"]
            nbytes += batch.num_frames["data"] * DIM * 4 + batch.num_frames["classes"] * 4
    return frames, nbytes, count


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def bench_layout(name: str, path: str, args) -> float:
    """Prints the table for one file; returns seconds per batch of the engine with cache 0."""
    ds0 = HDFDataset(path, seq_ordering="random", cache_size=0)
    ds0.init_seq_order(1)
    order = ds0.order.copy()
    plain_file = h5py.File(path, "r")
    cached_size = os.path.getsize(path) + (1 << 20)
    ds_cached = HDFDataset(path, seq_ordering="random", cache_size=cached_size)
    engine_epoch(ds_cached, args.batch_size, 1, True)  # loads its cache
    variants = {
        "plain h5py loop": lambda: plain_loop(plain_file, order),
        "engine, cache 0": lambda: engine_epoch(ds0, args.batch_size, 1, True),
        "engine, cache 0, no prefetch": lambda: engine_epoch(ds0, args.batch_size, 1, False),
        "engine, cache all, 1st epoch": lambda: _cached_first_epoch(path, cached_size, args.batch_size),
        "engine, cache all, later epoch": lambda: engine_epoch(ds_cached, args.batch_size, 1, True),
    }
    times: dict[str, list[float]] = {label: [] for label in variants}
    results: dict[str, tuple] = {}
    for _ in range(args.repeat):  # interleaved, so load changes on the machine hit every variant alike
        for label, fn in variants.items():
            seconds, results[label] = timed(fn)
            times[label].append(seconds)
    plain_file.close()
    ds0.close()
    ds_cached.close()
    assert len({r[:2] for r in results.values()}) == 1, "all variants must read the same frames and bytes"
    base = statistics.median(times["plain h5py loop"])
    print(f"\n{name} layout ({os.path.getsize(path) / 1e6:.0f} MB, {len(order)} seqs, random order, "
          f"batch_size {args.batch_size}), median of {args.repeat}:")
    print(f"  {'variant':<34} {'frames/s':>12} {'MB/s':>9} {'ratio':>7} {'ms/batch':>9}")
    for label, values in times.items():
        med = statistics.median(values)
        frames, nbytes = results[label][:2]
        batches = results[label][2] if len(results[label]) > 2 else 0
        ms_batch = f"{med / batches * 1e3:9.2f}" if batches else f"{'':>9}"
        print(f"  {label:<34} {frames / med:12.0f} {nbytes / med / 1e6:9.0f} {base / med:6.2f}x {ms_batch}")
    return statistics.median(times["engine, cache 0"]) / results["engine, cache 0"][2]


def _cached_first_epoch(path: str, cache_size: int, batch_size: int):
    ds = HDFDataset(path, seq_ordering="random", cache_size=cache_size)
    try:
        return engine_epoch(ds, batch_size, 1, True)
    finally:
        ds.close()


def lstm_step_ms(batch_size: int) -> float:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    seqs, frames = 8, batch_size // 8
    inputs = tf.keras.Input((None, DIM))
    x = tf.keras.layers.LSTM(128, return_sequences=True)(inputs)
    x = tf.keras.layers.LSTM(128, return_sequences=True)(x)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(CLASSES)(x))
    opt = tf.keras.optimizers.Adam()
    xs = tf.random.normal((seqs, frames, DIM))
    ys = tf.random.uniform((seqs, frames), 0, CLASSES, dtype=tf.int32)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            losses = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.reduce_mean(losses)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step(xs, ys).numpy()  # trace
    runs = []
    for _ in range(3):
        seconds, _ = timed(lambda: step(xs, ys).numpy())
        runs.append(seconds)
    return statistics.median(runs) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="where to write the corpus (default: a temporary directory)")
    parser.add_argument("--mb", type=float, default=120)
    parser.add_argument("--batch_size", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-step", action="store_true", help="skip the LSTM step timing (no TensorFlow)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        print(f"Writing a {args.mb:.0f} MB corpus in two layouts under {folder} ...")
        seconds, (chunked, contiguous) = timed(lambda: make_corpus(folder, args.mb))
        print(f"  written in {seconds:.1f} s")
        per_batch = bench_layout("chunked (streaming writer)", chunked, args)
        bench_layout("contiguous (hdf_dump)", contiguous, args)
    if not args.no_step:
        step_ms = lstm_step_ms(args.batch_size)
        print(f"\nTrain step of a 2x128 LSTM on one batch of {args.batch_size} frames: {step_ms:.1f} ms; "
              f"producing a batch (cache 0, chunked) costs {per_batch * 1e3:.2f} ms = "
              f"{per_batch * 1e3 / step_ms:.1%} of a step (and runs in the prefetch thread, overlapping it).")


if __name__ == "__main__":
    main()
