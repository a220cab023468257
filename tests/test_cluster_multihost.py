"""Two hosts simulated with network namespaces (tests/cluster/simulated_hosts.py): the SGE job body
(tools/qsub_train.sh --run) starts one rank on each with mpirun, Open MPI's TCP transport restricted
to the link between them, and a 2-rank training run completes. Its allreduce crossed the link: the
link's byte counters rose, on each side, by at least the allreduced gradient bytes, and the ranks name
different hosts.
Skipped, with the reason, only where the machine forbids namespaces."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from helpers import ROOT, child_env
from prerequisites import require
from cluster.simulated_hosts import AGENT, SUBNET, SimulatedHosts

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CONFIG = """
task = "train"
train = {"class": "Task12AXDataset", "num_seqs": 200, "fixed_random_seed": 1}
batch_size = 2000
max_seqs = 20
# 256 LSTM units: enough parameters that the allreduce outweighs MPI's start-up traffic on the link
network = {"lstm": {"class": "rec", "unit": "NativeLstm2", "n_out": 256},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
optimizer = {"class": "adam"}
learning_rate = 0.01
num_epochs = 1
"""


def allreduced_bytes(checkpoint: str) -> int:
    """Gradient bytes allreduced over the run: one float32 gradient per parameter per step."""
    with h5py.File(checkpoint, "r") as f:
        steps = int(f.attrs["global_step"])
        param_bytes = sum(ds.size * ds.dtype.itemsize for ds in f["params"].values())
    assert steps > 0 and param_bytes > 0
    return steps * param_bytes


def test_two_hosts_train_together_over_the_veth_link(tmp_path):
    require("network namespaces (root, ip netns)", SimulatedHosts.unavailable())
    config = tmp_path / "multihost.py"
    config.write_text(CONFIG)
    model = tmp_path / "model"
    with SimulatedHosts.create() as hosts:
        pe_hostfile = tmp_path / "pe_hostfile"  # what SGE would grant: one slot on each host
        pe_hostfile.write_text("".join(f"{h.address} 1 all.q@{h.hostname} UNDEFINED\n" for h in hosts.hosts))
        env = child_env({
            "PE_HOSTFILE": str(pe_hostfile), "JOB_ID": "multihost", "TMPDIR": str(tmp_path),
            "PYTHON": sys.executable, "SIMULATED_HOSTS": hosts.agent_map,
            "MPIRUN_ARGS": f"--prtemca plm_ssh_agent {AGENT} --prtemca oob_tcp_if_include {SUBNET} "
                           f"--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include {SUBNET}",
        })
        job = [str(ROOT / "tools" / "qsub_train.sh"), "--run", str(config), "2", "++model", str(model)]
        before = hosts.tx_bytes()
        proc = subprocess.Popen(hosts.command_on(0, job), cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            pytest.fail(f"the 2-host run did not finish in 150 s:\n{output}")
        sent = np.subtract(hosts.tx_bytes(), before)

    assert proc.returncode == 0, output
    assert "hosts: 2 ranks on 2 hosts: simhost0 rank 0; simhost1 rank 1" in output, output
    assert "train epoch 1, finished after" in output and "finished training after epoch 1" in output, output
    # For two ranks to end with the sum, each must send the other all it holds: per step at least the
    # gradient bytes, over the only path between the namespaces.
    needed = allreduced_bytes(f"{model}.001")
    assert sent.min() >= needed, f"bytes sent over the link per host {sent.tolist()}, allreduced {needed}"
