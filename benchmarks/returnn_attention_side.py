"""The helpers of ``bench_returnn_attention.py``: the reduced network, its batch, and RETURNN's half.

``reduced``, ``deterministic`` and ``make_batch`` are plain functions of dicts and numpy; ``returnn_side``
runs under RETURNN's Python (``returnn_side.py`` says which), so this module imports neither the engine
nor RETURNN at its top.
"""
from __future__ import annotations

import ast
import copy
import json
import sys

import numpy as np

# the layer outputs compared where RETURNN can hand them out, unless a job names its own ("layers") (layers
# of the decoder loop only when moved out of it: RETURNN keeps the others inside its while loop)
LAYERS = ("encoder", "enc_ctx", "output/s", "output/att", "output/readout", "output/output_prob",
          "output/att_weights")
# RETURNN's builds whose loop lists are recorded: (name, train_flag (None: RETURNN's train-flag tensor, as
# its train task builds the network for training and dev scores), search_flag)
PLAN_BUILDS = (("train flag tensor", None, False), ("train", True, False), ("eval", False, False),
               ("search", False, True))
PLAN_KEYS = ("Input layers moved out of loop", "Output layers moved out of loop", "Layers in loop")
# RETURNN's attribute of the rec layer's subnetwork cell per list, and the engine's attribute of its plan
RETURNN_PLAN = dict(zip(PLAN_KEYS, ("input_layers_moved_out", "output_layers_moved_out", "layers_in_loop")))
ENGINE_PLAN = dict(zip(PLAN_KEYS, ("inputs_moved_out", "outputs_moved_out", "in_loop")))


def scaled(value: int, scale: float) -> int:
    """``value`` times ``scale``, rounded to an even number of at least 2; 1 (a head count) stays 1.
    Even, so that a ``reduce_out`` of 2 pieces still divides it and a bidirectional pair of LSTMs of the
    scaled dim concatenates to the scaled dim of their sum."""
    if value <= 1:
        return value
    return max(2, 2 * int(round(value * scale / 2)))


def reduced(network: dict, scale: float) -> dict:
    """A deep copy of ``network`` with every layer's ``n_out`` and every ``split_dims`` layer's ``dims``
    scaled by ``scale`` (``scaled``), subnetworks (``unit``, ``subnetwork`` dicts) included; all else,
    strings such as ``max_seq_len`` too, as written."""
    result = copy.deepcopy(network)
    for layer in _layer_dicts(result):
        if isinstance(layer.get("n_out"), int) and not isinstance(layer["n_out"], bool):
            layer["n_out"] = scaled(layer["n_out"], scale)
        if layer.get("class") == "split_dims" and isinstance(layer.get("dims"), (list, tuple)):
            layer["dims"] = type(layer["dims"])(d if d < 1 else scaled(d, scale) for d in layer["dims"])
    return result


def deterministic(network: dict) -> dict:
    """A deep copy of ``network`` without random draws: every ``dropout`` 0 (subnetworks included)."""
    result = copy.deepcopy(network)
    for layer in _layer_dicts(result):
        for key in ("dropout", "attention_dropout"):
            if key in layer:
                layer[key] = 0.0
    return result


def _layer_dicts(network: dict):
    for name, layer in network.items():
        if isinstance(layer, dict) and not str(name).startswith("#"):
            yield layer
            for key in ("unit", "subnetwork"):
                if isinstance(layer.get(key), dict):
                    yield from _layer_dicts(layer[key])


def label_lengths(seqs: int, frames: int, reduction: int = 6) -> np.ndarray:
    """Different label counts per sequence (5, 6, 4, ... for 36 frames), each at most the encoder's frames
    (``frames // reduction``), which CTC needs of labels without repeats, and at least 2 (a label and EOS)."""
    most = frames // reduction
    return np.array([max(2, min(most, most - (1, 0, 2)[i % 3])) for i in range(seqs)], np.int32)


def make_batch(seqs: int, frames: int, dim: int, classes: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Random features (seqs, frames, dim) of equal lengths and label sequences of ids in 1..classes-1
    without two equal neighbours, each ending in EOS 0 (as the BPE vocabulary's ``seq_postfix [0]``),
    padded with 0."""
    rng = np.random.RandomState(seed)
    lengths = label_lengths(seqs, frames)
    labels = np.zeros((seqs, lengths.max()), np.int32)
    for i, length in enumerate(lengths):
        for t in range(length - 1):
            label = rng.randint(1, classes)
            while t and label == labels[i, t - 1]:
                label = rng.randint(1, classes)
            labels[i, t] = label
    return {"data": rng.standard_normal((seqs, frames, dim)).astype(np.float32),
            "lengths": np.full(seqs, frames, np.int32), "classes": labels, "label_lengths": lengths}


def returnn_side(jobs_path: str) -> None:
    """Under RETURNN's Python: the job's network built, initialised, scored, updated and scored again."""
    import tensorflow as tf
    from returnn.config import Config
    from returnn.tf.network import TFNetwork
    from returnn.tf.updater import Updater
    from returnn.tf.util.basic import get_global_train_flag_placeholder
    from returnn.util.basic import BackendEngine

    BackendEngine.select_engine(engine=BackendEngine.TensorFlowNetDict)
    sys.setrecursionlimit(10_000)
    tf.compat.v1.disable_eager_execution()
    with open(jobs_path) as f:
        job = json.load(f)
    batch = np.load(job["batch"])
    results: dict = {}

    def config(network: dict, **keys) -> Config:
        return Config({"extern_data": job["extern_data"], "network": network, "target": "classes", **keys})

    def feed(net) -> dict:
        data, classes = net.extern_data.data["data"], net.extern_data.data["classes"]
        return {data.placeholder: batch["data"], data.get_sequence_lengths(): batch["lengths"],
                classes.placeholder: batch["classes"], classes.get_sequence_lengths(): batch["label_lengths"],
                **({net.train_flag: False} if isinstance(net.train_flag, tf.Tensor) else {})}

    def plan(net) -> dict[str, list[str]]:
        cell = net.layers["output"].cell
        return {key: list(getattr(cell, attribute)) for key, attribute in RETURNN_PLAN.items()}

    def build(network: dict, train: bool | None, search: bool = False, **keys):
        """``train`` None: RETURNN's train flag as its train task makes it, a tensor fed at each run (True
        in training steps, False when scoring the dev set), with which it computes its dev scores."""
        flag = get_global_train_flag_placeholder() if train is None else train
        net = TFNetwork(config=config(network, **keys), train_flag=flag, eval_flag=not search,
                        search_flag=search)
        net.construct_from_dict(network)
        return net

    def scores(network: dict, load: str | None) -> tuple[dict, dict]:
        """Each loss layer's loss, error and count (1 / RETURNN's norm factor) and the total loss in eval,
        with the parameters of ``load`` or else RETURNN's initialisation (saved as the checkpoint); and
        the compared layers' outputs, batch-major, with their lengths."""
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            tf.compat.v1.set_random_seed(job["seed"])
            net = build(network, train=None)
            if load:
                net.load_params_from_file(load, session)
            else:
                net.initialize_params(session)
                net.save_params_to_file(job["checkpoint"], session)
                results["plan, train flag tensor"] = plan(net)
            fetches = {"total loss": net.get_total_loss()}
            for name, holder in net.losses_dict.items():
                for what, value in (("loss", holder.get_loss_value()), ("error", holder.get_error_value()),
                                    ("norm factor", holder.get_norm_factor())):
                    if value is not None:
                        fetches[f"{name} {what}"] = value
            fetches = {k: v if isinstance(v, tf.Tensor) else tf.constant(float(v))
                       for k, v in fetches.items()}
            layers = {}
            for name in job.get("layers", LAYERS):
                try:
                    layer = net.get_layer(name)
                except Exception as exc:  # noqa: BLE001 - a layer RETURNN keeps inside its loop
                    why = "RETURNN keeps it inside its loop" if "Cannot get layer" in str(exc) else str(exc)
                    results.setdefault("not compared", {})[name] = why.split("\n")[0][:100]
                    continue
                output = layer.output.copy_as_batch_major()
                layers[name] = output.placeholder
                layers[f"{name}:lengths"] = output.get_sequence_lengths()
            values, outputs = session.run([fetches, layers], feed(net))
        numbers = {}
        for key, value in values.items():
            if key.endswith(" norm factor"):
                # a whole number, which RETURNN holds as its float32 reciprocal
                numbers[key[:-len("norm factor")] + "count"] = round(1.0 / float(value), 3) if value else 0.0
            else:
                numbers[key] = float(value)
        return numbers, outputs

    def update(network: dict) -> None:
        """One update of RETURNN's train step from the checkpoint, saved as ``job["after"]``."""
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            keys = job["updater"]
            net = build(network, train=True, **keys)
            updater = Updater(config=config(network, **keys), network=net,
                              initial_learning_rate=job["learning_rate"])
            updater.set_trainable_vars(net.get_trainable_params())
            optim_op = updater.get_optim_op()
            net.initialize_params(session)
            net.load_params_from_file(job["checkpoint"], session)
            updater.init_optimizer_vars(session)
            updater.set_learning_rate(job["learning_rate"], session)
            # the gradients, for the benchmark to tell update differences of rounding noise (Adam's first
            # step is about lr * sign(gradient), whatever the gradient's size) from others
            params = [(v, g) for v, g in zip(net.get_trainable_params(),
                                             tf.gradients(net.get_objective(), net.get_trainable_params()))
                      if g is not None]
            gradients = session.run([tf.convert_to_tensor(g) for _, g in params], feed(net))  # dense
            np.savez(job["gradients"], **{v.op.name: g for (v, _), g in zip(params, gradients)})
            session.run([optim_op, net.get_post_control_dependencies()], feed(net))
            net.save_params_to_file(job["after"], session)

    def plan_of(network: dict, train: bool, search: bool) -> dict[str, list[str]]:
        with tf.Graph().as_default():
            return plan(build(network, train=train, search=search))

    network = ast.literal_eval(job["network"])  # its tuples as tuples (RETURNN compares shapes to them)
    numbers, outputs = scores(network, None)
    results["numbers"] = numbers
    np.savez(job["outputs"], **outputs)
    results["outputs"] = {k: list(v.shape) for k, v in outputs.items() if not k.endswith(":lengths")}
    for build_name, train, search in PLAN_BUILDS[1:]:
        results[f"plan, {build_name}"] = plan_of(network, train=train, search=search)
    if job["after"]:
        update(deterministic(network))
        after, _ = scores(deterministic(network), job["after"])
        results["numbers after the update"] = after
    with open(job["results"], "w") as f:
        json.dump(results, f)
