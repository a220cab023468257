"""``tf_amp`` and ``lstm_implementation`` on the CPU: speed of a train step, and the dev score after a short
training, for the small model of tests/test_mixed_precision.py (the same network and batches).

- ``score``: per seed (``random_seed`` 1..N, batches offset by it), 30 adam steps then the dev score
  (cross-entropy per frame over 3 held-out batches), float32 against bfloat16: the numbers behind that
  test's tolerance.
- ``speed``: ms per train step (a ``tf.function`` step of the engine, after 3 warm-up steps), median and
  range over rounds, for float32, bfloat16, float16, and for the LSTM kernels native and cudnn (on a
  CPU: the twin). The speed shape is larger (batches of 32 x 100 frames, 256 units): the score model is
  too small to time.

No GPU here: these are CPU numbers; bfloat16's speed on a CPU says nothing about a GPU's.

Run: ``TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 .venv/bin/python benchmarks/bench_amp.py
[--seeds 5] [--rounds 5]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from engine.config.loader import Config  # noqa: E402
from engine.datasets import Batch  # noqa: E402
from engine.distributed.local_backend import LocalCommunicator  # noqa: E402
from engine.distributed.strategy import Strategy  # noqa: E402
from engine.model import build_model  # noqa: E402
from engine.runtime import log  # noqa: E402
from engine.training.step import Steps  # noqa: E402
from engine.training.update.updater import Updater  # noqa: E402


def network(units: int) -> dict:
    return {"hidden": {"class": "linear", "activation": "relu", "n_out": units},
            "lstm": {"class": "rec", "unit": "nativelstm2", "n_out": units, "from": "hidden"},
            "norm": {"class": "layer_norm", "from": "lstm"},
            "att": {"class": "self_attention", "num_heads": 2, "total_key_dim": units // 2,
                    "n_out": units // 2, "from": "norm"},
            "output": {"class": "softmax", "loss": "ce", "from": ["att", "norm"]}}


def batch(seed: int, seqs: int = 8, frames: int = 12) -> Batch:
    rng = np.random.RandomState(seed)
    lengths = rng.randint(frames // 3, frames + 1, seqs).astype(np.int32)
    data = rng.randn(seqs, frames, 5).astype(np.float32)
    classes = data[:, :, :4].argmax(-1).astype(np.int32)
    return Batch(data={"data": data, "classes": classes}, lengths={"data": lengths, "classes": lengths},
                 seq_tags=[str(i) for i in range(seqs)], seq_idx=np.arange(seqs),
                 corpus_seq_idx=np.arange(seqs), num_frames={"data": int(lengths.sum()),
                                                             "classes": int(lengths.sum())})


def make(amp: str | None, units: int, seed: int = 42, lstm: str = "auto") -> Steps:
    config = Config({"network": network(units), "tf_amp": amp, "optimizer": {"class": "adam"},
                     "learning_rate": 0.01, "random_seed": seed, "lstm_implementation": lstm})
    model = build_model(config, input_dim=5, input_sparse=False, target_dims={"classes": 4})
    updater = Updater.from_config(config, model.named_trainable_variables())
    if updater.loss_scale is not None:
        updater.loss_scale.scale.assign(16.0)  # this model's sums overflow 2^15; no skipped steps in timing
    return Steps(model, updater, Strategy(LocalCommunicator()))


def dev_score(amp: str | None, seed: int) -> float:
    steps = make(amp, 16, seed=seed)
    offset = 0 if seed == 42 else 10000 * seed
    for step in range(30):
        steps.train(batch(offset + step))
    scores = np.sum([steps.eval(batch(offset + 1000 + i)) for i in range(3)], axis=0)
    return float(scores[0] / scores[2])


def ms_per_step(amp: str | None, lstm: str, rounds: int) -> list[float]:
    steps = make(amp, 256, lstm=lstm)
    batches = [batch(i, seqs=32, frames=100) for i in range(4)]
    for b in batches[:3]:
        steps.train(b)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for b in batches:
            steps.train(b)
        times.append(1000 * (time.perf_counter() - start) / len(batches))
    return times


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.1f} (range {min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    log.init(verbosity=log.WARNING)
    gaps = []
    for seed in [42] + list(range(1, args.seeds)):
        reference, mixed = dev_score(None, seed), dev_score("bfloat16", seed)
        gaps.append(100 * abs(mixed - reference) / reference)
        print(f"seed {seed}: dev score float32 {reference:.4f}, bfloat16 {mixed:.4f} ({gaps[-1]:.2f}% apart)")
    print(f"bfloat16 vs float32 dev score, % apart: {summary(gaps)}")
    timed = {}
    for amp, lstm in ((None, "native"), ("bfloat16", "native"), ("float16", "native"), (None, "cudnn")):
        timed[(amp, lstm)] = ms_per_step(amp, lstm, args.rounds)
        print(f"{amp or 'float32'}, lstm {lstm}: ms per step {summary(timed[(amp, lstm)])}")
    base = statistics.median(timed[(None, "native")])
    for (amp, lstm), values in timed.items():
        print(f"  {amp or 'float32'}/{lstm} vs float32/native: {base / statistics.median(values):.2f}x speed")


if __name__ == "__main__":
    main()
