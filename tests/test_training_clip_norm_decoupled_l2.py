"""``gradient_clip_norm`` and ``decouple_constraints`` against updates written out by hand in numpy.

RETURNN's TensorFlow updater (returnn/tf/updater.py) post-processes each (reduced) gradient in this order:
the maximize_grad_norm term, noise, clipping by value, ``gradient_clip_norm`` (each tensor scaled to at
most that L2 norm of its own), global-norm scaling (by the norm of the gradients as they came). With
``decouple_constraints`` a layer's ``L2`` is no loss term: before the optimizer's update every parameter
of the layer is multiplied by (1 - 2 L2), whatever the learning rate. The references below compute
forward, backward, reduction over ranks, clipping, decay and optimizer in numpy (float64) for a
two-layer network (tanh hidden layer with L2, softmax output without), and compare the engine's
parameters after two steps, in one process and on two ranks with real mpirun.
"""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from engine.config.key_check import IMPLEMENTED, NO_EFFECT, config_findings
from engine.config.loader import Config
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.strategy import Strategy
from engine.model import build_model
from engine.runtime.errors import ConfigError
from engine.training.step import Steps
from engine.training.update.gradients import GradientOptions, process_gradients
from engine.training.update.updater import Updater
from helpers import ROOT, run_mpi

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "update_steps.py")
L2 = 0.05
NETWORK = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 3, "L2": L2},
           "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}
DECAYED = ("hidden/W", "hidden/b")  # the L2 layer's parameters: weights and bias, as in RETURNN
SEED = tf.constant([7, 3], tf.int64)


# ----- the hand-written reference -----

def gradients(p: dict, data: np.ndarray, classes: np.ndarray, lengths: np.ndarray) -> tuple[dict, int]:
    """Gradients of the cross-entropy summed over the non-padded frames (RETURNN's objective), and their
    number."""
    valid = np.arange(data.shape[1])[None, :] < lengths[:, None]
    x, y = data[valid].astype(np.float64), classes[valid]
    h = np.tanh(x @ p["hidden/W"] + p["hidden/b"])
    z = h @ p["output/W"] + p["output/b"]
    prob = np.exp(z - z.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    dz = prob - np.eye(3)[y]
    dh = dz @ p["output/W"].T * (1.0 - h * h)
    return {"hidden/W": x.T @ dh, "hidden/b": dh.sum(0), "output/W": h.T @ dz, "output/b": dz.sum(0)}, len(y)


def clip_norm(g: np.ndarray, c: float) -> np.ndarray:
    return g * c / max(math.sqrt(float(np.sum(g * g))), c) if c else g


class NumpyOptimizer:
    """sgd or adam (TensorFlow 1's formula, epsilon 1e-16: RETURNN's optimizer_epsilon)."""

    def __init__(self, params: dict, name: str, lr: float) -> None:
        self.p = {k: v.astype(np.float64) for k, v in params.items()}
        self.name, self.lr, self.t = name, lr, 0
        self.m = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.p.items()}

    def update(self, grads: dict, decay: float) -> None:
        self.t += 1
        lr_t = self.lr * math.sqrt(1 - 0.999 ** self.t) / (1 - 0.9 ** self.t)
        for k, g in grads.items():
            if decay and k in DECAYED:  # before the update, independent of the learning rate
                self.p[k] = self.p[k] - decay * self.p[k]
            if self.name == "sgd":
                self.p[k] = self.p[k] - self.lr * g
            else:
                self.m[k] = 0.9 * self.m[k] + 0.1 * g
                self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
                self.p[k] = self.p[k] - lr_t * self.m[k] / (np.sqrt(self.v[k]) + 1e-16)


def reference(initial: dict, steps: list, *, optimizer: str, lr: float, clip: float = 0.0,
              decouple: bool = False, reduce: str = "average") -> tuple[dict, list]:
    """The parameters after ``steps`` (per step: each rank's (data, classes, lengths)), and the norms of
    the gradients before clipping. ``reduce``: 'average' or 'sum' of the ranks' gradients (grad mode), or
    'param' (each rank updates alone, then the parameters are averaged)."""
    ranks = len(steps[0])
    runs = [NumpyOptimizer(initial, optimizer, lr) for _ in range(ranks if reduce == "param" else 1)]
    norms = []
    for batches in steps:
        per_rank = []
        for r, batch in enumerate(batches):
            run = runs[r if reduce == "param" else 0]
            g, _ = gradients(run.p, *batch)
            if not decouple:  # RETURNN's L2 * sum(w^2) on the summed loss
                g = {k: v + 2 * L2 * run.p[k] if k in DECAYED else v for k, v in g.items()}
            per_rank.append(g)
        if reduce == "param":
            for run, g in zip(runs, per_rank):
                norms += [math.sqrt(float(np.sum(v * v))) for v in g.values()]
                run.update({k: clip_norm(v, clip) for k, v in g.items()}, 2 * L2 if decouple else 0.0)
            for k in initial:
                mean = np.mean([run.p[k] for run in runs], axis=0)
                for run in runs:
                    run.p[k] = mean.copy()
        else:
            total = {k: sum(g[k] for g in per_rank) / (ranks if reduce == "average" else 1) for k in initial}
            norms += [math.sqrt(float(np.sum(v * v))) for v in total.values()]
            runs[0].update({k: clip_norm(v, clip) for k, v in total.items()}, 2 * L2 if decouple else 0.0)
    return runs[0].p, norms


def assert_matches(engine: dict, initial: dict, steps: list, **setting) -> None:
    """The engine's parameters equal the reference's, and not those of the reference without the clipping
    or with the other L2 treatment (so the comparison can tell them apart); the clipping was active."""
    want, norms = reference(initial, steps, **setting)
    for k in initial:
        np.testing.assert_allclose(engine[k], want[k], rtol=2e-5, atol=2e-6, err_msg=k)
    if setting.get("clip"):
        assert max(norms) > setting["clip"]
        unclipped, _ = reference(initial, steps, **{**setting, "clip": 0.0})
        assert not all(np.allclose(engine[k], unclipped[k], rtol=1e-4, atol=1e-5) for k in initial)
    other, _ = reference(initial, steps, **{**setting, "decouple": not setting.get("decouple", False)})
    assert not all(np.allclose(engine[k], other[k], rtol=1e-4, atol=1e-5) for k in initial)


def batch_arrays(rank: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As tests/mpi_scripts/update_steps.py draws rank ``rank``'s batch of step ``step``."""
    rng = np.random.RandomState(100 * step + rank)
    data = 2.0 * rng.randn(2, 5, 2).astype(np.float32)
    return data, rng.randint(0, 3, (2, 5)).astype(np.int32), np.array([5, 3 + rank], np.int32)


# ----- gradient_clip_norm in the post-processing -----

@pytest.mark.tf_latest
def test_clip_norm_scales_each_tensor_by_its_own_norm_between_value_and_global_clipping():
    grads = [tf.constant([3.0, -4.0]), None, tf.constant([0.5]), tf.constant([[1.0, 2.0], [2.0, 0.0]])]
    out = process_gradients(grads, GradientOptions(clip_norm=1.0), SEED)
    np.testing.assert_allclose(out[0].numpy(), [0.6, -0.8], rtol=1e-6)  # norm 5 -> 1
    np.testing.assert_allclose(out[2].numpy(), [0.5], rtol=1e-6)  # below the norm: unchanged
    np.testing.assert_allclose(out[3].numpy(), [[1 / 3, 2 / 3], [2 / 3, 0.0]], rtol=1e-6)  # the whole tensor
    assert out[1] is None
    # value clipping first: [3, -4] -> [2, -2], norm sqrt(8) -> scaled to norm 2; then the global scaling
    # by the norm of the gradients as they came: sqrt(25 + 0.25 + 9) > 4
    out = process_gradients(grads, GradientOptions(clip_value=2.0, clip_norm=2.0, clip_global_norm=4.0), SEED)
    global_scale = 4.0 / math.sqrt(34.25)
    np.testing.assert_allclose(out[0].numpy(), np.array([2.0, -2.0]) * 2 / math.sqrt(8) * global_scale,
                               rtol=1e-6)
    np.testing.assert_allclose(out[3].numpy(), np.array([[1.0, 2.0], [2.0, 0.0]]) * 2 / 3 * global_scale,
                               rtol=1e-6)


# ----- one process -----

def engine_run(config: dict, steps: int) -> tuple[dict, dict, list]:
    """Build from ``config`` as the train task does and run ``steps`` steps on rank 0's batches."""
    cfg = Config({"network": NETWORK, "random_seed": 3, **config})
    model = build_model(cfg, input_dim=2, input_sparse=False, target_dims={"classes": 3})
    updater = Updater.from_config(cfg, model.named_trainable_variables(), l2=model.l2_factors())
    train = Steps(model, updater, Strategy(LocalCommunicator()))
    named = model.named_trainable_variables()
    initial = {k: v.numpy() for k, v in named.items()}
    used = []
    for step in range(steps):
        data, classes, lengths = batch_arrays(0, step)
        train.train(SimpleNamespace(data={"data": data, "classes": classes},
                                    lengths={"data": lengths, "classes": lengths}))
        used.append([(data, classes, lengths)])
    return {k: v.numpy() for k, v in named.items()}, initial, used


@pytest.mark.tf_latest
@pytest.mark.parametrize("config, setting", [
    ({"optimizer": "sgd", "learning_rate": 0.5, "gradient_clip_norm": 0.05},
     dict(optimizer="sgd", lr=0.5, clip=0.05)),
    ({"optimizer": "sgd", "learning_rate": 0.5, "gradient_clip_norm": 0.05, "decouple_constraints": True},
     dict(optimizer="sgd", lr=0.5, clip=0.05, decouple=True)),
    ({"optimizer": {"class": "adam"}, "learning_rate": 0.1, "gradient_clip_norm": 0.05,
      "decouple_constraints": True}, dict(optimizer="adam", lr=0.1, clip=0.05, decouple=True)),
], ids=["sgd-clip_norm", "sgd-clip_norm-decoupled", "adam-clip_norm-decoupled"])
def test_one_process_matches_the_numpy_update(config, setting):
    final, initial, steps = engine_run(config, 2)
    assert_matches(final, initial, steps, **setting)


@pytest.mark.tf_latest
def test_decoupled_decay_does_not_scale_with_the_learning_rate():
    config = {"optimizer": "sgd", "learning_rate": 0.0, "decouple_constraints": True}
    final, initial, _ = engine_run(config, 2)
    for k in initial:  # no gradient step at rate 0: only the L2 layer's parameters shrink, by (1 - 2 L2)
        factor = (1 - 2 * L2) ** 2 if k in DECAYED else 1.0
        np.testing.assert_allclose(final[k], initial[k] * factor, rtol=1e-6, err_msg=k)


@pytest.mark.tf_latest
def test_an_updater_that_does_not_decay_what_the_model_regularizes_is_refused():
    cfg = Config({"network": NETWORK, "decouple_constraints": True})
    model = build_model(cfg, input_dim=2, input_sparse=False, target_dims={"classes": 3})
    updater = Updater.from_config(cfg, model.named_trainable_variables())  # the model's L2 not passed
    with pytest.raises(ValueError, match="decoupled L2 differs from the model's layer L2"):
        Steps(model, updater, Strategy(LocalCommunicator()))


# ----- the keys -----

@pytest.mark.tf_latest
@pytest.mark.parametrize("values, message", [
    ({"gradient_clip_norm": -0.5},
     r"Config key 'gradient_clip_norm' must be a number >= 0 \(0: off\), got -0.5"),
    ({"gradient_clip_norm": float("nan")}, "'gradient_clip_norm' must be a number >= 0"),
    ({"gradient_clip_norm": "abc"}, "gradient_clip_norm"),
    ({"gradient_clip_norm": True}, "'gradient_clip_norm' must be float, but it is bool True"),
    ({"decouple_constraints": 0.5}, "'decouple_constraints' must be bool, but it is float 0.5"),
    ({"decouple_constraints": "sometimes"}, "decouple_constraints"),
])
def test_bad_values_are_clear_errors(values, message):
    with pytest.raises(ConfigError, match=message):
        Updater.from_config(Config(values), [tf.Variable([1.0])])


@pytest.mark.tf_latest
def test_verdicts():
    config = Config({"gradient_clip_norm": 0.07, "decouple_constraints": True,
                     "decouple_constraints_factor": 0.5})
    found = {f.name: f for f in config_findings(config)}
    assert found["gradient_clip_norm"].verdict == found["decouple_constraints"].verdict == IMPLEMENTED
    # RETURNN reads it but, since its decay became 2 * L2 * w (2022-11), uses it nowhere
    assert found["decouple_constraints_factor"].verdict == NO_EFFECT
    assert "2 * L2 * w" in found["decouple_constraints_factor"].note


# ----- two ranks, real mpirun -----

def mpi_run(tmp_path, ranks: int, config: dict, steps: int = 2) -> list[dict]:
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    full = {"network": NETWORK, "random_seed": 3, "use_horovod": True, "distributed_backend": "mpi",
            "log_verbosity": 1, **config}
    r = run_mpi(ranks, [SCRIPT, str(out), repr(full), str(steps)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return [dict(np.load(out / f"rank{k}.npz")) for k in range(ranks)]


def split(saved: list[dict], prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in saved[0].items() if k.startswith(prefix)}


@pytest.mark.mpi
@pytest.mark.tf_latest
@pytest.mark.parametrize("config, setting", [
    ({"horovod_avg_grad": True, "optimizer": {"class": "adam"}, "learning_rate": 0.1,
      "gradient_clip_norm": 0.05, "decouple_constraints": True},
     dict(optimizer="adam", lr=0.1, clip=0.05, decouple=True, reduce="average")),
    ({"horovod_reduce_type": "param", "horovod_param_sync_step": 1, "optimizer": "sgd",
      "learning_rate": 0.5, "gradient_clip_norm": 0.05, "decouple_constraints": True},
     dict(optimizer="sgd", lr=0.5, clip=0.05, decouple=True, reduce="param")),
], ids=["grad-average-adam", "param-sgd"])
def test_two_ranks_match_the_numpy_update(tmp_path, config, setting):
    saved = mpi_run(tmp_path, 2, config)
    initial = split(saved, "initial/")
    steps = [[tuple(s[f"step{i}/{key}"] for key in ("data", "classes", "lengths")) for s in saved]
             for i in range(2)]
    for r in range(2):  # the batches the script used are those drawn here
        for i in range(2):
            for got, want in zip(steps[i][r], batch_arrays(r, i)):
                np.testing.assert_array_equal(got, want)
    for name in initial:  # every rank ends with the same parameters: the decay is applied alike
        np.testing.assert_array_equal(saved[0][f"final/{name}"], saved[1][f"final/{name}"])
    assert_matches(split(saved, "final/"), initial, steps, **setting)
