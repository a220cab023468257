"""RETURNN's ``store_tf_profile``: a real training run writes TensorFlow's profile of each epoch, and
``tools/profile_ops.py`` sums it by op type, by layer and side by side; ``tf_log_dir`` alone is refused."""
from __future__ import annotations

import glob
import os

from helpers import ROOT, run, run_rnn

CONFIG = """
train = {"class": "DummyDataset", "input_dim": 4, "output_dim": 3, "num_seqs": 20, "seq_len": 12,
         "fixed_random_seed": 1}
network = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 8},
           "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}
batch_size = 120
num_epochs = 2
device = "cpu"  # the tool reads the CPU kernels; a GPU machine would put them on its device plane
model = %(model)r
"""
TOOL = str(ROOT / "tools" / "profile_ops.py")


def write_config(tmp_path, extra: str) -> str:
    path = tmp_path / "run.py"
    path.write_text(CONFIG % {"model": str(tmp_path / "net")} + extra)
    return str(path)


def test_each_epoch_is_profiled_and_the_tool_reads_it(tmp_path):
    profiles = str(tmp_path / "prof")
    r = run_rnn([write_config(tmp_path, f"store_tf_profile = True\ntf_log_dir = {profiles!r}\n")])
    assert r.returncode == 0, r.stdout + r.stderr
    epochs = sorted(glob.glob(str(tmp_path / "prof" / "train-ep00*")))
    assert [os.path.basename(p)[:11] for p in epochs] == ["train-ep001", "train-ep002"]
    assert all(glob.glob(os.path.join(p, "plugins", "profile", "*", "*.xplane.pb")) for p in epochs)
    assert f"profile of the epoch's steps in {epochs[1]}" in r.stdout
    by_type = run([TOOL, epochs[1]])
    assert by_type.returncode == 0, by_type.stderr
    assert "MatMul" in by_type.stdout and "wall span (ms)" in by_type.stdout
    by_layer = run([TOOL, epochs[1], "--layers"])
    rows = {line.split()[0] for line in by_layer.stdout.splitlines()[2:]}
    assert {"hidden", "output"} <= rows, by_layer.stdout  # the loss's ops go by its layer too
    both = run([TOOL, epochs[0], epochs[1]])
    assert both.returncode == 0 and "ratio" in both.stdout.splitlines()[2]


def test_the_profiles_go_beside_the_model_by_default(tmp_path):
    r = run_rnn([write_config(tmp_path, "store_tf_profile = True\nnum_epochs = 1\n")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert glob.glob(str(tmp_path / "train-ep001-*" / "plugins" / "profile" / "*" / "*.xplane.pb"))


def test_tf_log_dir_without_the_profile_is_refused_and_a_non_profile_is_named(tmp_path):
    r = run_rnn([write_config(tmp_path, f"tf_log_dir = {str(tmp_path)!r}\n")])
    output = r.stdout + r.stderr
    assert r.returncode != 0 and "'tf_log_dir'" in output and "store_tf_profile" in output
    (tmp_path / "x.xplane.pb").write_bytes(b"\xff" * 50)
    bad = run([TOOL, str(tmp_path / "x.xplane.pb")])
    assert bad.returncode == 1 and "cannot read a TensorFlow profile" in bad.stderr
    empty = run([TOOL, str(tmp_path / "nothing")])
    assert empty.returncode == 1 and "no *.xplane.pb" in empty.stderr
