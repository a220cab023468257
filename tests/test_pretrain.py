"""RETURNN's pretraining: the schedule (numbers from RETURNN's ``returnn.pretrain.Pretrain`` on the same
networks; ``benchmarks/returnn_pretrain_schedule.py`` compares against RETURNN itself), the parameter copy
rule, and training through ``rnn.py`` that switches networks, resumes and runs on 2 ranks."""
from __future__ import annotations

import re

import h5py
import numpy as np
import pytest

from engine.config.loader import Config
from engine.datasets import DataKeyInfo, HDFWriter
from engine.model.pretrain import PretrainSchedule, WrapEpochValue, pretrain_from_config
from engine.runtime.errors import ConfigError
from engine.training.pretrain_copy import carried_value, copy_blocks, split_for_shape
from helpers import ROOT, run_mpi, run_rnn


def lin(src, **kw):
    return {"class": "linear", "n_out": 4, "from": src, **kw}


STACK = {"l0": lin(["data"]), "l1": lin(["l0"]), "l2": lin(["l1"]), "l3": lin(["l2"]),
         "output": {"class": "softmax", "loss": "ce", "from": ["l3"]}}


def froms(schedule: PretrainSchedule) -> list[dict]:
    """Per epoch 1..N+1: layer -> its 'from'."""
    return [{k: v.get("from") for k, v in sorted(schedule.net_dict(e).items()) if not k.startswith("#")}
            for e in range(1, schedule.num_epochs + 2)]


def test_from_output_removes_a_level_per_network_and_repeats_each():
    schedule = PretrainSchedule(STACK, repetitions=2)
    assert schedule.num_epochs == 8 and schedule.repetitions == [2, 2, 2, 2]
    chain = {"l0": ["data"], "l1": ["l0"], "l2": ["l1"], "l3": ["l2"]}
    expected = []
    for depth in (1, 1, 2, 2, 3, 3, 4, 4, 4):
        names = [f"l{i}" for i in range(depth)]
        expected.append({**{n: chain[n] for n in names}, "output": [names[-1]]})
    assert froms(schedule) == expected
    assert schedule.net_dict(100) == schedule.net_dict(8) == STACK


def test_from_input_adds_untrainable_layers_and_rewires_to_existing_sources():
    net = {"win": lin(["data"], trainable=False), "a": lin(["win"]), "b": lin(["a"]), "c": lin(["b", "a"]),
           "output": {"class": "softmax", "loss": "ce", "from": ["c"]}}
    schedule = PretrainSchedule(net, construction_algo="from_input", repetitions=[2, 1])
    small = {"a": ["win"], "output": ["a"], "win": ["data"]}
    full = {"a": ["win"], "b": ["a"], "c": ["b", "a"], "output": ["c"], "win": ["data"]}
    assert (schedule.num_epochs, schedule.repetitions) == (3, [2, 1])
    assert froms(schedule) == [small, small, full, full]


def _grow(idx, net_dict):
    if idx == 2:
        return None
    for i in range(idx + 1, 3):
        del net_dict["r%i" % i]
    net_dict["output"]["from"] = ["r%i" % idx]
    net_dict["#config"] = {"batch_size": 100 * (idx + 1)}
    if idx == 1:
        net_dict["#repetition"] = 3
        net_dict["#copy_param_mode"] = "reset"
    return net_dict


def test_custom_construction_with_config_repetition_and_copy_mode_entries():
    rec = {f"r{i}": {"class": "rec", "unit": "lstm", "n_out": 4, "from": ["data" if i == 0 else f"r{i - 1}"]}
           for i in range(3)}
    rec["output"] = {"class": "softmax", "loss": "ce", "from": ["r2"]}
    schedule = PretrainSchedule(rec, construction_algo=_grow, repetitions={"default": 2, "final": 1},
                                copy_param_mode="subset")
    assert (schedule.num_epochs, schedule.repetitions) == (6, [2, 3, 1])
    layers = [sorted(n for n in net if n.startswith("r")) for net in froms(schedule)]
    assert layers == [["r0"]] * 2 + [["r0", "r1"]] * 3 + [["r0", "r1", "r2"]] * 2
    assert [schedule.config_overrides(e) for e in range(1, 8)] == \
        [{"batch_size": 100}] * 2 + [{"batch_size": 200}] * 3 + [{}] * 2
    modes = [schedule.copy_mode(e) for e in range(1, 8)]
    assert modes == ["subset"] * 2 + ["reset"] * 3 + ["subset"] * 2
    assert "#config" not in schedule.layers(1) and "#repetition" not in schedule.net_dict(3)
    assert "r2" in rec and "#repetition" not in str(rec)  # the config's network stays as it was


def test_wrapped_values_resolve_per_epoch_and_the_last_holds_after_pretraining():
    net = dict(STACK, l1=lin(["l0"], dropout=WrapEpochValue(lambda epoch: epoch / 10)),
               l2=lin(["l1"], n_out=[WrapEpochValue(lambda epoch: epoch), 1]))
    schedule = PretrainSchedule(net, construction_algo="no_network_modifications", repetitions=3)
    assert schedule.num_epochs == 3
    nets = [schedule.net_dict(e) for e in range(1, 5)]
    values = [(net["l1"]["dropout"], net["l2"]["n_out"]) for net in nets]
    assert values == [(0.1, [1, 1]), (0.2, [2, 1]), (0.3, [3, 1]), (0.3, [3, 1])]


def test_repetitions_list_is_padded_and_copy_output_layer_follows_the_copy_mode():
    schedule = PretrainSchedule(STACK, repetitions=[1, 3], copy_param_mode="reset")
    assert (schedule.num_epochs, schedule.repetitions) == (10, [1, 3, 3, 3])
    assert schedule.copy_output_layer is False
    assert PretrainSchedule(STACK).copy_output_layer and PretrainSchedule(STACK, copy_output_layer="reset") \
        .copy_output_layer is False


def test_config_keys_default_the_options_and_import_gives_the_wrapper(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("#!rnn.py\nfrom returnn.pretrain import WrapEpochValue as W\nfrom Pretrain import "
                    "WrapEpochValue\nassert W is WrapEpochValue\nnetwork = %r\npretrain = 'default'\n"
                    "pretrain_repetitions = [2]\npretrain_copy_output_layer = False\n" % STACK)
    config = Config()
    config.load_file(str(path))
    schedule = pretrain_from_config(config)
    assert schedule.num_epochs == 8 and schedule.copy_output_layer is False
    assert pretrain_from_config(Config({"network": STACK, "pretrain": None})) is None


@pytest.mark.parametrize("values, match", [
    ({"pretrain": {"greedy": True}}, "greedy"),
    ({"pretrain": {"construction_algo": "from_middle"}}, "construction_algo must be a function"),
    ({"pretrain": {"copy_param_mode": "all"}}, "copy_param_mode must be one of"),
    ({"pretrain": {"repetitions": [1] * 9}}, "repetitions must be an int, a list of 1..4"),
    ({"pretrain": {"repeat": 2}}, r"unknown option\(s\) \['repeat'\]"),
    ({"pretrain": "yes"}, "must be True, 'default' or a dict"),
    ({"pretrain": True, "get_network": lambda epoch: STACK}, "together with 'get_network'"),
    ({"pretrain": True, "network": dict(STACK, output=dict(STACK["output"], **{"from": "l3"}))},
     "reads the 'from' of layer 'output' as a list"),
    ({"pretrain": {"construction_algo": lambda idx, net_dict: None if idx else dict(
        net_dict, **{"#config": {"chunking": "50:25"}})}}, r"'#config' sets \['chunking'\]"),
    ({"pretrain": {"construction_algo": lambda idx, net_dict: None if idx else dict(
        net_dict, **{"#config": {"max_seqs": 3}})}}, "'max_seqs', which the config does not set"),
    ({"pretrain": {"construction_algo": lambda idx, net_dict: None if idx else dict(
        net_dict, **{"#config": {"learning_rate": 0.1}})}}, "only with use_learning_rate_control_always"),
])
def test_refusals_name_the_key(values, match):
    with pytest.raises(ConfigError, match=match):
        pretrain_from_config(Config({"network": STACK, **values}))


# ----- the copy rule (RETURNN's set_param_values_by_dict with copy_param_mode) -----

def test_split_guess_matches_returnns_examples():
    # RETURNN's own examples (test_transform_param_axes_split_info_to_new_shape)
    assert split_for_shape([[7], [7] * 4], [7 * 2, 7 * 8]) == [[14], [14] * 4]
    assert split_for_shape([[3, 7], [7] * 4], [3 + 7 * 2, 7 * 8]) == [[3, 14], [14] * 4]
    assert split_for_shape([[7, 7], [7] * 4], [3 + 7 * 2, 7 * 8]) == [[3, 14], [14] * 4]
    assert split_for_shape([[6, 6], [3]], [8, 3]) == [[4, 4], [3]]


def test_subset_copies_each_blocks_overlap_and_keeps_the_rest():
    old = np.arange(2 * 8, dtype=np.float32).reshape(2, 8)  # 4 gate blocks of 2
    new = -np.ones((3, 12), np.float32)  # 4 gate blocks of 3
    got = carried_value("W", old, new, [[3], [3] * 4], "subset")
    for g in range(4):
        np.testing.assert_array_equal(got[:2, 3 * g:3 * g + 2], old[:, 2 * g:2 * g + 2])
        assert (got[2, 3 * g:3 * g + 3] == -1).all() and (got[:, 3 * g + 2] == -1).all()
    np.testing.assert_array_equal(carried_value("b", old[0], new[0], None, "subset")[:8], old[0])
    assert carried_value("W", old, new, [[3], [3] * 4], "ifpossible") is None
    np.testing.assert_array_equal(copy_blocks([[1], [8]], [[3], [12]], old[:1], new)[0, :8], old[0])
    with pytest.raises(ConfigError, match="changes rank"):
        carried_value("W", old, new[0], None, "subset")


# ----- training through rnn.py -----

CONFIG = """#!rnn.py
from returnn.pretrain import WrapEpochValue
train = {"class": "HDFDataset", "files": [%(hdf)r]}
network = {
    "lstm0_fw": {"class": "rec", "unit": "nativelstm2", "n_out": 6, "direction": 1, "from": ["data"]},
    "lstm0_bw": {"class": "rec", "unit": "nativelstm2", "n_out": 6, "direction": -1, "from": ["data"]},
    "lstm1_fw": {"class": "rec", "unit": "nativelstm2", "n_out": 6, "direction": 1,
                 "from": ["lstm0_fw", "lstm0_bw"]},
    "lstm1_bw": {"class": "rec", "unit": "nativelstm2", "n_out": 6, "direction": -1,
                 "from": ["lstm0_fw", "lstm0_bw"]},
    "output": {"class": "softmax", "loss": "ce", "from": ["lstm1_fw", "lstm1_bw"],
               "dropout": WrapEpochValue(lambda epoch: 0.0)},
}
def grow(idx, net_dict):  # 1 BLSTM layer of 4, then the full 2 layers of 6
    if idx > 0:
        return None
    del net_dict["lstm1_fw"], net_dict["lstm1_bw"]
    for name in ("lstm0_fw", "lstm0_bw"):
        net_dict[name]["n_out"] = 4
    net_dict["output"]["from"] = ["lstm0_fw", "lstm0_bw"]
    net_dict["#config"] = {"batch_size": 60}
    return net_dict
pretrain = {"repetitions": [2, 1], "copy_param_mode": "subset", "construction_algo": grow}
use_learning_rate_control_always = True
learning_rates = [0.01, 0.01, 0.0, 0.01]  # epoch 3 keeps what the switch carried over
optimizer = {"class": "adam"}
batch_size = 100
num_epochs = 4
model = %(model)r
"""


def write_config(tmp_path) -> str:
    rng = np.random.RandomState(0)
    hdf = str(tmp_path / "train.hdf")
    with HDFWriter(hdf, {"data": DataKeyInfo(dim=4), "classes": DataKeyInfo(dim=3, sparse=True)}) as writer:
        for i in range(24):
            n = 6 + i % 5
            writer.insert(f"seq-{i}", {"data": rng.standard_normal((n, 4)).astype(np.float32),
                                       "classes": rng.randint(0, 3, n).astype(np.int32)})
    path = tmp_path / "pretrain.py"
    path.write_text(CONFIG % {"hdf": hdf, "model": str(tmp_path / "net")})
    return str(path)


def params(path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        names = ("lstm0_fw/W", "lstm0_fw/b", "output/W")
        return {name: f["params"][name.replace("/", "|")][...] for name in names}


@pytest.mark.tf_latest
def test_rnn_switches_the_network_after_a_resume_and_carries_the_parameters(tmp_path):
    cfg = write_config(tmp_path)
    first = run_rnn([cfg, "++num_epochs", "2"])
    assert first.returncode == 0, first.stdout + first.stderr
    assert "train epoch 1, finished after 4 steps" in first.stdout  # '#config' batch_size 60
    r = run_rnn([cfg])  # resumes: builds epoch 2's network, loads it, switches in epoch 3
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resuming after epoch 2" in r.stdout
    assert re.findall(r"pretraining: epoch (\d+) trains a new network \(5 layers; new: lstm1_fw, lstm1_bw\); "
                      r"copy_param_mode 'subset' carried 8 parameter\(s\) over \(7 into", r.stdout) == ["3"]
    assert "train epoch 3, finished after 3 steps" in r.stdout  # the full network: batch_size 100
    old, new = params(tmp_path / "net.002"), params(tmp_path / "net.003")  # epoch 3 trained at rate 0
    assert old["lstm0_fw/W"].shape == (4 + 4, 16) and new["lstm0_fw/W"].shape == (4 + 6, 24)
    for g in range(4):  # each gate block: input rows and recurrent rows, the leading 4 of 6 columns
        np.testing.assert_array_equal(new["lstm0_fw/W"][0:8, 6 * g:6 * g + 4],
                                      old["lstm0_fw/W"][:, 4 * g:4 * g + 4])
        np.testing.assert_array_equal(new["lstm0_fw/b"][6 * g:6 * g + 4], old["lstm0_fw/b"][4 * g:4 * g + 4])
    # output's input rows: [fw 4, bw 4] -> [fw 6, bw 6], each source's rows in place (RETURNN's split guess)
    np.testing.assert_array_equal(new["output/W"][0:4], old["output/W"][0:4])
    np.testing.assert_array_equal(new["output/W"][6:10], old["output/W"][4:8])


@pytest.mark.mpi
def test_two_ranks_switch_together_with_equal_parameters(tmp_path):
    cfg = write_config(tmp_path)
    r = run_mpi(2, [str(ROOT / "rnn.py"), cfg, "++use_horovod", "1", "++log_all_ranks", "1",
                    "++num_epochs", "3"], timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    sums = re.findall(r"^(\[rank 1\] )?pretraining: epoch (\d+) starts with parameter sum (\S+)$", r.stdout,
                      re.M)
    assert len(sums) == 2 and {s[1] for s in sums} == {"3"} and sums[0][2] == sums[1][2], r.stdout
    assert (tmp_path / "net.003").exists()


def test_learning_rates_of_pretraining_epochs_as_returnn_chooses_them():
    from engine.training.pretrain_switch import PretrainRun
    from engine.training.update.lr_control import LearningRateControl

    def run(**keys):
        config = Config({"network": STACK, "learning_rate": 0.1, "learning_rates": [0.3], "pretrain": {
            "construction_algo": "no_network_modifications", "repetitions": 2}, **keys})
        control = LearningRateControl.from_config(config)
        pretrain = PretrainRun(config, pretrain_from_config(config))
        used = [pretrain.learning_rate(epoch, control) for epoch in range(1, 5)]
        return used, [control.epoch_data[epoch].learning_rate for epoch in range(1, 5)]

    # pretraining epochs: pretrain_learning_rate (the history keeps a rate it has); N + 1: learning_rate
    assert run(pretrain_learning_rate=0.05) == ([0.05, 0.05, 0.1, 0.1], [0.3, 0.05, 0.1, 0.1])
    assert run(use_learning_rate_control_always=True) == ([0.3, 0.3, 0.3, 0.3], [0.3] * 4)
