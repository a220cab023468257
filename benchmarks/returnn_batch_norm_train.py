#!/usr/bin/env python3
"""RETURNN's ``batch_norm`` in training, against real RETURNN: outputs, gradients and running statistics.

    .venv/bin/python benchmarks/returnn_batch_norm_train.py [--update-fixtures]

A dev script beside ``returnn_checkpoints.py`` (which compares eval, RETURNN's ``train_flag`` False): RETURNN
(found as there, ``returnn_side.py``) builds each variant of ``VARIANTS`` as the network
``{"output": {"class": "batch_norm", "from": "data", **options}}`` with ``train_flag`` True and RETURNN's
defaults of a config without ``behavior_version``, sets gamma, beta and the running statistics to random
values (the variance positive), and runs two batches as its training does: each batch's output, the
gradients of sum(output * probe) over the valid frames by the input and by gamma and beta, and the
update of the running statistics (``post_control_dependencies``), which it then reads. The engine takes the
same values by RETURNN's names and runs the same batches through its model with ``training=True``.

The same two batches also run in eval (``train_flag`` False, the update ops fetched as RETURNN's eval
steps fetch them; the engine's model called as its eval step calls it, ``update_running``): RETURNN moves
the running statistics in eval too unless ``update_sample_only_in_training``, so the second eval batch
sees the first one's.

Printed per variant: the largest absolute difference of the training outputs (valid frames), gradients
(relative to RETURNN's largest where that is above 1) and running statistics after each batch, and of
the eval outputs, and PASS when all are at most ``TOLERANCE``.

``--update-fixtures`` (only when every variant passed) writes RETURNN's side to
``tests/fixtures/returnn_batch_norm`` (``<variant>.npz`` and ``cases.json``), which
tests/test_model_batch_norm.py replays without RETURNN.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from returnn_checkpoints import DENSE, case_seed, inputs, probe, random_values
from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side
from returnn_verdicts import summary, update_fixtures, within_tolerance

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures",
                        "returnn_batch_norm")
TOLERANCE = 1e-5
VARIANTS: dict[str, dict] = {
    "defaults": {},  # behavior_version 0: momentum 0.99, updated in eval too, not delayed, param_version 0
    "v2_delayed": {"param_version": 2, "momentum": 0.1, "epsilon": 1e-5,
                   "update_sample_only_in_training": True, "delay_sample_update": True, "masked_time": True},
    "mixed": {"use_sample": 0.5, "use_shift": False, "param_version": 1},
    "mixed_delayed": {"use_sample": 0.3, "delay_sample_update": True, "use_std": False, "momentum": 0.5},
}


def case(variant: str) -> dict:
    return {"extern_data": DENSE,
            "network": {"output": {"class": "batch_norm", "from": "data", **VARIANTS[variant]}}}


def batches(variant: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two batches: returnn_checkpoints' inputs (lengths 7, 5, 2), then others (4, 6, 3) shifted and scaled,
    so that the second batch's statistics differ from the first's."""
    first = inputs(case(variant))
    rng = np.random.RandomState(case_seed(variant))
    lengths = np.array([4, 6, 3], np.int32)
    data = (2.0 * rng.standard_normal((3, 6, DENSE["data"]["dim"])) + 1.0).astype(np.float32)
    for b, n in enumerate(lengths):
        data[b, n:] = 0
    return [first, (data, lengths)]


# ----- the RETURNN side: runs under RETURNN's Python (``--returnn-side JOBS.json``) -----
def returnn_side(jobs_path: str) -> None:
    import tensorflow as tf
    from returnn.config import Config
    from returnn.tf.network import TFNetwork
    from returnn.util.basic import BackendEngine

    BackendEngine.select_engine(engine=BackendEngine.TensorFlowNetDict)  # rnn.py's: behavior_version 0
    tf.compat.v1.disable_eager_execution()
    with open(jobs_path) as f:
        jobs = json.load(f)
    for job in jobs:
        variant, result = job["variant"], {}
        for train in (True, False):
            with tf.Graph().as_default(), tf.compat.v1.Session() as session:
                net = TFNetwork(config=Config({"extern_data": DENSE}), train_flag=train)
                net.construct_from_dict(case(variant)["network"])
                net.initialize_params(session)
                params = {v.name[:-2]: v for v in net.get_params_list()}
                values = random_values({n: v.shape.as_list() for n, v in params.items()}, case_seed(variant))
                for name, var in params.items():
                    var.load(values[name], session)
                result.update({f"init:{n}": v for n, v in values.items()})
                extern = net.extern_data.data["data"]
                output = net.layers["output"].output.copy_as_batch_major()
                weights = tf.compat.v1.placeholder(tf.float32, [None, None, output.dim])
                mask = tf.sequence_mask(output.get_sequence_lengths(), tf.shape(output.placeholder)[1],
                                        dtype=tf.float32)
                scalar = tf.reduce_sum(output.placeholder * weights * mask[:, :, None])
                wrt = {"data": extern.placeholder, **{n: v for n, v in params.items() if v.trainable}}
                grads = tf.gradients(scalar, list(wrt.values()))
                for step, (data, lengths) in enumerate(batches(variant)):
                    feed = {extern.placeholder: data, extern.get_sequence_lengths(): lengths,
                            weights: probe(variant, data.shape[:2] + (output.dim,))}
                    updates = net.get_post_control_dependencies()  # fetched with every step, eval too
                    if not train:  # the eval difference by design: outputs only
                        result[f"eval{step}:out"] = session.run([output.placeholder, updates], feed)[0]
                        continue
                    # as RETURNN's training runs a step: the update ops with the fetches
                    out, found, _ = session.run([output.placeholder, grads, updates], feed)
                    result[f"step{step}:out"] = out
                    result.update({f"step{step}:grad:{n}": g for n, g in zip(wrt, found)})
                    stats = {n: v for n, v in params.items() if not v.trainable}
                    now = session.run(list(stats.values()))
                    result.update({f"step{step}:stat:{n}": v for n, v in zip(stats, now)})
        np.savez(job["outputs"], **result)


# ----- the engine side -----
def engine_steps(variant: str, init: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The engine's training steps of ``variant`` from RETURNN's values ``init`` (by RETURNN's names), keyed
    as the RETURNN side writes them, and its eval outputs (``eval<k>:out``)."""
    import tensorflow as tf

    from engine.model import build_model
    from engine.training.checkpoints.returnn_format import ReturnnView

    result = {}
    for train in (True, False):
        model = build_model(case(variant)["network"], input_dim=DENSE["data"]["dim"], input_sparse=False,
                            target_dims={"classes": DENSE["classes"]["dim"]})
        view = ReturnnView(model)
        view.assign(init)
        layer = model.layers["output"]
        for step, (data, lengths) in enumerate(batches(variant)):
            if not train:
                result[f"eval{step}:out"] = model(data, lengths, update_running=True)["output"].numpy()
                continue
            x = tf.constant(data)
            trainable = {n: layer.params[k] for k, n in layer.returnn_names.items()
                         if layer.params[k].trainable}
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = model(x, lengths, training=True)["output"]
                mask = tf.sequence_mask(lengths, tf.shape(out)[1], dtype=tf.float32)
                scalar = tf.reduce_sum(out * probe(variant, tuple(out.shape)) * mask[:, :, None])
            found = tape.gradient(scalar, {"data": x, **trainable})
            result[f"step{step}:out"] = out.numpy()
            result.update({f"step{step}:grad:{n}": g.numpy() for n, g in found.items()})
            result.update({f"step{step}:stat:{layer.returnn_names[k]}": layer.params[k].numpy()
                           for k in layer.running_keys})
    return result


def differences(expected, got: dict[str, np.ndarray], variant: str) -> dict[str, float]:
    """Per training key: the largest |difference| (outputs over the valid frames; gradients relative to
    RETURNN's largest |value| where that is above 1)."""
    lengths = [b[1] for b in batches(variant)]
    result = {}
    for key in sorted(k for k in expected.files if k.startswith(("step", "eval"))):
        want, have = np.asarray(expected[key]), np.asarray(got[key])
        step = int(key[4:key.index(":")])
        if key.endswith(":out") or key.endswith(":grad:data"):
            valid = np.arange(want.shape[1])[None, :] < lengths[step][:, None]
            want, have = want[valid], have[valid]
        scale = max(1.0, float(np.abs(want).max(initial=0.0))) if ":grad:" in key else 1.0
        result[key] = float(np.abs(want - have).max(initial=0.0)) / scale
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--update-fixtures", action="store_true",
                        help=f"write RETURNN's side to {FIXTURES} when every variant passed")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    python = returnn_python()
    if python is None:
        return no_returnn("returnn_batch_norm_train", "nothing is compared")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from engine.runtime import log

    log.init(verbosity=log.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [{"variant": v, "outputs": os.path.join(tmp, f"{v}.npz")} for v in VARIANTS]
        path = os.path.join(tmp, "jobs.json")
        with open(path, "w") as f:
            json.dump(jobs, f)
        run_returnn_side(python, __file__, path)
        print(f"RETURNN: {python} {returnn_versions(python)}; batch_norm with train_flag True, "
              "max |RETURNN - engine|")
        print(f"{'variant':<15} {'outputs':>9} {'gradients':>10} {'statistics':>11} {'eval outputs':>13}")
        missed, worst = [], 0.0
        for variant in VARIANTS:
            expected = np.load(os.path.join(tmp, f"{variant}.npz"))
            got = engine_steps(variant, {k[5:]: expected[k] for k in expected.files if k.startswith("init:")})
            found = differences(expected, got, variant)
            ok, largest = within_tolerance(list(found.values()), TOLERANCE)
            worst = max(worst, largest)
            missed += [] if ok else [variant]
            columns = (("step", ":out"), ("step", ":grad:"), ("step", ":stat:"), ("eval", ""))
            parts = [max(v for k, v in found.items() if k.startswith(start) and what in k)
                     for start, what in columns]
            print(f"{variant:<15} {parts[0]:>9.2e} {parts[1]:>10.2e} {parts[2]:>11.2e} {parts[3]:>13.2e}  "
                  f"{'PASS' if ok else 'MISS'}")
        line, status = summary(list(VARIANTS), missed,
                               f"largest difference {worst:.2e}, at most {TOLERANCE:g}")
        print(line)
        with open(os.path.join(tmp, "cases.json"), "w") as f:
            json.dump({"made_by": "benchmarks/returnn_batch_norm_train.py --update-fixtures",
                       **returnn_versions(python), "cases": {v: case(v) for v in VARIANTS}}, f, indent=1)
        if args.update_fixtures:
            print(update_fixtures(status, tmp, [f"{v}.npz" for v in VARIANTS], FIXTURES))
    return status


if __name__ == "__main__":
    sys.exit(main())
