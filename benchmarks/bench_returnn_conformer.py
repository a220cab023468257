#!/usr/bin/env python3
"""A published Conformer hybrid, as written, beside RETURNN: its losses at initialisation and after one
update, equal or not.

    .venv/bin/python benchmarks/bench_returnn_conformer.py CHECKOUT
        [--config 2021-swb-conformer-hybrid/baseline_12l.config] [--seqs 3] [--frames 48] [--no-update]

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

Then (unless ``--no-update``) both sides make ONE training update on the same batch from that checkpoint,
with the config's optimizer keys (``UPDATER_KEYS``: ``nadam``, ``gradient_clip``, ...) and the learning
rate of its first epoch (``learning_rates[0]``, else ``learning_rate``), and score the batch again in eval:
RETURNN with ``returnn.tf.updater.Updater`` as its engine's train step, the engine with its own ``Steps``.
The update runs in training mode (batch_norm on the batch's statistics, which it also moves into its
running ones), but without random draws, which two programs cannot draw alike: every ``dropout`` option
and ``dropout`` layer at 0, and SpecAugment's ``eval`` layers (those calling ``transform``) as the copy
of their input that their eval branch gives (whether they call ``transform(...)`` or
``self.network.get_config().typed_value('transform')``). Compared: each loss's change by the update (the
issue asks that it be within ``UPDATE_TOLERANCE``, 1 %, of RETURNN's) and, per parameter, the relative
difference of the updates, |engine's - RETURNN's| / |RETURNN's| in the L2 norm.

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
UPDATE_TOLERANCE = 0.01
UPDATER_KEYS = ("adam", "nadam", "optimizer", "optimizer_epsilon", "gradient_clip",
                "gradient_clip_global_norm", "gradient_noise", "grad_noise_rel_grad_norm",
                "decouple_constraints")
# layers whose outputs are compared too, from the front end to the softmax (where the network has them):
# the losses of an untrained 9001-class softmax hardly depend on what comes before it
LAYERS = ("vgg_conv_merged", "conformer_block_01", "conformer_block_06", "encoder", "masked_tconv", "output")


def deterministic(network: dict) -> dict:
    """``network`` without random draws: dropout 0, SpecAugment's ``eval`` layers their eval branch."""
    result = {}
    for name, layer in network.items():
        layer = dict(layer)
        for key in ("dropout", "attention_dropout"):
            if key in layer:
                layer[key] = 0.0
        if layer.get("class") == "eval" and "transform" in str(layer.get("eval")):  # the config's SpecAugment
            layer["eval"] = "source(0)"
        result[name] = layer
    return result


def for_returnn(keys: dict) -> dict:
    """The optimizer keys as RETURNN on TensorFlow 2 runs them: its ``nadam = True`` takes Keras' Nadam
    there and fails on TensorFlow 2.15 (``_KerasOptimizerWrapper`` reads ``_name``), so the flag becomes
    ``optimizer = {"class": "nadam"}``: RETURNN's own port of the TensorFlow 1 NadamOptimizer that the
    flag ran when the config was written, and what the engine runs for the flag."""
    keys = dict(keys)
    if keys.pop("nadam", False):
        keys["optimizer"] = {"class": "nadam"}
    return keys


def returnn_side(jobs_path: str) -> None:
    import tensorflow as tf
    from returnn.config import Config
    from returnn.tf.network import TFNetwork
    from returnn.tf.updater import Updater
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

    def feed(net) -> dict:
        data, classes = net.extern_data.data["data"], net.extern_data.data["classes"]
        return {data.placeholder: batch["data"], data.get_sequence_lengths(): batch["lengths"],
                classes.placeholder: batch["classes"], classes.get_sequence_lengths(): batch["lengths"]}

    def scores(network: dict, load: str | None) -> tuple[dict, dict]:
        """The losses (and the compared layers' outputs) in eval of ``network`` with the parameters of
        ``load``, or else RETURNN's own initialisation, saved as ``job["checkpoint"]``."""
        config = Config({"extern_data": job["extern_data"], "network": network, **functions})
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            tf.compat.v1.set_random_seed(job["seed"])
            net = TFNetwork(config=config, train_flag=False, eval_flag=True)  # eval_flag: with the losses
            net.construct_from_dict(network)
            if load:
                net.load_params_from_file(load, session)
            else:
                net.initialize_params(session)
                net.save_params_to_file(job["checkpoint"], session)
            total = net.get_total_loss()  # makes the losses, after which losses_dict lists them
            fetches = {name: holder.get_loss_value() for name, holder in net.losses_dict.items()}
            fetches["total loss"] = total
            fetches["constraints"] = net.get_total_constraints()  # the layers' L2
            # RETURNN gives a plain 0 for a sum without terms
            fetches = {k: v if isinstance(v, tf.Tensor) else tf.constant(float(v))
                       for k, v in fetches.items()}
            layers = [name for name in LAYERS if name in net.layers]
            values, outputs = session.run(
                [fetches, [net.layers[name].output.copy_as_batch_major().placeholder for name in layers]],
                feed(net))
        return {name: float(value) for name, value in values.items()}, dict(zip(layers, outputs))

    def update(network: dict) -> None:
        """One update of RETURNN's train step from ``job["checkpoint"]``, saved as ``job["after"]``."""
        config = Config({"extern_data": job["extern_data"], "network": network, **functions,
                         **for_returnn(job["updater"])})
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            net = TFNetwork(config=config, train_flag=True)
            net.construct_from_dict(network)
            updater = Updater(config=config, network=net, initial_learning_rate=job["learning_rate"])
            updater.set_trainable_vars(net.get_trainable_params())
            optim_op = updater.get_optim_op()
            net.initialize_params(session)
            net.load_params_from_file(job["checkpoint"], session)
            updater.init_optimizer_vars(session)
            updater.set_learning_rate(job["learning_rate"], session)
            # as RETURNN's engine runs a train step: with the ops registered to run after it (batch_norm's
            # running statistics)
            session.run([optim_op, net.get_post_control_dependencies()], feed(net))
            net.save_params_to_file(job["after"], session)

    results, outputs = scores(job["network"], None)
    np.savez(job["outputs"], **outputs)
    if job["after"]:
        update(deterministic(job["network"]))
        after, _ = scores(deterministic(job["network"]), job["after"])
        results.update({f"{name} after the update": value for name, value in after.items()})
    with open(job["results"], "w") as f:
        json.dump(results, f)


def engine_model(job: dict, folder: str, network: dict):
    """The engine's model of ``network`` from a config file of the config's functions, with RETURNN's
    checkpoint loaded, and that config."""
    from engine.config.loader import Config
    from engine.model import build_model
    from engine.training.checkpoints.initial_params import load_for_inference

    path = os.path.join(folder, "engine.config")
    with open(path, "w") as f:
        training = {**job["updater"], "learning_rate": job["learning_rate"]}
        lines = job["functions"] + [f"network = {network!r}", f"extern_data = {job['extern_data']!r}"] + [
            f"{key} = {value!r}" for key, value in training.items()]
        f.write("\n".join(lines) + "\n")
    config = Config.from_sources([path], [])
    model = build_model(config, input_dim=job["extern_data"]["data"]["dim"], input_sparse=False,
                        target_dims={"classes": job["extern_data"]["classes"]["dim"]})
    load_for_inference(Config({"load": job["checkpoint"]}), model, job["checkpoint"])
    return model, config


def engine_scores(model, batch) -> tuple[dict[str, float], dict]:
    """The keys ``returnn_side``'s ``scores`` gives, for the engine's model in eval, and the outputs."""
    import tensorflow as tf
    from engine.model.base import masked_ce_sums

    lengths = tf.constant(batch["lengths"])
    targets, target_lengths = {"classes": tf.constant(batch["classes"])}, {"classes": lengths}
    outputs = model(batch["data"], lengths, stream_lengths=target_lengths)
    losses = model.compute_losses(outputs, targets, target_lengths)
    results = {}
    for name in model.loss_layers:
        value, _, _ = masked_ce_sums(outputs[f"{name}:logits"], targets["classes"], lengths, where=name,
                                     criterion=model.layers[name].criterion)
        results[name] = float(value)
    results["total loss"] = float(losses.objective)
    results["constraints"] = float(losses.regularizer)
    return results, outputs


def engine_update(model, config, batch) -> None:
    """One update of the engine's train step on ``batch``, as the train task makes it on 1 rank."""
    from types import SimpleNamespace

    from engine.distributed import Strategy
    from engine.distributed.local_backend import LocalCommunicator
    from engine.training.step import Steps
    from engine.training.update.updater import Updater

    updater = Updater.from_config(config, model.named_trainable_variables(), l2=model.l2_factors(),
                                  parts=model.returnn_parts())
    updater.set_learning_rate(config.float("learning_rate"))
    lengths = {"data": batch["lengths"], "classes": batch["lengths"]}
    Steps(model, updater, Strategy(LocalCommunicator())).train(
        SimpleNamespace(data={"data": batch["data"], "classes": batch["classes"]}, lengths=lengths))


def engine_side(job: dict, folder: str) -> dict:
    """The engine's numbers for RETURNN's checkpoint: the same keys as ``returnn_side`` writes."""
    batch = np.load(job["batch"])
    model, _ = engine_model(job, folder, job["network"])
    results, outputs = engine_scores(model, batch)
    theirs = np.load(job["outputs"])
    for name in theirs.files:  # the largest difference relative to the largest value of RETURNN's
        results[f"{name}: output, max |diff| / max"] = float(
            np.abs(outputs[name].numpy() - theirs[name]).max() / np.abs(theirs[name]).max())
    if job["after"]:
        model, config = engine_model(job, folder, deterministic(job["network"]))
        engine_update(model, config, batch)
        after, _ = engine_scores(model, batch)
        results.update({f"{name} after the update": value for name, value in after.items()})
        results["updates"] = update_differences(model, job)
    return results


def update_differences(model, job: dict) -> dict[str, float]:
    """Per parameter (RETURNN's names): |engine's update - RETURNN's| / |RETURNN's update| (L2 norms; the
    first step of Adam-like optimizers is about lr * sign(gradient), so a single element whose gradient is
    rounding noise would dominate a maximum)."""
    import tensorflow as tf
    from engine.training.checkpoints.returnn_format import ReturnnView

    before, after = tf.train.load_checkpoint(job["checkpoint"]), tf.train.load_checkpoint(job["after"])
    differences = {}
    for name, value in ReturnnView(model).values().items():
        theirs = after.get_tensor(name) - before.get_tensor(name)
        ours = value - before.get_tensor(name)
        differences[name] = float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))
    return differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", nargs="?", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the setup's config, under the checkout")
    parser.add_argument("--seqs", type=int, default=3)
    parser.add_argument("--frames", type=int, default=48, help="frames of each sequence (a multiple of 3)")
    parser.add_argument("--no-update", action="store_true", help="compare the losses at initialisation only")
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
    rates = setup.namespace.get("learning_rates")
    learning_rate = float(rates[0] if rates else setup.namespace.get("learning_rate", 0.001))
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
               "outputs": os.path.join(folder, "outputs.npz"),
               "after": None if args.no_update else os.path.join(folder, "returnn-after"),
               "updater": {k: setup.namespace[k] for k in UPDATER_KEYS if k in setup.namespace},
               "learning_rate": learning_rate}
        with open(os.path.join(folder, "job.json"), "w") as f:
            json.dump(job, f)
        run_returnn_side(python, __file__, os.path.join(folder, "job.json"))
        with open(job["results"]) as f:
            theirs = json.load(f)
        ours = engine_side(job, folder)
    print(f"{args.config}: {args.seqs} sequences of {args.frames} frames; RETURNN {returnn_versions(python)}")
    print(f"{'at initialisation, eval':<46} {'RETURNN':>16} {'engine':>16} {'relative diff':>14}")
    worst = 0.0
    for name in (n for n in theirs if not n.endswith(" after the update")):
        diff = abs(ours[name] - theirs[name]) / max(abs(theirs[name]), 1e-12)
        worst = max(worst, diff)
        print(f"{name:<46} {theirs[name]:>16.6f} {ours[name]:>16.6f} {diff:>14.2e}")
    for name in (n for n in ours if n.endswith("/ max")):
        worst = max(worst, ours[name])
        print(f"{name:<46} {'':>16} {'':>16} {ours[name]:>14.2e}")
    verdicts = [verdict("at initialisation", worst, TOLERANCE)]
    if job["after"]:
        keys = ", ".join(f"{k} = {v!r}" for k, v in job["updater"].items())
        print(f"one update (lr {learning_rate:g}, {keys}), then eval: each loss's change")
        print(f"{'':<46} {'RETURNN':>16} {'engine':>16} {'relative diff':>14}")
        worst = 0.0
        for name in (n for n in theirs if n.endswith(" after the update")):
            before = name[:-len(" after the update")]
            change, our_change = theirs[name] - theirs[before], ours[name] - ours[before]
            diff = abs(our_change - change) / max(abs(change), 1e-12)
            worst = max(worst, diff)
            print(f"{before:<46} {change:>16.6f} {our_change:>16.6f} {diff:>14.2e}")
        verdicts.append(verdict("one update", worst, UPDATE_TOLERANCE))
        updates = sorted(ours["updates"].items(), key=lambda item: -item[1])
        close = sum(diff <= 1e-3 for _, diff in updates)
        print(f"parameters: {close} of {len(updates)} updated within 1e-3 of RETURNN's update "
              "(|diff| / |RETURNN's update|); the others: " + ", ".join(
                  f"{name} {diff:.2e}" for name, diff in updates[:len(updates) - close]))
    return 0 if all(verdicts) else 1


def verdict(what: str, worst: float, tolerance: float) -> bool:
    passed = worst <= tolerance
    print(f"{'PASS' if passed else 'MISS'} {what}: largest relative difference {worst:.2e}, "
          f"at most {tolerance:g}")
    return passed


if __name__ == "__main__":
    sys.exit(main())
