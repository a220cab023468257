#!/usr/bin/env python3
"""A published Conformer hybrid, as written, beside RETURNN: its losses at initialisation, equal or not.

    .venv/bin/python benchmarks/bench_returnn_conformer.py CHECKOUT
        [--config 2021-swb-conformer-hybrid/baseline_12l.config] [--seqs 3] [--frames 48]

CHECKOUT is a checkout of ``rwth-i6/returnn-experiments`` (the project holds none of its files). The
config's ``network``, stream dims (``num_outputs``) and its top-level functions (SpecAugment's
``transform``, which the network's ``eval`` layer calls) are read as ``bench_returnn_coverage.py`` reads
them; its RASR corpus is replaced by a batch of random features and labels of those dims.

RETURNN (found as ``returnn_side.py`` says) builds the network in eval (``train_flag`` False: no dropout,
SpecAugment's eval branch) with its own random initialisation, saves the checkpoint and scores the batch:
each loss layer's loss sum (RETURNN's ``LossHolder.get_loss_value``), its total loss and its constraints
(the layers' ``L2``). The engine loads that checkpoint into the same network, built from a config file
of the same functions and network, and scores the batch too. Printed: both sides' numbers, the largest
relative difference, and PASS when it is at most ``TOLERANCE`` (the issue's 1e-5).

The batch's sequences all have ``--frames`` frames, a multiple of the network's time stride 3: RETURNN
reads the padding frames of its layers' outputs (not zero after a convolution), and TensorFlow's "same"
padding, which RETURNN's strided conv uses, depends on the padded length; with equal lengths divisible by
the stride, both sides see the same frames.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side

DEFAULT_CONFIG = "2021-swb-conformer-hybrid/baseline_12l.config"
TOLERANCE = 1e-5
# layers whose outputs are compared too, from the front end to the softmax (where the network has them):
# the losses of an untrained 9001-class softmax hardly depend on what comes before it
LAYERS = ("vgg_conv_merged", "conformer_block_01", "conformer_block_06", "encoder", "masked_tconv", "output")


def returnn_side(jobs_path: str) -> None:
    import tensorflow as tf
    from returnn.config import Config
    from returnn.tf.network import TFNetwork
    from returnn.util.basic import BackendEngine

    BackendEngine.select_engine(engine=BackendEngine.TensorFlowNetDict)  # as rnn.py: behaviour version 0
    sys.setrecursionlimit(10_000)  # as RETURNN's rnn.py: it builds a layer's sources recursively
    tf.compat.v1.disable_eager_execution()
    with open(jobs_path) as f:
        job = json.load(f)
    namespace: dict = {}
    exec("\n".join(job["functions"]), namespace)  # noqa: S102 - the config's own code, as RETURNN runs it
    functions = {k: v for k, v in namespace.items() if callable(v) and not k.startswith("__")}
    batch = np.load(job["batch"])
    config = Config({"extern_data": job["extern_data"], "network": job["network"], **functions})
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        tf.compat.v1.set_random_seed(job["seed"])
        net = TFNetwork(config=config, train_flag=False, eval_flag=True)  # eval_flag: with the losses
        net.construct_from_dict(job["network"])
        net.initialize_params(session)
        net.save_params_to_file(job["checkpoint"], session)
        data, classes = net.extern_data.data["data"], net.extern_data.data["classes"]
        feed = {data.placeholder: batch["data"], data.get_sequence_lengths(): batch["lengths"],
                classes.placeholder: batch["classes"], classes.get_sequence_lengths(): batch["lengths"]}
        total = net.get_total_loss()  # makes the losses, after which losses_dict lists them
        fetches = {name: holder.get_loss_value() for name, holder in net.losses_dict.items()}
        fetches["total loss"] = total
        fetches["constraints"] = net.get_total_constraints()  # the layers' L2
        # RETURNN gives a plain 0 for a sum without terms
        fetches = {k: v if isinstance(v, tf.Tensor) else tf.constant(float(v)) for k, v in fetches.items()}
        layers = [name for name in LAYERS if name in net.layers]
        values, outputs = session.run(
            [fetches, [net.layers[name].output.copy_as_batch_major().placeholder for name in layers]], feed)
    np.savez(job["outputs"], **dict(zip(layers, outputs)))
    with open(job["results"], "w") as f:
        json.dump({name: float(value) for name, value in values.items()}, f)


def engine_side(job: dict, folder: str) -> dict[str, float]:
    """The engine's numbers for RETURNN's checkpoint: the same keys as ``returnn_side`` writes."""
    import tensorflow as tf
    from engine.config.loader import Config
    from engine.model import build_model
    from engine.model.base import masked_ce_sums
    from engine.training.checkpoints.initial_params import load_for_inference

    path = os.path.join(folder, "engine.config")
    with open(path, "w") as f:
        lines = job["functions"] + [f"network = {job['network']!r}", f"extern_data = {job['extern_data']!r}"]
        f.write("\n".join(lines) + "\n")
    config = Config.from_sources([path], [])
    model = build_model(config, input_dim=job["extern_data"]["data"]["dim"], input_sparse=False,
                        target_dims={"classes": job["extern_data"]["classes"]["dim"]})
    load_for_inference(Config({"load": job["checkpoint"]}), model, job["checkpoint"])
    batch = np.load(job["batch"])
    lengths = tf.constant(batch["lengths"])
    targets, target_lengths = {"classes": tf.constant(batch["classes"])}, {"classes": lengths}
    outputs = model(batch["data"], lengths, stream_lengths=target_lengths)
    losses = model.compute_losses(outputs, targets, target_lengths)
    results = {}
    for name in model.loss_layers:
        layer = model.layers[name]
        value, _, _ = masked_ce_sums(outputs[f"{name}:logits"], targets["classes"], lengths, where=name,
                                     criterion=layer.criterion)
        results[name] = float(value)
    results["total loss"] = float(losses.objective)
    results["constraints"] = float(losses.regularizer)
    theirs = np.load(job["outputs"])
    for name in theirs.files:  # the largest difference relative to the largest value of RETURNN's
        results[f"{name}: output, max |diff| / max"] = float(
            np.abs(outputs[name].numpy() - theirs[name]).max() / np.abs(theirs[name]).max())
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", nargs="?", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the setup's config, under the checkout")
    parser.add_argument("--seqs", type=int, default=3)
    parser.add_argument("--frames", type=int, default=48, help="frames of each sequence (a multiple of 3)")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    if not args.checkout:
        parser.error("CHECKOUT is required")
    python = returnn_python()
    if python is None:
        return no_returnn("bench_returnn_conformer", "nothing is compared")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from engine.runtime import log

    log.init(verbosity=log.WARNING)  # the table, not the model's summary line
    from bench_returnn_coverage import config_functions, streams  # the engine's side only: RETURNN's
    from returnn_setups import read_setup  # Python imports this file without the engine

    setup = read_setup(args.checkout, args.config)
    dims = streams(setup.namespace)
    if setup.network is None or dims is None:
        sys.exit(f"bench_returnn_conformer: {args.config} leaves no network dict or stream dims")
    extern_data = {k: {"dim": d, "sparse": s} for k, (d, s) in dims.items()}
    rng = np.random.RandomState(1)
    with tempfile.TemporaryDirectory() as folder:
        batch = os.path.join(folder, "batch.npz")
        features = rng.standard_normal((args.seqs, args.frames, dims["data"][0])).astype(np.float32)
        np.savez(batch, data=features,
                 classes=rng.randint(0, dims["classes"][0], (args.seqs, args.frames)).astype(np.int32),
                 lengths=np.full(args.seqs, args.frames, np.int32))
        job = {"functions": config_functions(args.checkout, args.config), "network": setup.network,
               "extern_data": extern_data, "batch": batch, "seed": 42,
               "checkpoint": os.path.join(folder, "returnn-init"), "results": os.path.join(folder, "r.json"),
               "outputs": os.path.join(folder, "outputs.npz")}
        with open(os.path.join(folder, "job.json"), "w") as f:
            json.dump(job, f)
        run_returnn_side(python, __file__, os.path.join(folder, "job.json"))
        with open(job["results"]) as f:
            theirs = json.load(f)
        ours = engine_side(job, folder)
    print(f"{args.config}: {args.seqs} sequences of {args.frames} frames, eval; "
          f"RETURNN {returnn_versions(python)}")
    print(f"{'':<46} {'RETURNN':>16} {'engine':>16} {'relative diff':>14}")
    worst = 0.0
    for name in theirs:
        diff = abs(ours[name] - theirs[name]) / max(abs(theirs[name]), 1e-12)
        worst = max(worst, diff)
        print(f"{name:<46} {theirs[name]:>16.6f} {ours[name]:>16.6f} {diff:>14.2e}")
    for name in (n for n in ours if n.endswith("/ max")):
        worst = max(worst, ours[name])
        print(f"{name:<46} {'':>16} {'':>16} {ours[name]:>14.2e}")
    verdict = "PASS" if worst <= TOLERANCE else "MISS"
    print(f"{verdict}: largest relative difference {worst:.2e}, at most {TOLERANCE:g}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
