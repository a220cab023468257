#!/usr/bin/env python3
"""One training update, proved equal to RETURNN's: the RETURNN side, the fixtures, and the comparison.

    .venv/bin/python benchmarks/bench_returnn_parity.py [--cases ce_sgd,...] [--out DIR] [--no-check]
        [--update-fixtures]

A dev script: RETURNN is no dependency of this project. It runs RETURNN in a Python of its own,
``$RETURNN_PYTHON`` or else ``/tmp/returnn-venv/bin/python`` (``python3 -m venv /tmp/returnn-venv &&
/tmp/returnn-venv/bin/pip install tensorflow-cpu==2.15.1 returnn dm-tree h5py``), always with
``DISABLE_CUDA=1`` (``returnn_checkpoints.py`` says why). Without one it recomputes nothing and ends
with exit code 2 and one line saying how to make one.

Each case (``CASES``) is one network (an LSTM of RETURNN's unit ``lstm``, NativeLstm2; a tanh ``linear``;
a ``softmax`` with a ``ce`` or ``ctc`` loss), an optimizer and the gradient keys. For each, RETURNN
(``returnn_side``, the recipe of its TF engine's training step: ``TFNetwork``, ``returnn.tf.updater.Updater``,
``get_optim_op``):

- builds the network with its own random initialisation (graph seed per case; the biases, which RETURNN
  starts at 0, get random values so that their gradients and L2 count) and saves it with
  ``TFNetwork.save_params_to_file``: the checkpoint the engine starts from;
- scores the fixed dev batch (the ``output`` layer's loss times its norm factor: RETURNN's dev score);
- runs ONE update on the fixed train batch (4 sequences; a 2-rank case's ranks take 2 each) and saves the
  parameters after it by RETURNN's variable names, and scores the dev batch again.

A temporary folder (or ``--out DIR``) receives ``<case>.index`` and ``.data-00000-of-00001`` (the
checkpoint before), ``<case>.after.npz`` (the parameters after), ``batches.npz`` (the train and dev
batches of both losses) and ``cases.json`` (per case what RETURNN ran, the engine config meaning the same,
the ranks' sequences, RETURNN's scores and gradient norms; versions, date, command). Then, unless
``--no-check``, the engine does the same update (``tests/mpi_scripts/returnn_parity_step.py``, the code the
tests run: the config's ``load`` of the fixture, one train step; 1-rank cases in this process, 2-rank ones
with real ``mpirun``) and a table, one row per case, shows the largest parameter differences, both
dev-score changes with their ratio, and the case's verdict: PASS when every parameter is within the
tests' tolerance (``PARAM_RTOL``, ``PARAM_ATOL``, as ``numpy.testing.assert_allclose``) and the dev-score
change within ``DEV_CHANGE_RTOL`` of RETURNN's, else MISS naming what is off. Any MISS makes the exit
status 1.

The test fixtures (tests/fixtures/returnn_parity) change only with ``--update-fixtures``, and only when
every case passed (or with ``--no-check``): then the run's files replace theirs (``cases.json`` keeps the
cases not run), each written to a temporary name and renamed. A run that misses leaves them as they were.

Where RETURNN needs help on TensorFlow 2.15 (``RETURNN_PATCHES``), the case's entry says so: ``darc1`` is
written for TensorFlow 1's ``tf.where``, which picks rows; TensorFlow 2's broadcasts and fails.
2-rank cases: RETURNN with Horovod in grad mode sums the ranks' gradients, each with the L2 term, so its
reference here is one process on the union batch with L2 doubled (the same gradient); darc1 is no sum over
ranks (a max per rank), so no 2-rank case has it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

import numpy as np

from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side
from returnn_verdicts import parity_misses, summary, update_fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "returnn_parity")
# what tests/test_returnn_parity.py allows (it imports these): float32 rounding of parameters of size ~1
# after one update, and the dev score's change
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-6
DEV_CHANGE_RTOL = 0.01
STEP_SCRIPT = os.path.join(ROOT, "tests", "mpi_scripts", "returnn_parity_step.py")
INPUT_DIM, NUM_CLASSES = 4, 5
TRAIN_LENGTHS, DEV_LENGTHS = [9, 7, 6, 4], [8, 6, 5]
CTC_TRAIN_LABELS, CTC_DEV_LABELS = [4, 3, 2, 2], [3, 2, 2]
SPLIT = [[0, 1], [2, 3]]  # the sequences of rank 0 and rank 1 in the 2-rank cases
# engine optimizer class -> RETURNN's name of the same rule ("sgd" is Keras' SGD in RETURNN, which its
# Keras wrapper cannot take on TF 2.15; "nadam" is RETURNN's own NadamOptimizer)
RETURNN_OPTIMIZER = {"sgd": "gradientdescent", "adam": "adam", "nadam": "nadam"}
L2, DARC1 = 0.01, 0.01
CLIPS = {"gradient_clip": 0.5, "gradient_clip_norm": 1.2, "gradient_clip_global_norm": 4.0}
# adam's and nadam's first step is g / |g| where the epsilon is tiny (RETURNN's 1e-16), whatever the
# gradient's size: cases that clip with them take an epsilon under which the size counts
EPSILON = 0.1


def _case(loss: str, optimizer: str, lr: float, *, l2: bool = False, darc1: bool = False, ranks: int = 1,
          loss_opts: dict | None = None, **keys) -> dict:
    return {"loss": loss, "optimizer": optimizer, "learning_rate": lr, "l2": L2 if l2 else 0.0,
            "darc1": DARC1 if darc1 else 0.0, "ranks": ranks, "keys": keys, "loss_opts": loss_opts or {}}


CASES: dict[str, dict] = {
    "ce_sgd": _case("ce", "sgd", 0.05),
    "ce_adam": _case("ce", "adam", 0.01),
    "ce_nadam": _case("ce", "nadam", 0.01),
    "ce_adam_epsilon": _case("ce", "adam", 0.03, optimizer_epsilon=0.01),
    "ce_sgd_l2": _case("ce", "sgd", 0.05, l2=True),
    "ce_sgd_darc1": _case("ce", "sgd", 0.05, darc1=True),
    "ce_sgd_clip": _case("ce", "sgd", 0.05, gradient_clip=CLIPS["gradient_clip"]),
    "ce_sgd_clip_norm": _case("ce", "sgd", 0.05, gradient_clip_norm=CLIPS["gradient_clip_norm"]),
    "ce_sgd_clip_global_norm": _case("ce", "sgd", 0.05,
                                     gradient_clip_global_norm=CLIPS["gradient_clip_global_norm"]),
    "ce_adam_all": _case("ce", "adam", 0.05, l2=True, darc1=True, optimizer_epsilon=EPSILON, **CLIPS),
    "ctc_sgd": _case("ctc", "sgd", 0.05),
    "ctc_adam": _case("ctc", "adam", 0.01),
    # RETURNN's own CTC op (Baum-Welch), as 95 of its published configs set it
    "ctc_native": _case("ctc", "adam", 0.01, loss_opts={"beam_width": 1, "use_native": True}),
    "ctc_nadam_l2_clip_norm": _case("ctc", "nadam", 0.05, l2=True, optimizer_epsilon=EPSILON,
                                    gradient_clip_norm=CLIPS["gradient_clip_norm"]),
    "ctc_sgd_all": _case("ctc", "sgd", 0.05, l2=True, darc1=True, **CLIPS),
    "ce_sgd_l2_clip_2ranks": _case("ce", "sgd", 0.05, l2=True, ranks=2,
                                   gradient_clip_global_norm=CLIPS["gradient_clip_global_norm"]),
    "ctc_adam_l2_clip_2ranks": _case("ctc", "adam", 0.05, l2=True, ranks=2, optimizer_epsilon=EPSILON,
                                     **CLIPS),
}
# what RETURNN 1.20261022 on TensorFlow 2.15 cannot run as released, and the fix applied for the reference
RETURNN_PATCHES = {
    "darc1": "LayerBase.get_darc1 runs with TensorFlow 1's tf.where (tf.compat.v1.where), for which it was "
             "written: on TensorFlow 2 tf.where broadcasts its (time*batch,) mask against the (time*batch, "
             "dim) values and fails ('condition [N], then [N,D], and else [N,D] must be broadcastable')",
}


def network(case: dict, l2_factor: float = 1.0) -> dict:
    """The case's network dict, the same for RETURNN and the engine (``l2_factor``: RETURNN's 2-rank
    reference doubles L2)."""
    l2 = {"L2": case["l2"] * l2_factor} if case["l2"] else {}
    output = {"class": "softmax", "loss": case["loss"], "from": "hidden", **l2}
    if case.get("loss_opts"):
        output["loss_opts"] = case["loss_opts"]
    if case["darc1"]:
        output["darc1"] = case["darc1"]
    return {"lstm": {"class": "rec", "unit": "lstm", "n_out": 6, "from": "data", **l2},
            "hidden": {"class": "linear", "activation": "tanh", "n_out": 5, "from": "lstm", **l2},
            "output": output}


def extern_data() -> dict:
    return {"data": {"dim": INPUT_DIM}, "classes": {"dim": NUM_CLASSES, "sparse": True}}


def returnn_config(case: dict) -> dict:
    """What RETURNN's Config gets (besides the network)."""
    return {"extern_data": extern_data(), "optimizer": {"class": RETURNN_OPTIMIZER[case["optimizer"]]},
            "learning_rate": case["learning_rate"], **case["keys"]}


def engine_config(case: dict) -> dict:
    """The engine config that says the same (the fixture's checkpoint comes in as ``load``)."""
    config = {"extern_data": extern_data(), "network": network(case),
              "optimizer": {"class": case["optimizer"]}, "learning_rate": case["learning_rate"],
              **case["keys"]}
    if case["ranks"] > 1:  # grad mode, the ranks' gradients summed: RETURNN's Horovod defaults
        config.update(use_horovod=True, horovod_reduce_type="grad", horovod_dataset_distribution="shard")
    return config


def batches() -> dict[str, np.ndarray]:
    """The train and dev batches of both losses: ``<loss>/<train|dev>/<key>``, batch-major, zero padding."""
    rng = np.random.RandomState(2026)
    out = {}
    for part, lengths, ctc_labels in (("train", TRAIN_LENGTHS, CTC_TRAIN_LABELS),
                                      ("dev", DEV_LENGTHS, CTC_DEV_LABELS)):
        data = rng.standard_normal((len(lengths), max(lengths), INPUT_DIM)).astype(np.float32)
        frame_classes = rng.randint(0, NUM_CLASSES, (len(lengths), max(lengths))).astype(np.int32)
        labels = rng.randint(0, NUM_CLASSES, (len(lengths), max(ctc_labels))).astype(np.int32)
        for b, (n, m) in enumerate(zip(lengths, ctc_labels)):
            data[b, n:] = 0
            frame_classes[b, n:] = 0
            labels[b, m:] = 0
        for loss, classes, class_lengths in (("ce", frame_classes, lengths), ("ctc", labels, ctc_labels)):
            out[f"{loss}/{part}/data"] = data
            out[f"{loss}/{part}/data_lengths"] = np.array(lengths, np.int32)
            out[f"{loss}/{part}/classes"] = classes
            out[f"{loss}/{part}/classes_lengths"] = np.array(class_lengths, np.int32)
    return out


def case_seed(name: str) -> int:
    return zlib.crc32(name.encode()) % 2**31


# ----- the RETURNN side: runs under RETURNN's Python (``--returnn-side JOBS.json``) -----
def _patch_darc1() -> None:
    """RETURNN_PATCHES["darc1"]."""
    import tensorflow as tf
    from returnn.tf.layers.base import LayerBase

    original = LayerBase.get_darc1

    def get_darc1(self):
        where = tf.where
        tf.where = tf.compat.v1.where
        try:
            return original(self)
        finally:
            tf.where = where

    LayerBase.get_darc1 = get_darc1


def returnn_side(jobs_path: str) -> None:
    import tensorflow as tf
    from returnn.config import Config
    from returnn.tf.network import TFNetwork
    from returnn.tf.updater import Updater
    from returnn.util.basic import BackendEngine

    # as RETURNN's rnn.py selects it for a config with use_tensorflow: BackendEngine.TensorFlow would
    # also select RETURNN's frontend on TF, which raises the minimum behavior_version to 16, where a config
    # without behavior_version runs with RETURNN's defaults of version 0 (merge_dims, conv, batch_norm, ...)
    BackendEngine.select_engine(engine=BackendEngine.TensorFlowNetDict)
    tf.compat.v1.disable_eager_execution()
    _patch_darc1()  # changes nothing for networks without darc1
    with open(jobs_path) as f:
        jobs = json.load(f)
    arrays = np.load(jobs["batches"])
    results = {}
    for job in jobs["cases"]:
        case = job["case"]
        config = Config({**returnn_config(case), "network": network(case, l2_factor=case["ranks"])})
        lr = case["learning_rate"]
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            tf.compat.v1.set_random_seed(job["seed"])
            net = TFNetwork(config=config, train_flag=True)
            net.construct_from_dict(config.typed_value("network"))
            updater = Updater(config=config, network=net, initial_learning_rate=lr)
            updater.set_trainable_vars(net.get_trainable_params())
            optim_op = updater.get_optim_op()
            net.initialize_params(session)
            rng = np.random.RandomState(job["seed"])
            for var in net.get_params_list():  # RETURNN starts biases at 0: random ones make them count
                if var.name.split("/")[-1].startswith("b"):
                    var.load((0.3 * rng.standard_normal(var.shape.as_list())).astype(np.float32), session)
            updater.init_optimizer_vars(session)
            updater.set_learning_rate(lr, session)
            net.save_params_to_file(job["checkpoint"], session)
            extern = net.extern_data.data

            def feed(part: str) -> dict:
                prefix = f"{case['loss']}/{part}/"
                return {extern["data"].placeholder: arrays[prefix + "data"],
                        extern["data"].get_sequence_lengths(): arrays[prefix + "data_lengths"],
                        extern["classes"].placeholder: arrays[prefix + "classes"],
                        extern["classes"].get_sequence_lengths(): arrays[prefix + "classes_lengths"]}

            holder = net.losses_dict["output"]
            score = holder.get_loss_value() * holder.get_norm_factor()  # RETURNN's dev_score_output
            params = {v.name[:-2]: v for v in net.get_params_list()}
            grads = tf.gradients(net.get_objective(), list(params.values()))
            dev_before = float(session.run(score, feed("dev")))
            constraints = net.get_total_constraints()  # None, or (int 0 without any layer's) a tensor
            if not isinstance(constraints, tf.Tensor):
                constraints = None
            grad_values, loss, constraints = session.run(
                [grads, holder.get_loss_value(), tf.constant(0.0) if constraints is None else constraints],
                feed("train"))
            session.run(optim_op, feed("train"))
            after = session.run(params)
            dev_after = float(session.run(score, feed("dev")))
        np.savez(job["after"], **after)
        results[job["name"]] = {
            "dev_score_before": dev_before, "dev_score_after": dev_after, "train_loss_sum": float(loss),
            "train_constraints": float(constraints),
            "grad_norms": {n: float(np.sqrt(np.sum(np.square(g)))) for n, g in zip(params, grad_values)},
            "grad_max_abs": float(max(np.abs(g).max() for g in grad_values)),
            "grad_global_norm": float(np.sqrt(sum(np.sum(np.square(g)) for g in grad_values)))}
    with open(jobs["results"], "w") as f:
        json.dump(results, f)


# ----- driving RETURNN, the fixtures -----
def run_returnn(python: str, names: list[str], out: str, tmp: str) -> dict:
    """RETURNN's update of each case; writes the fixtures' files into ``out``; returns RETURNN's numbers."""
    np.savez(os.path.join(out, "batches.npz"), **batches())
    jobs = {"batches": os.path.join(out, "batches.npz"), "results": os.path.join(tmp, "results.json"),
            "cases": [{"name": n, "case": CASES[n], "seed": case_seed(n), "checkpoint": os.path.join(tmp, n),
                       "after": os.path.join(out, f"{n}.after.npz")} for n in names]}
    path = os.path.join(tmp, "jobs.json")
    with open(path, "w") as f:
        json.dump(jobs, f)
    run_returnn_side(python, __file__, path)
    for name in names:
        for suffix in (".index", ".data-00000-of-00001"):  # RETURNN's .meta graph only RETURNN reads
            shutil.copyfile(os.path.join(tmp, name + suffix), os.path.join(out, name + suffix))
    with open(jobs["results"]) as f:
        return json.load(f)


def write_manifest(python: str, names: list[str], results: dict, out: str, command: str) -> None:
    path = os.path.join(out, "cases.json")
    cases = {}
    if os.path.exists(path):  # a run of some cases keeps the others
        with open(path) as f:
            cases = json.load(f)["cases"]
    for name in names:
        case = CASES[name]
        cases[name] = {
            "returnn": {**returnn_config(case), "network": network(case, l2_factor=case["ranks"])},
            "returnn_patches": [RETURNN_PATCHES["darc1"]] if case["darc1"] else [],
            "engine": engine_config(case), "loss": case["loss"], "ranks": case["ranks"],
            "rank_sequences": SPLIT if case["ranks"] == 2 else [list(range(len(TRAIN_LENGTHS)))],
            "seed": case_seed(name), **results[name]}
    manifest = {"made_by": command, **returnn_versions(python), "date": datetime.date.today().isoformat(),
                "cases": dict(sorted(cases.items()))}
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)


# ----- the engine side and the table -----
def engine_results(out: str, names: list[str], tmp: str) -> dict[str, dict]:
    """The engine's update of each case from the fixtures: in this process, or with mpirun for N ranks."""
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # each case traces its own steps: no retracing warnings
    sys.path.insert(0, os.path.dirname(STEP_SCRIPT))
    from returnn_parity_step import one_update, read_results

    results = {n: one_update(out, n) for n in names if CASES[n]["ranks"] == 1}
    parallel = [n for n in names if CASES[n]["ranks"] > 1]
    for ranks in sorted({CASES[n]["ranks"] for n in parallel}):
        these = [n for n in parallel if CASES[n]["ranks"] == ranks]
        mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
        env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", PYTHONPATH=ROOT,
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        done = subprocess.run([mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(ranks),
                               sys.executable, STEP_SCRIPT, out, tmp, *these],
                              env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"bench_returnn_parity: the engine's {ranks}-rank run failed (exit {done.returncode}):\n"
                     f"{(done.stdout + done.stderr)[-4000:]}")
        results.update({n: read_results(tmp, n) for n in these})
    return results


def differences(out: str, name: str, engine: dict) -> tuple[float, float]:
    """Max |engine - RETURNN| over the parameters after the update, and the max relative one over values
    with |RETURNN's| >= 0.01."""
    returnn = np.load(os.path.join(out, f"{name}.after.npz"))
    abs_diff = max(float(np.abs(engine["params"][k] - returnn[k]).max()) for k in returnn.files)
    rel = [np.abs(engine["params"][k] - returnn[k])[np.abs(returnn[k]) >= 0.01] / np.abs(returnn[k])[
        np.abs(returnn[k]) >= 0.01] for k in returnn.files]
    return abs_diff, float(max(r.max(initial=0.0) for r in rel))


def table(out: str, names: list[str], engine: dict[str, dict]) -> tuple[list[str], list[str]]:
    """The table's lines, and the names of the cases that missed."""
    with open(os.path.join(out, "cases.json")) as f:
        cases = json.load(f)["cases"]
    lines = ["| case | ranks | max abs param diff | max rel param diff | dev-score change RETURNN | engine | "
             "ratio | verdict |", "|---|---|---|---|---|---|---|---|"]
    missed = []
    for name in names:
        returnn_after, params = dict(np.load(os.path.join(out, f"{name}.after.npz"))), engine[name]["params"]
        theirs = cases[name]["dev_score_after"] - cases[name]["dev_score_before"]
        ours = engine[name]["dev_score_after"] - engine[name]["dev_score_before"]
        misses = parity_misses(returnn_after, params, theirs, ours, PARAM_RTOL, PARAM_ATOL, DEV_CHANGE_RTOL)
        comparable = sorted(returnn_after) == sorted(params) and all(
            params[k].shape == v.shape for k, v in returnn_after.items())
        diffs = "{:.1e} | {:.1e}".format(*differences(out, name, engine[name])) if comparable else "- | -"
        ratio = f"{ours / theirs:.5f}" if theirs else "-"
        verdict = "PASS" if not misses else "MISS: " + "; ".join(misses)
        missed += [name] if misses else []
        lines.append(f"| {name} | {cases[name]['ranks']} | {diffs} | {theirs:+.6f} | {ours:+.6f} | {ratio} | "
                     f"{verdict} |")
    return lines, missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated names of CASES")
    parser.add_argument("--out", help="keep the run's files here [a temporary folder]")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the engine's update and print the table [on]")
    parser.add_argument("--update-fixtures", action="store_true",
                        help=f"replace the test fixtures in {os.path.relpath(FIXTURES, ROOT)} with this "
                             "run's files when every case passed")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)  # the RETURNN process
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    if args.out and os.path.realpath(args.out) == os.path.realpath(FIXTURES):
        parser.error("--out names the test fixtures: pass --update-fixtures instead (it replaces them only "
                     "when every case passed)")
    python = returnn_python()
    if python is None:
        return no_returnn("bench_returnn_parity", "nothing is recomputed")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the engine imports TensorFlow
    command = "benchmarks/bench_returnn_parity.py " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or os.path.join(tmp, "out")
        os.makedirs(out, exist_ok=True)
        results = run_returnn(python, names, out, tmp)
        write_manifest(python, names, results, out, command.strip())
        print(f"wrote RETURNN's update of {len(names)} case(s) to {out} ({returnn_versions(python)})")
        status = 0
        if args.check:
            from engine.runtime import log

            log.init(verbosity=log.WARNING)
            lines, missed = table(out, names, engine_results(out, names, tmp))
            last, status = summary(names, missed, f"parameters rtol {PARAM_RTOL:g}, atol {PARAM_ATOL:g}; "
                                   f"dev-score change {100 * DEV_CHANGE_RTOL:g} %")
            print("\n".join(lines + [last]))
        if args.update_fixtures:
            files = ["batches.npz"] + [n + suffix for n in names
                                       for suffix in (".index", ".data-00000-of-00001", ".after.npz")]
            print(update_fixtures(status, out, files, FIXTURES))
    return status


if __name__ == "__main__":
    sys.exit(main())
