#!/usr/bin/env python3
"""RETURNN's pretraining against the engine's: the schedule and the parameters carried into a new network.

    .venv/bin/python benchmarks/returnn_pretrain_schedule.py [--cases custom_grow,...]

A dev script: RETURNN runs in a Python of its own (``returnn_side.py``: ``$RETURNN_PYTHON`` or
``/tmp/returnn-venv/bin/python``; exit code 2 when there is none).

- schedule cases (``SCHEDULES``): config files in the style of RETURNN's published setups (a function that
  grows a BLSTM stack and sets ``#config``/``#copy_param_mode``/``#repetition``, ``from_output`` with
  repetitions, a list and a dict of repetitions, ``from_input``, ``WrapEpochValue``, the ``pretrain_*``
  keys). Both load the same file; RETURNN's ``pretrain_from_config`` and the engine's give, for epochs
  1..N+2, the network dict (``#`` entries included), the copy_param_mode it is built with, plus N,
  the repetitions and copy_output_layer. PASS when all are equal.
- copy cases (``COPIES``): an old and a new network (a BLSTM growing in width and depth, a linear on
  concatenated sources, self-attention); random old values and random initial values of the new network
  (by RETURNN's parameter names) go to both; RETURNN builds both networks and carries the values as its
  ``init_new_network`` does (``set_params_by_serialized`` with the mode, output layers left out without
  copy_output_layer), the engine with ``pretrain_switch.carry_parameters``. PASS when every parameter is
  equal (a copy: no tolerance).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from returnn_side import no_returnn, returnn_python, run_returnn_side  # noqa: E402

_GROW = '''
def grow(idx, net_dict):
    """a BLSTM stack of 4 grows from 2 layers of half width, as RETURNN's 2019 setups do it"""
    num = idx + 2
    if num > 4:
        return None
    frac = 0.5 + 0.5 * (num - 2) / 2
    for i in range(num, 4):
        del net_dict["lstm%i_fw" % i], net_dict["lstm%i_bw" % i]
    for i in range(num):
        for d in ("fw", "bw"):
            net_dict["lstm%i_%s" % (i, d)]["n_out"] = int(net_dict["lstm%i_%s" % (i, d)]["n_out"] * frac)
    net_dict["output"]["from"] = ["lstm%i_fw" % (num - 1), "lstm%i_bw" % (num - 1)]
    net_dict["#config"] = {"batch_size": 500 + 100 * idx, "learning_rate": 0.001 * (idx + 1)}
    if idx == 1:
        net_dict["#copy_param_mode"] = "ifpossible"
        net_dict["#repetition"] = 1
    return net_dict
'''


def _blstm(n: int, layers: int = 4) -> str:
    lines = []
    for i in range(layers):
        src = '["data"]' if i == 0 else f'["lstm{i - 1}_fw", "lstm{i - 1}_bw"]'
        for d, direction in (("fw", 1), ("bw", -1)):
            lines.append(f'    "lstm{i}_{d}": {{"class": "rec", "unit": "nativelstm2", "n_out": {n}, '
                         f'"direction": {direction}, "from": {src}}},')
    return "\n".join(lines)


_HEAD = "#!rnn.py\nfrom returnn.pretrain import WrapEpochValue\nbatch_size = 1000\nlearning_rate = 0.01\n"
_STACK = '''
network = {
    "l0": {"class": "linear", "activation": "relu", "n_out": 8, "from": ["data"]},
    "l1": {"class": "linear", "activation": "relu", "n_out": 8, "from": ["l0"]},
    "l2": {"class": "linear", "activation": "relu", "n_out": 8, "from": ["l1"],
           "dropout": WrapEpochValue(lambda epoch: 0.05 * epoch)},
    "l3": {"class": "linear", "activation": "relu", "n_out": 8, "from": ["l2"]},
    "output": {"class": "softmax", "loss": "ce", "from": ["l3"]},
}
'''
SCHEDULES = {
    "custom_grow": _HEAD + _GROW + "use_learning_rate_control_always = True\nnetwork = {\n" + _blstm(8) + '''
    "output": {"class": "softmax", "loss": "ce", "from": ["lstm3_fw", "lstm3_bw"]},
}
pretrain = {"repetitions": 2, "copy_param_mode": "subset", "construction_algo": grow}
''',
    "from_output_reps": _HEAD + _STACK + 'pretrain = {"repetitions": 3}\n',
    "reps_list_keys": _HEAD + _STACK + 'pretrain = "default"\npretrain_repetitions = [1, 2]\n'
                                       'pretrain_copy_output_layer = False\n',
    "reps_dict": _HEAD + _STACK + 'pretrain = {"repetitions": {"default": 2, "final": 3}, '
                                  '"copy_param_mode": "reset"}\n',
    "from_input": _HEAD + '''
network = {
    "win": {"class": "linear", "n_out": 6, "trainable": False, "from": ["data"]},
    "a": {"class": "linear", "n_out": 8, "from": ["win"]},
    "b": {"class": "linear", "n_out": 8, "from": ["a"]},
    "c": {"class": "linear", "n_out": 8, "from": ["b", "a"]},
    "output": {"class": "softmax", "loss": "ce", "from": ["c"]},
}
pretrain = {"construction_algo": "from_input", "repetitions": [2, 1]}
''',
    "no_modifications": _HEAD + _STACK + 'pretrain = {"construction_algo": "no_network_modifications", '
                                         '"repetitions": 2}\n',
}

_DATA = {"data": {"dim": 5}, "classes": {"dim": 4, "sparse": True}}


def _blstm_net(n: int, layers: int, extra: dict | None = None) -> dict:
    net = {}
    for i in range(layers):
        src = ["data"] if i == 0 else [f"lstm{i - 1}_fw", f"lstm{i - 1}_bw"]
        for d, direction in (("fw", 1), ("bw", -1)):
            net[f"lstm{i}_{d}"] = {"class": "rec", "unit": "nativelstm2", "n_out": n, "direction": direction,
                                   "from": src}
    last = [f"lstm{layers - 1}_fw", f"lstm{layers - 1}_bw"]
    net["output"] = {"class": "softmax", "loss": "ce", "from": last}
    net.update(extra or {})
    return net


def _decoder(enc_dim: int) -> dict:
    """A decoder loop over the labels attending to an encoder of ``enc_dim``: a grown encoder changes the
    shapes of the unit's LSTM kernel and readout weights."""
    return {"enc": {"class": "linear", "n_out": enc_dim, "from": ["data"]},
            "enc_value": {"class": "split_dims", "axis": "F", "dims": (1, enc_dim), "from": ["enc"]},
            "output": {"class": "rec", "from": [], "target": "classes", "unit": {
                "output": {"class": "choice", "target": "classes", "beam_size": 2, "from": ["prob"]},
                "embed": {"class": "linear", "n_out": 3, "with_bias": False, "from": ["output"]},
                "energy": {"class": "linear", "n_out": 1, "with_bias": False, "from": ["base:enc"]},
                "weights": {"class": "softmax_over_spatial", "from": ["energy"]},
                "pooled": {"class": "generic_attention", "weights": "weights", "base": "base:enc_value"},
                "flat": {"class": "merge_dims", "axes": "except_batch", "from": ["pooled"]},
                "s": {"class": "rnn_cell", "unit": "LSTMBlock", "n_out": 4, "from": ["prev:embed", "flat"]},
                "readout": {"class": "linear", "n_out": 5, "from": ["s", "flat"]},
                "prob": {"class": "softmax", "from": ["readout"], "target": "classes", "loss": "ce"}}}}


COPIES = {
    "blstm_subset": (_blstm_net(4, 2), _blstm_net(6, 3), "subset", True),
    "blstm_ifpossible": (_blstm_net(4, 2), _blstm_net(6, 3), "ifpossible", True),
    "blstm_no_output": (_blstm_net(6, 2), _blstm_net(6, 3), "subset", False),
    "concat_subset": ({"a": {"class": "linear", "n_out": 3, "from": ["data"]},
                       "b": {"class": "linear", "n_out": 4, "from": ["data"]},
                       "output": {"class": "softmax", "loss": "ce", "from": ["a", "b"]}},
                      {"a": {"class": "linear", "n_out": 5, "from": ["data"]},
                       "b": {"class": "linear", "n_out": 6, "from": ["data"]},
                       "output": {"class": "softmax", "loss": "ce", "from": ["a", "b"]}}, "subset", True),
    "attention_subset": ({"att": {"class": "self_attention", "num_heads": 2, "total_key_dim": 4, "n_out": 6,
                                  "from": ["data"]},
                          "output": {"class": "softmax", "loss": "ce", "from": ["att"]}},
                         {"att": {"class": "self_attention", "num_heads": 2, "total_key_dim": 6, "n_out": 8,
                                  "from": ["data"]},
                          "output": {"class": "softmax", "loss": "ce", "from": ["att"]}}, "subset", True),
    "decoder_subset": (_decoder(6), _decoder(8), "subset", True),
}


def _plain(value):
    """JSON for a net dict: tuples as lists, functions by name."""
    return json.loads(json.dumps(value, sort_keys=True, default=lambda v: f"<{getattr(v, '__name__', v)}>"))


def schedule_record(pretrain, copy_output_layer) -> dict:
    n = len(pretrain.nets) if hasattr(pretrain, "nets") else pretrain.get_train_num_epochs()
    get = pretrain.net_dict if hasattr(pretrain, "nets") else pretrain.get_network_json_for_epoch
    epochs = [{"net": _plain(get(e)), "copy_mode": get(e).get("#copy_param_mode", pretrain.copy_param_mode)}
              for e in range(1, n + 3)]
    return {"num_epochs": n, "repetitions": list(pretrain.repetitions),
            "copy_output_layer": bool(copy_output_layer), "epochs": epochs}


# ----- the RETURNN side -----
def returnn_side(jobs_path: str) -> None:
    import tensorflow as tf
    from returnn.config import Config
    from returnn.pretrain import pretrain_from_config
    from returnn.tf.network import TFNetwork
    from returnn.util.basic import BackendEngine

    BackendEngine.select_engine(engine=BackendEngine.TensorFlowNetDict)
    tf.compat.v1.disable_eager_execution()
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = {}
    for job in jobs:
        if job["kind"] == "schedule":
            config = Config()
            config.load_file(job["config"])
            pretrain = pretrain_from_config(config)
            results[job["name"]] = schedule_record(pretrain, pretrain.copy_output_layer)
            continue
        old_net, new_net, mode, copy_output = COPIES[job["name"]]
        values = dict(np.load(job["values"]))
        serialized = None
        for net_dict, prefix in ((old_net, "old:"), (new_net, "new:")):
            with tf.Graph().as_default(), tf.compat.v1.Session() as session:
                # a decoder loop builds its unit's parameters only where it computes losses (training)
                decoder = any(isinstance(d.get("unit"), dict) for d in net_dict.values())
                net = TFNetwork(config=Config({"extern_data": _DATA}), train_flag=decoder)
                net.construct_from_dict(net_dict)
                net.initialize_params(session)
                for var in net.get_params_list():
                    var.load(values[prefix + var.name[:-2]], session)
                if serialized is None:
                    serialized = net.get_params_serialized(session)
                    continue
                if not copy_output:  # as init_new_network does in a pretraining epoch
                    for layer in net.get_output_layers():
                        serialized.values_dict.pop(layer.name, None)
                net.set_params_by_serialized(serialized, session=session, ignore_wrong_shape=True,
                                             copy_param_mode=mode, ignore_non_existing=True)
                np.savez(job["out"], **{v.name[:-2]: v.eval(session) for v in net.get_params_list()})
    with open(jobs_path + ".out", "w") as f:
        json.dump(results, f)


# ----- the engine side -----
def engine_schedule(path: str) -> dict:
    from engine.config.loader import Config
    from engine.model.pretrain import pretrain_from_config

    config = Config()
    config.load_file(path)
    pretrain = pretrain_from_config(config)
    return schedule_record(pretrain, pretrain.copy_output_layer)


def engine_copy(name: str, folder: str) -> tuple[str, dict]:
    """Random values for both networks (written for RETURNN) and the engine's carried values."""
    from engine.model import build_model
    from engine.training.checkpoints.returnn_format import ReturnnView
    from engine.training.pretrain_switch import carry_parameters

    old_net, new_net, mode, copy_output = COPIES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    views, values = [], {}
    for net_dict, prefix in ((old_net, "old:"), (new_net, "new:")):
        model = build_model(net_dict, input_dim=5, input_sparse=False, target_dims={"classes": 4})
        view = ReturnnView(model)
        given = {n: rng.standard_normal(s).astype(np.float32) for n, s in view.shapes().items()}
        view.assign(given)
        values.update({prefix + n: v for n, v in given.items()})
        views.append(view)
    carry_parameters(views[0].model, views[1].model, mode, copy_output)
    path = os.path.join(folder, f"{name}.values.npz")
    np.savez(path, **values)
    return path, views[1].values()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(list(SCHEDULES) + list(COPIES)))
    parser.add_argument("--returnn-side")
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    python = returnn_python()
    if python is None:
        return no_returnn("returnn_pretrain_schedule", "nothing can be compared")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    names = args.cases.split(",")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        jobs, engine_side = [], {}
        for name in names:
            if name in SCHEDULES:
                path = os.path.join(tmp, f"{name}.config")
                with open(path, "w") as f:
                    f.write(SCHEDULES[name])
                jobs.append({"kind": "schedule", "name": name, "config": path})
                engine_side[name] = engine_schedule(path)
            else:
                values, carried = engine_copy(name, tmp)
                out = os.path.join(tmp, f"{name}.returnn.npz")
                jobs.append({"kind": "copy", "name": name, "values": values, "out": out})
                engine_side[name] = (out, carried)
        jobs_path = os.path.join(tmp, "jobs.json")
        with open(jobs_path, "w") as f:
            json.dump(jobs, f)
        run_returnn_side(python, __file__, jobs_path)
        with open(jobs_path + ".out") as f:
            returnn_schedules = json.load(f)
        for name in names:
            if name in SCHEDULES:
                ours, theirs = engine_side[name], returnn_schedules[name]
                ok = ours == theirs
                nets = len({json.dumps(e["net"], sort_keys=True) for e in theirs["epochs"]})
                print(f"schedule {name:18s} N={theirs['num_epochs']:2d} repetitions={theirs['repetitions']} "
                      f"distinct nets={nets} {'PASS' if ok else 'MISS'}")
                if not ok:
                    for e, (a, b) in enumerate(zip(ours["epochs"], theirs["epochs"]), 1):
                        if a != b:
                            print(f"  epoch {e}: engine {a}\n  epoch {e}: RETURNN {b}")
                    print(f"  engine {({k: v for k, v in ours.items() if k != 'epochs'})}\n"
                          f"  RETURNN {({k: v for k, v in theirs.items() if k != 'epochs'})}")
            else:
                out, carried = engine_side[name]
                expected = dict(np.load(out))
                diffs = {n: float(np.max(np.abs(expected[n] - carried[n])))
                         if expected[n].shape == carried[n].shape else float("inf") for n in expected}
                ok = set(expected) == set(carried) and max(diffs.values()) == 0.0
                print(f"copy     {name:18s} params={len(expected):2d} max |diff|={max(diffs.values()):.3g} "
                      f"{'PASS' if ok else 'MISS'}")
                if not ok:
                    print("  " + ", ".join(f"{n}: {d:.3g}" for n, d in diffs.items() if d))
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
