"""TensorFlow's thread pools per rank: the cores a rank is granted, who decides the counts, and that a real
run (1 and 2 ranks) uses what it logs."""
import os
import re
import sys

import pytest

from engine.config.loader import Config
from engine.runtime.errors import ConfigError
from engine.runtime.tf_threads import (CoreGrant, automatic_threads, choose_threads, cores_for_rank,
                                       loops_over_time)
from helpers import ROOT, mpirun_cmd, run, run_rnn

pytestmark = pytest.mark.tf_latest

TWO = frozenset({0, 1})


# ----- the cores of a rank -----

def test_affinity_shared_by_the_ranks_of_a_host_is_divided():
    grant = cores_for_rank([frozenset(range(8))] * 4, 2, {}, "node1")
    assert grant.cores == 2 and "shared by 4 ranks" in grant.why


def test_affinity_bound_per_rank_is_used_as_it_is():
    sets = [frozenset({0, 1, 2}), frozenset({3, 4, 5}), frozenset({6, 7, 8})]
    assert cores_for_rank(sets, 1, {}, "node1") == CoreGrant(3, "CPU affinity of this rank: 3 cores")


def test_a_single_rank_gets_its_affinity():
    assert cores_for_rank([frozenset(range(6))], 0, {}, "h").cores == 6


def test_slurm_cpus_per_task_is_per_rank():
    grant = cores_for_rank([frozenset(range(64))] * 2, 0, {"SLURM_CPUS_PER_TASK": "4"}, "h")
    assert grant == CoreGrant(4, "SLURM_CPUS_PER_TASK=4")


def test_sge_slots_of_this_host_are_shared_by_its_ranks(tmp_path):
    hostfile = tmp_path / "pe"
    hostfile.write_text("node1.example.org 6 all.q@node1 UNDEFINED\n"
                        "node2.example.org 4 all.q@node2 UNDEFINED\n")
    env = {"PE_HOSTFILE": str(hostfile), "NSLOTS": "10"}
    grant = cores_for_rank([frozenset(range(32))] * 2, 1, env, "node2")
    assert grant.cores == 2 and "PE_HOSTFILE (node2.example.org): 4 slots for 2 rank(s)" in grant.why
    assert cores_for_rank([frozenset(range(32))] * 2, 1, {"NSLOTS": "10"}, "node2").cores == 5


def test_the_smallest_grant_wins_and_never_below_one_core():
    assert cores_for_rank([frozenset({0})] * 3, 0, {"SLURM_CPUS_PER_TASK": "8"}, "h").cores == 1


# ----- who decides -----

def test_automatic_rule():
    assert automatic_threads(1) == (1, 1) and automatic_threads(2) == (1, 2)
    assert automatic_threads(3) == (2, 2) and automatic_threads(16) == (15, 2)


@pytest.mark.parametrize("task", ["forward", "eval"])
def test_inference_takes_every_core_for_one_op(task):
    assert automatic_threads(1, task) == (1, 1) and automatic_threads(2, task) == (2, 1)
    assert automatic_threads(16, task) == (16, 1)
    choice = choose_threads(Config({"task": task}), CoreGrant(2, "test"), {})
    assert (choice.intra, choice.inter) == (2, 1) and f"task '{task}'" in choice.why
    assert (choose_threads(Config({"task": "train"}), CoreGrant(2, "test"), {}).intra,
            choose_threads(Config({}), CoreGrant(2, "test"), {}).inter) == (1, 2)


def test_training_without_a_time_loop_takes_every_core_for_one_op():
    feed_forward = {"enc": {"class": "self_attention", "from": "data", "n_out": 8, "num_heads": 2,
                            "total_key_dim": 8},
                    "sub": {"class": "subnetwork", "from": "enc",
                            "subnetwork": {"output": {"class": "copy"}}},
                    "output": {"class": "softmax", "from": "sub", "loss": "ce"}}
    lstm = dict(feed_forward, enc={"class": "rec", "unit": "nativelstm2", "from": "data", "n_out": 8})
    unit = dict(feed_forward, sub={"class": "subnetwork", "from": "enc", "subnetwork": {
        "output": {"class": "rnn_cell", "unit": "LSTMBlock", "from": "data", "n_out": 8}}})
    assert loops_over_time(lstm) and loops_over_time(unit) and loops_over_time(None)
    assert not loops_over_time(feed_forward)
    assert [automatic_threads(n, "train", time_loop=False) for n in (1, 2, 16)] == [(1, 1), (2, 2), (16, 2)]
    choice = choose_threads(Config({"network": feed_forward}), CoreGrant(2, "test"), {})
    assert (choice.intra, choice.inter) == (2, 2) and "without a time loop" in choice.why
    for network in (lstm, unit):  # and search keeps the training rule of loops
        assert choose_threads(Config({"network": network}), CoreGrant(2, "test"), {}).intra == 1
    search = Config({"network": feed_forward, "task": "search"})
    assert choose_threads(search, CoreGrant(2, "test"), {}).intra == 1


def test_search_takes_the_training_rule():
    assert [automatic_threads(n, "search") for n in (1, 2, 16)] == [automatic_threads(n) for n in (1, 2, 16)]
    choice = choose_threads(Config({"task": "search"}), CoreGrant(2, "test"), {})
    assert (choice.intra, choice.inter) == (1, 2) and "task 'search': 1 intra-op thread" in choice.why


def test_environment_over_config_over_automatic():
    grant = CoreGrant(16, "test")
    config = Config({"intra_op_threads": 4, "tf_session_opts": {"inter_op_parallelism_threads": 3}})
    choice = choose_threads(config, grant, {})
    assert (choice.intra, choice.inter) == (4, 3)
    choice = choose_threads(config, grant, {"TF_NUM_INTRAOP_THREADS": "1"})
    assert (choice.intra, choice.inter) == (1, 3) and "TF_NUM_INTRAOP_THREADS" in choice.why
    choice = choose_threads(Config({}), grant, {"TF_NUM_INTEROP_THREADS": "0"})
    assert (choice.intra, choice.inter) == (15, 0) and "automatic for 16 core(s)" in choice.why


def test_config_overrides_as_strings_are_read():
    config = Config({})
    config.apply_overrides([("intra_op_threads", "2")])
    assert choose_threads(config, CoreGrant(8, "t"), {}).intra == 2


@pytest.mark.parametrize("config, environ, words", [
    ({"intra_op_threads": 2, "tf_session_opts": {"intra_op_parallelism_threads": 3}}, {}, "different thread"),
    ({"tf_session_opts": {"intra_op_paralellism_threads": 3}}, {}, "'intra_op_paralellism_threads'"),
    ({"inter_op_threads": -1}, {}, "expected a thread count"),
    ({"tf_session_opts": {"inter_op_parallelism_threads": "many"}}, {}, "expected a thread count"),
    ({}, {"TF_NUM_INTRAOP_THREADS": "two"}, "TF_NUM_INTRAOP_THREADS='two'"),
])
def test_bad_settings_are_refused_with_their_name(config, environ, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        choose_threads(Config(config), CoreGrant(2, "t"), environ)


def test_session_options_without_effect_are_accepted():
    options = {"gpu_options": {"allow_growth": True}, "log_device_placement": False}
    config = Config({"tf_session_opts": options})
    assert choose_threads(config, CoreGrant(2, "t"), {}).intra == 1


# ----- real runs -----

TINY = """
train = {"class": "DummyDataset", "input_dim": 3, "output_dim": 2, "num_seqs": 4, "seq_len": 5}
network = {"output": {"class": "softmax", "loss": "ce"}}
batch_size = 10
num_epochs = 1
log_all_ranks = True
"""
UNSET = {"TF_NUM_INTRAOP_THREADS": "", "TF_NUM_INTEROP_THREADS": ""}


def test_a_run_sets_tensorflow_pools_from_the_config(tmp_path):
    """get_network runs once the model is built: what TensorFlow itself reports then."""
    config = tmp_path / "c.py"
    config.write_text(TINY.replace("network =", "layers =") + """
intra_op_threads = 2
tf_session_opts = {"inter_op_parallelism_threads": 3}

def get_network(epoch, **_):
    import tensorflow as tf
    print("pools", tf.config.threading.get_intra_op_parallelism_threads(),
          tf.config.threading.get_inter_op_parallelism_threads())
    return layers
""")
    r = run_rnn([str(config)], env=UNSET)
    assert r.returncode == 0, r.stderr
    assert "threads: 2 intra-op, 3 inter-op" in r.stdout
    assert "pools 2 3" in r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("binding, words, cores", [
    ("none", "CPU affinity of {n} cores shared by 2 ranks on this host", lambda n: max(1, n // 2)),
    ("core", "CPU affinity of this rank: 1 cores", lambda n: 1),
])
def test_two_ranks_on_one_host_share_or_own_their_cores(tmp_path, binding, words, cores):
    """The counts follow the automatic rule for the cores each rank was granted, on any machine size."""
    config = tmp_path / "c.py"
    config.write_text(TINY)
    cmd = mpirun_cmd(2, [sys.executable, str(ROOT / "rnn.py"), str(config), "++use_horovod", "1",
                         "++distributed_backend", "mpi"])
    cmd[cmd.index("--bind-to") + 1] = binding
    r = run(cmd, env=UNSET)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if "threads:" in line]
    assert len(lines) == 2, r.stdout
    n = len(os.sched_getaffinity(0))
    intra, inter = automatic_threads(cores(n))
    words = words.format(n=n)
    assert all(words in line and f"{intra} intra-op, {inter} inter-op" in line for line in lines), lines


def test_a_run_with_device_count_gpu_0_trains_on_the_cpu_and_says_so(tmp_path):
    config = tmp_path / "c.py"
    config.write_text(TINY + """
tf_session_opts = {"device_count": {"GPU": 0}, "log_device_placement": False}

def get_network(epoch, **_):
    import tensorflow as tf
    print("visible GPUs", len(tf.config.get_visible_devices("GPU")))
    return layers
""".replace("def get_network", "layers = network\ndel network\n\ndef get_network"))
    r = run_rnn([str(config)])
    assert r.returncode == 0, r.stderr
    assert "tf_session_opts['device_count'] = {'GPU': 0}: the GPUs are hidden, this rank computes on the " \
           "CPU" in r.stdout, r.stdout
    assert "tf_session_opts: log_device_placement have no effect here" in r.stdout, r.stdout
    assert "visible GPUs 0" in r.stdout
