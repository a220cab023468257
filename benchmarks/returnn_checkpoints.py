#!/usr/bin/env python3
"""RETURNN's TensorFlow checkpoints both ways, against real RETURNN: the proof, and the test fixtures.

    .venv/bin/python benchmarks/returnn_checkpoints.py [--cases dense,rec_LSTM,...] [--update-fixtures]

A dev script: RETURNN is no dependency of this project. It runs RETURNN in a Python of its own,
``$RETURNN_PYTHON`` or else ``/tmp/returnn-venv/bin/python`` (``python3 -m venv /tmp/returnn-venv &&
/tmp/returnn-venv/bin/pip install tensorflow-cpu==2.15.1 returnn dm-tree h5py``), and ends with exit
code 2 and one line saying so when there is none. RETURNN runs with ``DISABLE_CUDA=1``: a CUDA toolkit
on a machine without GPU makes it compile its native LSTM ops with CUDA headers that tensorflow-cpu
lacks (``bench_returnn.py``).

Each case (``CASES``, in ``returnn_cases.py``) is a ``network`` dict run on fixed inputs (3 sequences of
7, 5 and 2 frames):

- in: RETURNN builds the network (``TFNetwork.construct_from_dict``), sets every parameter to random
  values (biases too, so that a forget bias counts), runs the inputs and saves the checkpoint with
  ``TFNetwork.save_params_to_file`` (TensorFlow's Saver, as its training does). The engine loads it as
  ``load`` (``initial_params.load_for_inference``) and runs the inputs. Both also differentiate one
  scalar, the sum over the valid frames of ``output`` times fixed random weights (``probe``), by every
  parameter (under RETURNN's names: an LSTM's gradient split as its parameters are) and by dense input;
- out: the engine builds the network, sets random values, saves its own checkpoint and exports it with
  ``export-returnn-checkpoint``'s function; RETURNN loads that (``TFNetwork.load_params_from_file``, which
  needs every variable of its network in the file) and runs the inputs.

Printed per case and direction: the largest absolute difference between RETURNN's and the engine's
output of every layer over the valid frames (in: and of every gradient, relative to the largest value
of RETURNN's where that is above 1), and the case's verdict: PASS when all are at most ``TOLERANCE``
(the tests'), else MISS. Any MISS makes the exit status 1.

Everything is written to a temporary folder. ``--update-fixtures`` then, and only when every case passed,
puts the "in" side into the tests' fixtures (``FIXTURES``; each file written to a temporary name and
renamed): ``<case>.index`` and ``.data-00000-of-00001`` (RETURNN's checkpoint, without the ``.meta`` that
only RETURNN reads), ``<case>.npz`` (``data``, ``lengths``, ``out:<layer>``, RETURNN's outputs, and
``grad:<name>``, its gradients, ``ids:<stream>`` and ``ids_lengths:<stream>``, the streams of class ids
fed: ``returnn_case_inputs.py``) and ``cases.json`` (each case's network and streams, RETURNN's and
TensorFlow's versions; the cases not run are kept).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from returnn_case_inputs import case_seed, inputs, probe, random_values, stream_ids
from returnn_cases import (CASES, DENSE, GRADIENTS_NOT_COMPARED, LENGTHS, NO_RETURNN_GRADIENT,  # noqa: F401
                           WITHOUT_BATCH)
from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side
from returnn_verdicts import summary, update_fixtures, within_tolerance

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures",
                        "returnn_ckpt")
TOLERANCE = 1e-5  # the largest difference of a layer's output (tests/test_returnn_checkpoints.py's)


# ----- the RETURNN side: runs under RETURNN's Python (``--returnn-side JOBS.json``) -----
def returnn_side(jobs_path: str) -> None:
    import tensorflow as tf
    from returnn.config import Config
    from returnn.tf.network import TFNetwork
    from returnn.util.basic import BackendEngine

    # as RETURNN's rnn.py selects it for a config with use_tensorflow: BackendEngine.TensorFlow would
    # also select RETURNN's frontend on TF, which raises the minimum behavior_version to 16, where a config
    # without behavior_version runs with RETURNN's defaults of version 0 (merge_dims, conv, batch_norm, ...)
    BackendEngine.select_engine(engine=BackendEngine.TensorFlowNetDict)
    tf.compat.v1.disable_eager_execution()
    with open(jobs_path) as f:
        jobs = json.load(f)
    for job in jobs:
        case = CASES[job["case"]]
        data, lengths = inputs(case)
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            # RETURNN's rec loop has no gradient outside training (its while_loop's back_prop): a case with a
            # loop (and nothing that differs in training, such as dropout) runs with train_flag
            net = TFNetwork(config=Config({"extern_data": case["extern_data"]}),
                            train_flag=case.get("train_flag", False))
            net.construct_from_dict(case["network"])
            net.initialize_params(session)
            if job["mode"] == "make":
                params = {v.name[:-2]: v for v in net.get_params_list()}
                values = random_values({n: v.shape.as_list() for n, v in params.items()}, seed=job["seed"])
                for name, var in params.items():
                    var.load(values[name], session)
                net.save_params_to_file(job["checkpoint"], session)
            else:
                net.load_params_from_file(job["checkpoint"], session)
            extern = net.extern_data.data["data"]
            # the network's layers, and unit layers read outside their rec layer ("<rec>/<layer>")
            layers = list(case["network"]) + sorted(
                {src for opts in case["network"].values() for src in _sources(opts) if "/" in src})
            # an output without batch axis (WITHOUT_BATCH) as it is: copy_as_batch_major asserts one; the
            # features last, as the engine has them (softmax_over_spatial puts RETURNN's time axis last)
            fetches = [_engine_layout(out).placeholder for out in (net.get_layer(n).output for n in layers)]
            # the targets' lengths are the data's (a hybrid's alignment), for a size_base of "data:classes"
            feed = {extern.placeholder: data, extern.get_sequence_lengths(): lengths,
                    net.extern_data.data["classes"].get_sequence_lengths(): lengths}
            for key, (ids, ids_lengths) in stream_ids(case).items():
                stream = net.extern_data.data[key]
                feed.update({stream.placeholder: ids, stream.get_sequence_lengths(): ids_lengths})
            outs = session.run(fetches, feed)
            grads = {}
            if job["mode"] == "make" and job["case"] not in NO_RETURNN_GRADIENT:
                # the gradients of sum(output * probe) over the valid frames
                # (of the case's gradient_of layer: a vector per sequence (B, F) is one frame (B, 1, F))
                output = net.layers[case.get("gradient_of", "output")].output.copy_as_batch_major()
                frames = output.placeholder if output.have_time_axis() else output.placeholder[:, None]
                valid = output.get_sequence_lengths() if output.have_time_axis() else tf.ones_like(lengths)
                weights = tf.compat.v1.placeholder(tf.float32, [None, None, output.dim])
                mask = tf.sequence_mask(valid, tf.shape(frames)[1], dtype=tf.float32)
                scalar = tf.reduce_sum(frames * weights * mask[:, :, None])
                wrt = {v.name[:-2]: v for v in net.get_params_list()}
                if not case["extern_data"]["data"].get("sparse"):
                    wrt["data"] = extern.placeholder
                feed[weights] = probe(job["case"], session.run(frames, feed).shape)
                for name, var in params.items():  # batch_norm updated its running statistics in eval
                    var.load(values[name], session)
                # an embedding's gradient comes as IndexedSlices; none for data that the output does not
                # read (a case on the targets' layers only)
                found = {n: g for n, g in zip(wrt, tf.gradients(scalar, list(wrt.values()))) if g is not None}
                values = session.run([tf.convert_to_tensor(g) for g in found.values()], feed)
                grads = {f"grad:{n}": g for n, g in zip(found, values)}
        ids = {f"{part}:{key}": value for key, pair in stream_ids(case).items()
               for part, value in zip(("ids", "ids_lengths"), pair)}
        np.savez(job["outputs"], data=data, lengths=lengths, **{f"out:{n}": o for n, o in zip(layers, outs)},
                 **grads, **ids)


def _engine_layout(out):
    """A RETURNN layer's output batch-major with its features last, as the engine has them (RETURNN's
    softmax_over_spatial puts the time axis last); one without batch axis (``WITHOUT_BATCH``) as it is."""
    if not out.have_batch_axis():
        return out
    out = out.copy_as_batch_major()
    return out.copy_with_feature_last() if out.feature_dim_axis is not None else out


# ----- the engine side -----
def run_returnn(python: str, jobs: list[dict], folder: str) -> None:
    path = os.path.join(folder, f"jobs-{len(os.listdir(folder))}.json")
    with open(path, "w") as f:
        json.dump(jobs, f)
    run_returnn_side(python, __file__, path)


def engine_model(case: dict, seed: int = 42):
    from engine.model import build_model

    streams = case["extern_data"]
    return build_model(case["network"], input_dim=streams["data"]["dim"],
                       input_sparse=bool(streams["data"].get("sparse")),
                       target_dims={k: v["dim"] for k, v in streams.items() if k != "data"}, random_seed=seed)


def _streams(lengths: np.ndarray, streams: dict | None) -> dict:
    """What RETURNN's side feeds besides the data: the lengths of ``classes`` (the data's), and the
    streams of class ids (``stream_ids``: name -> (ids, lengths))."""
    streams = streams or {}
    return {"stream_lengths": {"classes": lengths, **{k: v[1] for k, v in streams.items()}},
            "streams": {k: v[0] for k, v in streams.items()}}


def engine_outputs(model, data: np.ndarray, lengths: np.ndarray,
                   streams: dict | None = None) -> dict[str, np.ndarray]:
    """Every layer's output and its lengths (``<layer>:lengths``: a conv with a stride changes them)."""
    result = model(data, lengths, **_streams(lengths, streams))
    return {key: result[key].numpy() for name in model.layers for key in (name, f"{name}:lengths")}


def engine_gradients(model, name: str, data: np.ndarray, lengths: np.ndarray,
                     streams: dict | None = None) -> dict[str, np.ndarray]:
    """The gradients RETURNN's side writes (``grad:<RETURNN's parameter name>``, ``grad:data`` for dense
    input), from the engine's model; an LSTM's gradient is split and ordered as RETURNN's parameters are."""
    import tensorflow as tf
    from engine.training.checkpoints.returnn_format import ReturnnView

    x = tf.constant(data)
    with tf.GradientTape() as tape:
        if x.dtype.is_floating:
            tape.watch(x)
        tape.watch([v for v in model.named_variables().values() if not v.trainable])  # batch_norm's stats
        result = model(x, lengths, **_streams(lengths, streams))
        layer = CASES[name].get("gradient_of", "output") if name in CASES else "output"
        output = result[layer]  # over its own valid frames (a stride changes them), as RETURNN's side
        mask = tf.sequence_mask(result[f"{layer}:lengths"], tf.shape(output)[1], dtype=tf.float32)
        scalar = tf.reduce_sum(output * probe(name, tuple(output.shape)) * mask[:, :, None])
    variables = model.named_variables()
    found = tape.gradient(scalar, {"data": x, **variables} if x.dtype.is_floating else variables)
    data_grad = found.pop("data", None)
    grads = {"grad:data": data_grad.numpy()} if data_grad is not None else {}
    for mapping in ReturnnView(model).mappings:
        if any(found[f"{mapping.layer}/{key}"] is None for key in model.layers[mapping.layer].params):
            continue  # off the path of the compared output: RETURNN's side has no gradient either
        engine_grads = {key: found[f"{mapping.layer}/{key}"].numpy()
                        for key in model.layers[mapping.layer].params}
        grads.update({f"grad:{n}": g for n, g in mapping.to_returnn(engine_grads).items()})
    return grads


def gradient_differences(expected: dict, got: dict) -> dict[str, float]:
    """Per gradient: the largest |difference|, relative to the largest |value| of RETURNN's (at least 1).
    ``grad:data`` over the valid frames: RETURNN's conv reads the zeros of the padding, and so passes them
    a gradient, where the engine sets the padding to zero before any layer reads it."""
    names = sorted(k for k in expected.files if k.startswith("grad:"))
    if sorted(got) != names:
        raise SystemExit(f"gradients: RETURNN wrote {names}, the engine has {sorted(got)}")
    valid = np.arange(expected["data"].shape[1])[None, :] < expected["lengths"][:, None]
    result = {}
    for n in names:
        want, have = (expected[n][valid], got[n][valid]) if n == "grad:data" else (expected[n], got[n])
        result[n] = float(np.abs(want - have).max(initial=0.0) / max(1.0, np.abs(want).max(initial=0.0)))
    return result


def _sources(opts: dict) -> list[str]:
    sources = opts.get("from", [])
    return [sources] if isinstance(sources, str) else list(sources)


def compared_parts(case: dict, layer: str, value: np.ndarray, lengths: np.ndarray,
                   returnns: bool = False) -> list[np.ndarray]:
    """What of a layer's output (batch-major) is compared: each sequence's valid frames (the padding
    differs by design), or all of an output without batch axis (``WITHOUT_BATCH``). RETURNN's values per
    sequence (a reduce over time without keep_dims (B, F), a length or a compare of it (B,), a pooled
    vector, a squeezed label: ``returnns``) are the engine's one frame."""
    from engine.model.spec import parse_network
    from engine.model.spec_readers import sequence_kinds

    opts = case["network"].get(layer, {"class": "(a rec unit's layer)"})  # "<rec>/<layer>": its steps
    if opts["class"] in WITHOUT_BATCH:
        return [value]
    if returnns and sequence_kinds(parse_network(case["network"])).get(layer) in ("vector", "label"):
        value = value[:, None]
    if opts["class"] in ("length", "compare") and value.ndim == 1:  # RETURNN's (B,): one frame here
        value = value[:, None]
    if opts["class"] == "length" and value.ndim == 3:  # the engine's (B, 1, 1)
        value = value[..., 0]
    return [value[b, :n] for b, n in enumerate(lengths)]


def layer_lengths(got: dict, layer: str, lengths: np.ndarray) -> np.ndarray:
    """A layer's own lengths as the engine computed them, else the input's."""
    return got.get(f"{layer}:lengths", lengths)


def max_differences(case: dict, expected: dict, got: dict, lengths: np.ndarray) -> dict[str, float]:
    """Per layer: the largest |difference| over the compared parts (``compared_parts``)."""
    result = {}
    for name in (n for n in got if not n.endswith(":lengths")):
        own = layer_lengths(got, name, lengths)
        result[name] = max(float(np.abs(want - have).max(initial=0.0)) for want, have in
                           zip(compared_parts(case, name, expected[f"out:{name}"], own, returnns=True),
                               compared_parts(case, name, got[name], own)))
    return result


def import_side(name: str, case: dict, checkpoint: str) -> tuple[dict, dict]:
    """The engine's outputs and gradients from RETURNN's checkpoint."""
    from engine.config.loader import Config
    from engine.training.checkpoints.initial_params import load_for_inference

    model = engine_model(case)
    load_for_inference(Config({"load": checkpoint}), model, checkpoint)
    return (engine_outputs(model, *inputs(case), stream_ids(case)),
            engine_gradients(model, name, *inputs(case), stream_ids(case)))


def export_side(name: str, case: dict, folder: str) -> tuple[str, dict[str, np.ndarray]]:
    """The engine's model with random values, saved and exported; returns (RETURNN prefix, outputs)."""
    from engine.tools.export_returnn_checkpoint import export
    from engine.training.checkpoints.file_format import save_checkpoint

    model = engine_model(case)
    variables = model.named_variables()
    for key, value in random_values({k: tuple(v.shape) for k, v in variables.items()}, seed=7).items():
        variables[key].assign(value)
    engine_file = os.path.join(folder, f"engine-{name}.001")
    save_checkpoint(engine_file, variables, [], epoch=1, global_step=11)
    config = os.path.join(folder, f"engine-{name}.config.json")
    with open(config, "w") as f:
        json.dump({"network": case["network"], "extern_data": case["extern_data"]}, f)
    prefix = os.path.join(folder, f"exported-{name}")
    export(config, engine_file, prefix)
    return prefix, engine_outputs(model, *inputs(case), stream_ids(case))


def compare(python: str, names: list[str], tmp: str) -> int:
    """RETURNN's checkpoints into the engine and the engine's exports into RETURNN, a row per case; writes
    the fixtures' files of the "in" side and their ``cases.json`` into ``tmp``. Returns the exit status."""
    jobs = [{"case": n, "mode": "make", "seed": case_seed(n), "checkpoint": os.path.join(tmp, n),
             "outputs": os.path.join(tmp, f"{n}.npz")} for n in names]
    run_returnn(python, jobs, tmp)
    exported = {n: export_side(n, CASES[n], tmp) for n in names}
    run_returnn(python, [{"case": n, "mode": "load", "checkpoint": exported[n][0],
                          "outputs": os.path.join(tmp, f"{n}.out.npz")} for n in names], tmp)
    with open(os.path.join(tmp, "cases.json"), "w") as f:
        json.dump({"made_by": "benchmarks/returnn_checkpoints.py --update-fixtures",
                   **returnn_versions(python), "cases": {n: CASES[n] for n in names}}, f, indent=1)
    print(f"RETURNN: {python} {returnn_versions(python)}; max |RETURNN - engine| over the valid frames")
    print(f"{'case':<22} {'in (RETURNN -> engine)':>24} {'out (engine -> RETURNN)':>24}  worst layer")
    worst, missed = 0.0, []
    for name in names:
        case = CASES[name]
        lengths = inputs(case)[1]
        expected = np.load(os.path.join(tmp, f"{name}.npz"))
        outputs, grads = import_side(name, case, os.path.join(tmp, name))
        got_in = max_differences(case, expected, outputs, lengths)
        if name in GRADIENTS_NOT_COMPARED:
            print(f"{name}: gradients not compared: {GRADIENTS_NOT_COMPARED[name]}")
        else:
            got_in.update(gradient_differences(expected, grads))
        got_out = max_differences(case, np.load(os.path.join(tmp, f"{name}.out.npz")), exported[name][1],
                                  lengths)
        layer = max({**got_in, **got_out}, key=lambda k: max(got_in.get(k, 0.0), got_out.get(k, 0.0)))
        ok, largest = within_tolerance([*got_in.values(), *got_out.values()], TOLERANCE)
        worst = float(np.max([worst, largest]))  # a NaN stays
        missed += [] if ok else [name]
        print(f"{name:<22} {max(got_in.values()):>24.2e} {max(got_out.values()):>24.2e}  {layer}  "
              f"{'PASS' if ok else 'MISS'}")
    line, status = summary(names, missed, f"largest difference {worst:.2e}, at most {TOLERANCE:g}")
    print(line)
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated names of CASES")
    parser.add_argument("--update-fixtures", action="store_true",
                        help=f"replace the test fixtures in {FIXTURES} with RETURNN's side of this run when "
                             "every case passed")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)  # the RETURNN process
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    python = returnn_python()
    if python is None:
        return no_returnn("returnn_checkpoints", "nothing is compared")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the engine imports TensorFlow
    from engine.runtime import log

    log.init(verbosity=log.WARNING)  # the table, not the engine's load lines
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        status = compare(python, names, tmp)
        if args.update_fixtures:
            files = [n + suffix for n in names for suffix in (".index", ".data-00000-of-00001", ".npz")]
            print(update_fixtures(status, tmp, files, FIXTURES))
    return status


if __name__ == "__main__":
    sys.exit(main())
