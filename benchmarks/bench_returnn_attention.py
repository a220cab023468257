#!/usr/bin/env python3
"""RETURNN's LSTM attention system (a ``rec`` layer whose unit is a subnetwork: the decoder loop) beside
RETURNN: its loop plan, its losses at initialisation and after one update, equal or not.

    RETURNN_PYTHON=/tmp/returnn-venv/bin/python \
        .venv/bin/python benchmarks/bench_returnn_attention.py CHECKOUT
        [--config 2019-librispeech-system/attention/base2.config] [--seqs 3] [--frames 36] [--no-update]
        [--scale 0.0625] [--classes 60]

CHECKOUT is a checkout of ``rwth-i6/returnn-experiments`` (the project holds none of its files). The
config's ``network`` is read as ``returnn_setups.py`` reads a config (``config.bool("cheating", False)``
gives False, ``config.has("beam_size")`` False, so ``beam_size`` 12); its ``pretrain`` is not run: the
full network is compared. Its LibriSpeech corpus is replaced by a batch of random features (40 dims, as
the config's) and random BPE-like labels (ids 1..C-1, ending in EOS 0, different lengths per sequence).

The dims are reduced, for speed on a small machine: every ``n_out`` and ``split_dims`` size is multiplied
by ``--scale`` (the LSTMs' 1024 become 64, the decoder's 1000 become 62, ``returnn_attention_side.reduced``
says how), and the 10025 BPE classes become ``--classes``. The network is otherwise the config's.

RETURNN (found as ``returnn_side.py`` says) builds the network as its train task does, with its train flag
a tensor (``get_global_train_flag_placeholder``), fed False to score, as it scores the dev set: a build
with ``train_flag`` False would not do, since RETURNN then makes the decoder's subnetwork without losses
(its ``eval_flag`` is False), so the loop computes the labels only. It initialises the parameters with its
own random initialisation and saves the checkpoint, and prints the rec layer's three lists (what it logs
as "Input layers moved out of loop", "Output layers moved out of loop", "Layers in loop") of that build,
of builds with ``train_flag`` True and False, and of a search build (``search_flag`` True, beam 12, where
everything stays in the loop, "end" first or last as the process's string hashing orders a set); then it
scores the batch: each loss layer's loss sum, error and count (``LossHolder``: the decoder's
label-smoothed CE, CTC, the decision's edit distance), the total loss, and the outputs of the layers it
hands out (those of the loop only when it accumulates them). The engine loads that checkpoint into the
same network and does the same; PASS when the largest relative difference is at most ``TOLERANCE`` (the
issue's 1e-5) and its plan's lists equal in order those of RETURNN's train-task build (``REFERENCE_PLAN``).

Then (unless ``--no-update``) both make ONE training update from that checkpoint with the config's
optimizer keys (``adam``, ``optimizer_epsilon``, ``gradient_clip`` 0) and ``learning_rates[0]``, every
dropout 0 (two programs cannot draw alike), and score again. Compared: each loss's change (within
``UPDATE_TOLERANCE``, 1 %, of RETURNN's) and per parameter the relative difference of the updates, with
RETURNN's gradient beside it (``update_differences``).

The sequences all have ``--frames`` frames (a multiple of 6, the encoder's pooling 3 * 2), so the max
pooling's "same" padding sees no padding frames; the labels of each are fewer than its encoder frames,
as CTC needs.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import traceback

import numpy as np

from returnn_attention_side import (ENGINE_PLAN, PLAN_BUILDS, PLAN_KEYS, deterministic, make_batch, reduced,
                                    returnn_side)
from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side

DEFAULT_CONFIG = "2019-librispeech-system/attention/base2.config"
TOLERANCE = 1e-5
UPDATE_TOLERANCE = 0.01
REFERENCE_PLAN = "train flag tensor"
UPDATER_KEYS = ("adam", "nadam", "optimizer", "optimizer_epsilon", "gradient_clip",
                "gradient_clip_global_norm", "gradient_noise")


def engine_model(job: dict, folder: str, network: dict):
    """The engine's model of ``network`` from a config file, with RETURNN's checkpoint loaded, and that
    config."""
    from engine.config.loader import Config
    from engine.model import build_model
    from engine.training.checkpoints.initial_params import load_for_inference

    path = os.path.join(folder, "engine.config")
    keys = {**job["updater"], "learning_rate": job["learning_rate"]}
    lines = [f"network = {network!r}", f"extern_data = {job['extern_data']!r}", "target = 'classes'"] + [
        f"{key} = {value!r}" for key, value in keys.items()]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    config = Config.from_sources([path], [])
    model = build_model(config, input_dim=job["extern_data"]["data"]["dim"], input_sparse=False,
                        target_dims={"classes": job["extern_data"]["classes"]["dim"]})
    load_for_inference(Config({"load": job["checkpoint"]}), model, job["checkpoint"])
    return model, config


def engine_outputs(model, batch) -> dict:
    """The engine's model in eval on ``batch``, given the labels as RETURNN's decoder reads them."""
    import tensorflow as tf

    return model(batch["data"], tf.constant(batch["lengths"]), training=False, **engine_targets(batch))


def engine_targets(batch) -> dict:
    import tensorflow as tf

    return {"streams": {"classes": tf.constant(batch["classes"])},
            "stream_lengths": {"classes": tf.constant(batch["label_lengths"])}}


def engine_scores(model, batch, outputs: dict, numbers: dict) -> None:
    """Into ``numbers``: those ``returnn_side``'s ``scores`` gives, for the engine's ``outputs``."""
    targets = engine_targets(batch)
    targets, target_lengths = targets["streams"], targets["stream_lengths"]
    numbers["total loss"] = float(model.compute_losses(outputs, targets, target_lengths).objective)
    for name, (loss, error, count) in model.layer_loss_sums(outputs, targets, target_lengths).items():
        numbers.update({f"{name} loss": float(loss), f"{name} error": float(error),
                        f"{name} count": float(count)})


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
    Steps(model, updater, Strategy(LocalCommunicator())).train(SimpleNamespace(
        data={"data": batch["data"], "classes": batch["classes"]},
        lengths={"data": batch["lengths"], "classes": batch["label_lengths"]}))


def output_difference(ours, theirs: np.ndarray, lengths: np.ndarray) -> float:
    """max |engine's - RETURNN's| / max |RETURNN's| over each sequence's frames (RETURNN's lengths), or
    inf where the shapes do not agree."""
    ours = np.asarray(ours)
    if theirs.ndim < 2 or lengths.ndim != 1:  # no time axis
        same = ours.shape == theirs.shape
        return float(np.abs(ours - theirs).max() / np.abs(theirs).max()) if same else np.inf
    if ours.ndim != theirs.ndim or ours.shape[0] != theirs.shape[0] or ours.shape[2:] != theirs.shape[2:] \
            or ours.shape[1] < lengths.max():
        return np.inf
    worst = max(np.abs(ours[b, :n] - theirs[b, :n]).max(initial=0.0) for b, n in enumerate(lengths))
    return float(worst / max(np.abs(theirs).max(), 1e-30))


def engine_side(job: dict, folder: str, results: dict) -> None:
    """Into ``results``, as far as the engine gets: its plan, output differences, numbers and (unless no
    update) those after the update and the update differences."""
    batch = np.load(job["batch"])
    network = ast.literal_eval(job["network"])
    model, _ = engine_model(job, folder, network)
    plan = model.layers["output"].plan
    results["plan"] = {key: list(getattr(plan, ENGINE_PLAN[key])) for key in PLAN_KEYS}
    outputs = engine_outputs(model, batch)
    theirs = np.load(job["outputs"])
    for name in (n for n in theirs.files if not n.endswith(":lengths")):
        results["outputs"][name] = (output_difference(outputs[name], theirs[name], theirs[f"{name}:lengths"])
                                    if name in outputs else np.inf)
    scores_or_failure(model, batch, outputs, results["numbers"], results["failures"])
    if job["after"]:
        model, config = engine_model(job, folder, deterministic(network))
        engine_update(model, config, batch)
        results["updates"] = update_differences(model, job)
        scores_or_failure(model, batch, engine_outputs(model, batch), results["numbers after the update"],
                          results["failures"])


def scores_or_failure(model, batch, outputs: dict, numbers: dict, failures: list[str]) -> None:
    """``engine_scores``, or its failure added to ``failures``: the steps after it need only the model."""
    try:
        engine_scores(model, batch, outputs, numbers)
    except Exception:  # noqa: BLE001 - printed at the end, and the run fails
        failures.append(traceback.format_exc())


def update_differences(model, job: dict) -> dict[str, tuple[float, str]]:
    """Per parameter (RETURNN's names): |engine's update - RETURNN's| / |RETURNN's update| (L2 norms), and
    RETURNN's largest gradient and its update's RMS in units of the learning rate: Adam's first step is
    about lr * sign(gradient) where the gradient is far above ``optimizer_epsilon``, so an RMS well below
    lr says the gradients are near epsilon, where their rounding shows in the update."""
    import tensorflow as tf
    from engine.training.checkpoints.returnn_format import ReturnnView

    before, after = tf.train.load_checkpoint(job["checkpoint"]), tf.train.load_checkpoint(job["after"])
    gradients = np.load(job["gradients"])
    differences = {}
    for name, value in ReturnnView(model).values().items():
        theirs = after.get_tensor(name) - before.get_tensor(name)
        where = ""
        if name in gradients.files:
            where = (f" (RETURNN's largest |gradient| {np.abs(gradients[name]).max():.1e}, its update's RMS "
                     f"{np.sqrt(np.mean(theirs ** 2)) / job['learning_rate']:.1e} lr)")
        differences[name] = (float(np.linalg.norm(value - after.get_tensor(name))
                                   / max(np.linalg.norm(theirs), 1e-30)), where)
    return differences


def print_plans(theirs: dict, ours: dict | None) -> bool:
    """RETURNN's lists of each build and the engine's; True when the engine's equal in order those RETURNN
    computes its scores with (its train task's build, ``REFERENCE_PLAN``)."""
    equal = True
    for key in PLAN_KEYS:
        print(f"{key}:")
        for build, _, _ in PLAN_BUILDS:
            print(f"  RETURNN, {build + ':':<19} {theirs[f'plan, {build}'][key]}")
        if ours is not None:
            mine, reference = ours[key], theirs[f"plan, {REFERENCE_PLAN}"][key]
            same, as_sets = mine == reference, set(mine) == set(reference)
            equal = equal and same
            print(f"  {'engine:':<28} {mine}\n  {'PASS' if same else 'FAIL'} in order, "
                  f"{'PASS' if as_sets else 'FAIL'} as sets (against RETURNN's {REFERENCE_PLAN})")
    return equal


def print_numbers(theirs: dict, ours: dict) -> float:
    print(f"{'at initialisation, eval':<46} {'RETURNN':>16} {'engine':>16} {'relative diff':>14}")
    worst = 0.0
    for name, value in theirs.items():
        mine = ours.get(name, np.nan)
        diff = abs(mine - value) / max(abs(value), 1e-12) if np.isfinite(mine) else np.inf
        worst = max(worst, diff)
        print(f"{name:<46} {value:>16.6f} {mine:>16.6f} {diff:>14.2e}")
    return worst


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the batch and the comparison, shared with ``bench_returnn_trafo.py``."""
    parser.add_argument("--seqs", type=int, default=3)
    parser.add_argument("--frames", type=int, default=36, help="frames of each sequence (a multiple of 6)")
    parser.add_argument("--classes", type=int, default=60, help="the label vocabulary (EOS 0 included)")
    parser.add_argument("--no-update", action="store_true", help="compare at initialisation only")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)


def read_checked_setup(parser: argparse.ArgumentParser, args: argparse.Namespace, name: str) -> tuple:
    """(RETURNN's python, the config's setup, its input dim, its first learning rate) after the checks of
    the arguments; None where RETURNN is missing (``no_returnn`` has said so: exit status 2)."""
    if not args.checkout:
        parser.error("CHECKOUT is required")
    if args.frames % 6 or args.frames < 12:
        parser.error("--frames must be a multiple of 6, at least 12")
    python = returnn_python()
    if python is None:
        no_returnn(name, "nothing is compared")
        return None
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from engine.runtime import log
    from returnn_setups import read_setup

    log.init(verbosity=log.WARNING)
    setup = read_setup(args.checkout, args.config)
    rates = setup.namespace.get("learning_rates")
    learning_rate = float(rates[0] if rates else setup.namespace.get("learning_rate", 0.001))
    return python, setup, int(setup.namespace.get("num_inputs", 40)), learning_rate


def compare(args: argparse.Namespace, checked: tuple, network: dict, title: str, script: str,
            layers: tuple[str, ...] | None = None) -> int:
    """Both sides on one random batch; the table and the verdicts; the exit code. ``script`` runs the
    RETURNN side (``--returnn-side``); ``layers``: the outputs compared (default ``LAYERS``)."""
    python, setup, dim, learning_rate = checked
    with tempfile.TemporaryDirectory() as folder:
        batch = os.path.join(folder, "batch.npz")
        np.savez(batch, **make_batch(args.seqs, args.frames, dim, args.classes))
        job = {"network": repr(network), "batch": batch, "seed": 42,
               "extern_data": {"data": {"dim": dim, "sparse": False},
                               "classes": {"dim": args.classes, "sparse": True}},
               "checkpoint": os.path.join(folder, "returnn-init"), "results": os.path.join(folder, "r.json"),
               "outputs": os.path.join(folder, "outputs.npz"), "gradients": os.path.join(folder, "grads.npz"),
               "after": None if args.no_update else os.path.join(folder, "returnn-after"),
               "updater": {k: setup.namespace[k] for k in UPDATER_KEYS if k in setup.namespace},
               "learning_rate": learning_rate}
        if layers is not None:
            job["layers"] = list(layers)
        with open(os.path.join(folder, "job.json"), "w") as f:
            json.dump(job, f)
        run_returnn_side(python, script, os.path.join(folder, "job.json"))
        with open(job["results"]) as f:
            theirs = json.load(f)
        print(f"{title}: {args.seqs} sequences of {args.frames} frames, labels "
              f"{np.load(batch)['label_lengths'].tolist()}; RETURNN {returnn_versions(python)}")
        ours = {"numbers": {}, "outputs": {}, "numbers after the update": {}, "failures": []}
        try:
            engine_side(job, folder, ours)
        except Exception:  # noqa: BLE001 - RETURNN's reference and what the engine gave are still printed
            ours["failures"].append(traceback.format_exc())
    verdicts = report(theirs, ours, job)
    for failure in dict.fromkeys(ours["failures"]):  # the same failure before and after the update once
        print(f"FAIL the engine side:\n{failure}")
    return 0 if all(verdicts) and not ours["failures"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", nargs="?", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the setup's config, under the checkout")
    parser.add_argument("--scale", type=float, default=0.0625, help="factor of every n_out and split dim")
    add_batch_arguments(parser)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    checked = read_checked_setup(parser, args, "bench_returnn_attention")
    if checked is None:
        return 2  # no RETURNN (said on stderr)
    setup = checked[1]
    if setup.network is None:
        sys.exit(f"bench_returnn_attention: {args.config} leaves no network dict")
    return compare(args, checked, reduced(setup.network, args.scale),
                   f"{args.config} at scale {args.scale:g}, {args.classes} classes", __file__)


def report(theirs: dict, ours: dict, job: dict) -> list[bool]:
    """The table of both sides' numbers (the engine's nan where it gave none); the verdicts."""
    verdicts = [print_plans(theirs, ours.get("plan"))]
    worst = print_numbers(theirs["numbers"], ours["numbers"])
    for name, why in theirs.get("not compared", {}).items():
        print(f"{name + ': output not compared':<46} RETURNN: {why}")
    for name in theirs["outputs"]:
        diff = ours["outputs"].get(name, np.inf)
        worst = max(worst, diff)
        print(f"{name + ': output, max |diff| / max':<46} {str(theirs['outputs'][name]):>33} {diff:>14.2e}")
    verdicts.append(verdict("at initialisation", worst, TOLERANCE))
    if not job["after"]:
        return verdicts
    keys = ", ".join(f"{k} = {v!r}" for k, v in job["updater"].items())
    print(f"one update (lr {job['learning_rate']:g}, {keys}), then eval: each loss's change "
          f"(the errors and counts after it)")
    worst = 0.0
    after, our_after = theirs["numbers after the update"], ours["numbers after the update"]
    for name, value in after.items():
        mine = our_after.get(name, np.nan)
        if not name.endswith("loss"):  # errors are counts of labels: compared at init only
            print(f"{name + ' after the update':<46} {value:>16.6f} {mine:>16.6f}")
            continue
        change, our_change = value - theirs["numbers"][name], mine - ours["numbers"].get(name, np.nan)
        diff = abs(our_change - change) / max(abs(change), 1e-12) if np.isfinite(our_change) else np.inf
        worst = max(worst, diff)
        print(f"{name + ' change':<46} {change:>16.6f} {our_change:>16.6f} {diff:>14.2e}")
    verdicts.append(verdict("one update", worst, UPDATE_TOLERANCE))
    updates = sorted(ours.get("updates", {}).items(), key=lambda item: -item[1][0])
    close = sum(diff <= 1e-3 for _, (diff, _) in updates)
    verdicts.append(bool(updates))
    print(f"parameters: {close} of {len(updates)} updated within 1e-3 of RETURNN's update "
          "(|diff| / |RETURNN's update|); the others:")
    for name, (diff, where) in updates[:len(updates) - close]:
        print(f"  {name} {diff:.2e}{where}")
    return verdicts


def verdict(what: str, worst: float, tolerance: float) -> bool:
    passed = worst <= tolerance
    print(f"{'PASS' if passed else 'FAIL'} {what}: largest relative difference {worst:.2e}, "
          f"at most {tolerance:g}")
    return passed


if __name__ == "__main__":
    sys.exit(main())
