#!/usr/bin/env python3
"""A CE loss on a rec unit's ``eval`` layer (2022-scale-learning's ``combo_output_prob = tf.exp(...)``),
beside RETURNN: the loss, its scaled objective, the frame error and the gradient with respect to the input.

    RETURNN_PYTHON=/tmp/returnn-venv/bin/python .venv/bin/python benchmarks/returnn_unit_loss.py \
        [--update-fixture]

The network has no parameters (a loop over the input frames whose unit takes the softmax of each frame in
an ``eval`` and the CE of ``tf.exp(safe_log(...))`` of it, ``loss_scale`` 0.5), so both programs compute
from the same inputs alone. One frame's target has a probability of about e^-120: RETURNN's CE on a layer
that is no softmax clips it at 1e-20 (its ``safe_log``, the gradient passed through the clip). PASS when the
loss and objective are within 1e-5 relative, the errors equal, and the gradients within 1e-5.
``--update-fixture`` writes RETURNN's numbers to ``FIXTURE``, which ``tests/test_model_rec.py`` replays.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side

UNIT = {"prob": {"class": "eval", "eval": "tf.nn.softmax(source(0))", "from": "data:source"},
        "combo": {"class": "eval", "eval": "tf.exp(safe_log(source(0)))", "from": "prob",
                  "loss": "ce", "target": "classes", "loss_scale": 0.5},
        "output": {"class": "copy", "from": "prob"}}
NETWORK = {"loop": {"class": "rec", "from": "data", "unit": UNIT},
           "output": {"class": "copy", "from": "loop"}}
DIM, TOLERANCE = 4, 1e-5
FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures",
                       "returnn_unit_loss.npz")


def batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(3, 7, DIM)).astype(np.float32) * 3
    data[0, 2] = [60.0, -60.0, 0.0, 0.0]
    classes = rng.integers(0, DIM, size=(3, 7)).astype(np.int32)
    classes[0, 2] = 1  # p = e^-120: below the clip
    return {"data": data, "lengths": np.array([7, 5, 2], np.int32), "classes": classes}


def returnn_side(jobs_path: str) -> None:
    import tensorflow as tf
    from returnn.config import Config
    from returnn.tf.network import TFNetwork
    from returnn.util.basic import BackendEngine

    BackendEngine.select_engine(engine=BackendEngine.TensorFlowNetDict)
    tf.compat.v1.disable_eager_execution()
    with open(jobs_path) as f:
        job = json.load(f)
    values = np.load(job["batch"])
    streams = {"data": {"dim": DIM}, "classes": {"dim": DIM, "sparse": True}}
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        net = TFNetwork(config=Config({"extern_data": streams}), train_flag=True)
        net.construct_from_dict(NETWORK)
        net.maybe_construct_objective()
        data, classes = net.extern_data.data["data"], net.extern_data.data["classes"]
        feed = {data.placeholder: values["data"], data.get_sequence_lengths(): values["lengths"],
                classes.placeholder: values["classes"], classes.get_sequence_lengths(): values["lengths"]}
        holder = net.losses_dict["loop/combo"]
        objective = net.get_total_loss()
        fetched = session.run({"loss": holder.get_loss_value_for_fetch(), "error": holder.get_error_value(),
                               "objective": objective,
                               "grad": tf.gradients(objective, data.placeholder)[0]}, feed)
    np.savez(job["out"], **fetched)


def engine_side(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tensorflow as tf
    from engine.model import build_model

    model = build_model(NETWORK, input_dim=DIM, input_sparse=False, target_dims={"classes": DIM},
                        random_seed=1)
    x = tf.constant(values["data"])
    classes, lengths = tf.constant(values["classes"]), tf.constant(values["lengths"])
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = model(x, lengths, training=True, seed=tf.constant([1, 2], tf.int64),
                    stream_lengths={"classes": lengths}, streams={"classes": classes})
        losses = model.compute_losses(out, {"classes": classes}, {"classes": lengths}, training=True)
    return {"loss": losses.loss.numpy(), "error": losses.error.numpy(), "objective": losses.objective.numpy(),
            "grad": tape.gradient(losses.objective, x).numpy()}


def differences(theirs: dict, ours: dict) -> tuple[bool, float]:
    """Whether the engine's numbers are RETURNN's (see the module), and the gradients' largest difference
    over the valid frames."""
    values = batch()
    valid = (np.arange(values["data"].shape[1])[None] < values["lengths"][:, None])[:, :, None]
    grad_diff = float(np.abs((ours["grad"] - theirs["grad"]) * valid).max())
    ok = (all(abs(float(ours[k]) - float(theirs[k])) <= TOLERANCE * abs(float(theirs[k]))
              for k in ("loss", "objective")) and float(ours["error"]) == float(theirs["error"])
          and grad_diff <= TOLERANCE)
    return ok, grad_diff


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update-fixture", action="store_true", help=f"write RETURNN's numbers to {FIXTURE}")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    python = returnn_python()
    if python is None:
        return no_returnn("returnn_unit_loss", "nothing is compared")
    values = batch()
    with tempfile.TemporaryDirectory() as folder:
        np.savez(os.path.join(folder, "batch.npz"), **values)
        jobs = os.path.join(folder, "jobs.json")
        with open(jobs, "w") as f:
            json.dump({"batch": os.path.join(folder, "batch.npz"), "out": os.path.join(folder, "out.npz")}, f)
        run_returnn_side(python, __file__, jobs)
        theirs = dict(np.load(os.path.join(folder, "out.npz")))
    ours = engine_side(values)
    print(f"RETURNN: {python} {returnn_versions(python)}")
    print(f"{'':<10} {'RETURNN':>14} {'engine':>14}")
    for key in ("loss", "objective", "error"):
        print(f"{key:<10} {float(theirs[key]):>14.6f} {float(ours[key]):>14.6f}")
    ok, grad_diff = differences(theirs, ours)
    print(f"gradient wrt the input: max |difference| {grad_diff:.2e} (largest value "
          f"{float(np.abs(theirs['grad']).max()):.3f})")
    print("PASS" if ok else "MISS")
    if args.update_fixture:
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(FIXTURE), suffix=".npz", delete=False) as f:
            np.savez(f, **theirs)
        os.replace(f.name, FIXTURE)
        print(f"wrote {FIXTURE}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
