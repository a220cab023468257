"""The train, eval and forward tasks through ``rnn.py``: learning, reports, checkpoints, resume, forward."""
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from helpers import ROOT, child_env, mpirun_cmd, run_mpi, run_rnn

RNN = str(ROOT / "rnn.py")
TINY = """
train = {"class": "DummyDataset", "input_dim": 4, "output_dim": 3, "num_seqs": %(num_seqs)d, "seq_len": 12,
         "fixed_random_seed": 1}
dev = {"class": "DummyDataset", "input_dim": 4, "output_dim": 3, "num_seqs": 20, "seq_len": 12,
       "fixed_random_seed": 1}  # the seed also picks the task's class mapping: the same as train's
network = {"lstm": {"class": "rec", "unit": "LSTMBlock", "n_out": 8},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
batch_size = 120
learning_rate = 0.01
num_epochs = 2
model = %(model)r
"""


def tiny_config(tmp_path, num_seqs=40, extra=""):
    path = tmp_path / "tiny.py"
    path.write_text(TINY % {"num_seqs": num_seqs, "model": str(tmp_path / "net")} + extra)
    return str(path)


def dev_errors(stdout):
    return [float(e) for e in re.findall(r"^dev: score \S+ error (\S+)$", stdout, re.M)]


# ----- learning, reporting -----

@pytest.mark.tf_latest
def test_12ax_demo_learns_in_one_process(tmp_path):
    r = run_rnn([str(ROOT / "configs" / "12ax.py"), "++model", str(tmp_path / "m"),
                 "++learning_rate_file", str(tmp_path / "lr")], timeout=300)
    assert r.returncode == 0, r.stderr
    errors = dev_errors(r.stdout)
    assert len(errors) == 5 and errors[-1] < 0.02, r.stdout
    assert os.path.exists(tmp_path / "m.005")


@pytest.mark.tf_latest_mpi
@pytest.mark.mpi
@pytest.mark.tf_latest
def test_12ax_demo_learns_with_2_ranks(tmp_path):
    r = run_mpi(2, [str(ROOT / "rnn.py"), str(ROOT / "configs" / "12ax.py"), "++use_horovod", "1",
                    "++model", str(tmp_path / "m"), "++learning_rate_file", str(tmp_path / "lr")],
                timeout=300)
    assert r.returncode == 0, r.stderr
    errors = dev_errors(r.stdout)
    assert len(errors) == 5 and errors[-1] < 0.02, r.stdout  # only rank 0 prints progress


@pytest.mark.tf_latest
def test_epoch_report_lines(tmp_path):
    r = run_rnn([tiny_config(tmp_path), "++log_verbosity", "5"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    elapsed = r"\d+:\d\d:\d\d elapsed \(\d+\.\d% computing time\)$"
    assert re.search(r"^train epoch 1, finished after 4 steps, " + elapsed, out, re.M), out
    assert re.search(r"^epoch 1 'dev' eval, finished after 2 steps, " + elapsed, out, re.M), out
    assert re.search(r"^epoch 2 score: [\d.]+ error: [\d.]+ elapsed: \d+:\d\d:\d\d$", out, re.M), out
    assert re.search(r"^dev: score [\d.]+ error [\d.]+$", out, re.M), out
    assert re.search(r"^train epoch 1: [\d.]+ frames/sec", out, re.M), out
    step = re.search(r"^train epoch 1, step 4, score [\d.]+, error [\d.]+, [\d.]+ sec/step, elapsed \S+, "
                     r"exp\. remaining \S+, complete 100\.0%$", out, re.M)
    assert step, out


# ----- checkpoints and resume -----

@pytest.mark.tf_latest
@pytest.mark.slow  # several training runs (kill or stop, then resume)
def test_kill_during_checkpoint_save_leaves_previous_checkpoint(tmp_path):
    """The process dies right before the rename that would publish epoch 2's checkpoint."""
    cfg = tiny_config(tmp_path)
    killer = tmp_path / "kill_on_second_save.py"
    killer.write_text(
        "import os, signal, sys\n"
        "real_replace, saves = os.replace, []\n"
        "def replace(src, dst):\n"
        "    if dst.endswith('net.002'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    real_replace(src, dst)\n"
        "os.replace = replace\n"
        f"sys.argv = ['rnn.py', {cfg!r}]\n"
        f"exec(compile(open({RNN!r}).read(), 'rnn.py', 'exec'))\n")
    r = subprocess.run([sys.executable, str(killer)], capture_output=True, text=True, timeout=120,
                       env=child_env())
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert os.path.exists(tmp_path / "net.001") and not os.path.exists(tmp_path / "net.002")
    leftovers = [p for p in os.listdir(tmp_path) if "net.002" in p]
    assert leftovers and all(".tmp" in p for p in leftovers)  # only the temp file of the killed save
    # the previous checkpoint loads: eval on it works, and training resumes after epoch 1
    r = run_rnn([cfg, "++task", "eval"])
    assert r.returncode == 0 and "loaded model from" in r.stdout and dev_errors(r.stdout), r.stderr
    r = run_rnn([cfg])
    assert r.returncode == 0 and "resuming after epoch 1" in r.stdout, r.stdout + r.stderr
    assert os.path.exists(tmp_path / "net.002")


@pytest.mark.tf_latest
def test_checkpoint_not_matching_network_is_a_clear_error(tmp_path):
    cfg = tiny_config(tmp_path)
    assert run_rnn([cfg, "++num_epochs", "1"]).returncode == 0
    other = cfg.replace("tiny.py", "wider.py")
    with open(other, "w") as f:
        f.write(open(cfg).read().replace('"n_out": 8', '"n_out": 16'))
    r = run_rnn([other, "++task", "eval"])
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "does not match the network" in r.stderr and "net.001" in r.stderr and "(8" in r.stderr, r.stderr


@pytest.mark.mpi
def test_resume_after_kill_finishes_with_learning_rate_history(tmp_path):
    # 8 epochs: the kill lands after epoch 2, and a loaded machine that starves this test's polling for a
    # few epochs still finds the job running (with 4, the job once ended before the kill)
    cfg = tiny_config(tmp_path, num_seqs=1500, extra=(
        "num_epochs = 8\nlearning_rate_control = 'newbob_rel'\nnewbob_relative_error_threshold = -100\n"
        f"learning_rate_file = {str(tmp_path / 'lr.txt')!r}\n"))
    cmd = mpirun_cmd(2, [sys.executable, RNN, cfg, "++use_horovod", "1"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env(),
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(tmp_path / "net.002") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the job ended before the kill:\n" + proc.stdout.read().decode()
    os.killpg(proc.pid, signal.SIGKILL)  # the whole job, after epoch 2 of 8
    proc.wait(timeout=30)
    assert os.path.exists(tmp_path / "net.002") and not os.path.exists(tmp_path / "net.008")
    newest = max(int(p[-3:]) for p in os.listdir(tmp_path) if re.fullmatch(r"net\.\d{3}", p))
    r = run_mpi(2, [RNN, cfg, "++use_horovod", "1"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resuming after epoch {newest}" in r.stdout
    assert f"train epoch {newest}," not in r.stdout and "train epoch 8," in r.stdout
    history = (tmp_path / "lr.txt").read_text()
    for epoch in range(1, 9):  # every epoch's learning rate and scores, also those of the killed run
        assert re.search(rf"^\s*{epoch}: EpochData\(learningRate=", history, re.M), history
    # newbob_rel with a threshold of -100 halves the rate from epoch 3 on (it compares the two previous
    # epochs): the halvings after the restart build on the history of the killed run
    rates = [float(x) for x in re.findall(r"learningRate=([\d.e-]+)", history)]
    assert rates == pytest.approx([0.01, 0.01] + [0.01 / 2 ** k for k in range(1, 7)]), history


# ----- forward and eval -----

@pytest.mark.mpi
@pytest.mark.tf_latest
def test_forward_with_2_ranks_writes_one_file_in_corpus_order(tmp_path):
    cfg = tiny_config(tmp_path, extra=(
        "eval = {'class': 'Task12AXDataset', 'num_seqs': 37, 'fixed_random_seed': 5,\n"
        "        'seq_ordering': 'random'}\n"
        "train = {'class': 'Task12AXDataset', 'num_seqs': 50, 'fixed_random_seed': 4}\n"
        "dev = None\n"))
    assert run_rnn([cfg, "++num_epochs", "1"]).returncode == 0
    out = tmp_path / "forward.hdf"
    r = run_mpi(2, [RNN, cfg, "++use_horovod", "1", "++task", "forward", "++output_file", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "wrote 37 sequences" in r.stdout
    # parts removed (the curves are the training run's)
    assert sorted(os.listdir(tmp_path)) == sorted(["tiny.py", "net.001", "net.learning_rates", "tensorboard",
                                                   "forward.hdf"])
    from engine.datasets import Task12AXDataset, create_dataset

    reference = Task12AXDataset(num_seqs=37, fixed_random_seed=5)
    reference.init_seq_order(1)
    written = create_dataset(str(out))
    written.init_seq_order(1)
    assert written.num_seqs == 37
    for i in range(37):
        assert written.get_seq_tag(i) == reference.get_seq_tag(i)
        probs = written.get_data(i, "data")
        assert probs.shape == (reference.get_seq_length(i)["data"], 2)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    with h5py.File(out) as f:  # RETURNN's layout: inputs + seqLengths with 2 columns
        assert f["seqLengths"].shape == (37, 2) and f["inputs"].shape[1] == 2
        two_ranks = f["inputs"][:]
    one = tmp_path / "one.hdf"  # one rank: other batches and threads (2 ranks split by frames)
    r = run_rnn([cfg, "++task", "forward", "++output_file", str(one)])
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(one) as f:
        one_rank = f["inputs"][:]
        longest = int(f["seqLengths"][:, 0].max())
    # The same outputs up to float32 rounding (docs/long-jobs.md): other batch shapes and thread counts
    # add the terms of each dot product in another order. Higham's bound for a dot product of length n
    # is n * u * sum|x_i w_i|; the LSTM's gate inputs are one-hot inputs and outputs in [-1, 1], and an
    # output depends on the dot products of every earlier step, so its rounding stays below
    # steps * n * u with n = 9 inputs + 8 recurrent + 1 bias, in units of the (unit-sized) weights.
    bound = longest * (9 + 8 + 1) * np.finfo(np.float32).eps / 2
    difference = np.abs(one_rank - two_ranks).max()
    assert difference <= bound, f"1 rank and 2 ranks differ by {difference:.3g} > {bound:.3g}"


@pytest.mark.mpi
def test_forward_with_a_failing_rank_ends_every_rank_and_leaves_no_output(tmp_path):
    """Only rank 1 builds a bad network (the same config on every rank, a get_network that looks at the
    rank): both ranks exit non-zero with its message, no hang, and neither output_file nor its
    temporary file is left."""
    cfg = tiny_config(tmp_path, extra=(
        "eval = {'class': 'DummyDataset', 'input_dim': 4, 'output_dim': 3, 'num_seqs': 20, 'seq_len': 12}\n"
        "dev = None\n"))
    assert run_rnn([cfg, "++num_epochs", "1"]).returncode == 0
    with open(cfg, "a") as f:
        f.write("import os\n_layers = network\ndel network\n\n"
                "def get_network(epoch, **_):\n"
                "    if os.environ.get('OMPI_COMM_WORLD_RANK') == '1':\n"
                "        return {**_layers, 'output': {**_layers['output'], 'n_ouut': 3}}\n"
                "    return _layers\n")
    out = tmp_path / "forward.hdf"
    r = run_mpi(2, [RNN, cfg, "++use_horovod", "1", "++task", "forward", "++output_file", str(out)],
                timeout=120)
    assert r.returncode != 0
    assert "n_ouut" in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert not [name for name in os.listdir(tmp_path) if "forward" in name]


@pytest.mark.mpi
def test_eval_task_scores_are_the_same_on_1_and_2_ranks(tmp_path):
    cfg = tiny_config(tmp_path)
    assert run_rnn([cfg, "++num_epochs", "1"]).returncode == 0
    one = run_rnn([cfg, "++task", "eval"])
    two = run_mpi(2, [RNN, cfg, "++task", "eval", "++use_horovod", "1"])
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    line = re.compile(r"^dev: score (\S+) error (\S+)$", re.M)
    s1, s2 = line.search(one.stdout).groups(), line.search(two.stdout).groups()
    np.testing.assert_allclose(np.array(s1, float), np.array(s2, float), rtol=1e-5)


# ----- bad input -----

@pytest.mark.tf_latest
@pytest.mark.parametrize("edit,message", [
    (("batch_size = 120", ""), "'batch_size' is required"),
    (("train = {", "unused = {"), "'train' is missing"),
    (("num_epochs = 2", "horovod_reduce_typ = 'param'"), "horovod_reduce_typ"),
])
def test_bad_train_config_is_a_clear_error(tmp_path, edit, message):
    cfg = tiny_config(tmp_path)
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text.replace(*edit))
    r = run_rnn([cfg])
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr, r.stderr


@pytest.mark.mpi
def test_mpirun_without_use_horovod_is_an_error(tmp_path):
    r = run_mpi(2, [RNN, tiny_config(tmp_path)], timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.count("'use_horovod' is off") == 1, r.stderr  # printed once, not per rank
    assert not os.path.exists(tmp_path / "net.001")


@pytest.mark.mpi
def test_shipped_configs_run_with_2_ranks(tmp_path):
    """configs/12ax_param.py and configs/blstm_hdf.py (on corpora hdf_dump writes), as the README says."""
    for spec, name in [("input_dim=40,output_dim=10,num_seqs=80,seq_len=60,fixed_random_seed=1", "train"),
                       ("input_dim=40,output_dim=10,num_seqs=20,seq_len=60,fixed_random_seed=1", "dev")]:
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "hdf_dump.py"), f"DummyDataset:{spec}",
                            f"data/{name}.hdf"],
                           cwd=tmp_path, capture_output=True, text=True, env=child_env())
        assert r.returncode == 0, r.stderr
    for config in ("12ax_param.py", "blstm_hdf.py"):
        r = run_mpi(2, [RNN, str(ROOT / "configs" / config), "++use_horovod", "1", "++num_epochs", "1"],
                    cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "train epoch 1, finished after" in r.stdout and dev_errors(r.stdout)
    assert sorted(os.listdir(tmp_path / "out")) == ["12ax_param", "blstm"]


@pytest.mark.tf_latest
def test_extern_data_not_matching_the_dataset_is_a_clear_error(tmp_path):
    cfg = tiny_config(tmp_path,
                      extra="extern_data = {'data': {'dim': 5}, 'classes': {'dim': 3, 'sparse': True}}\n")
    r = run_rnn([cfg])
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "stream 'data' with dim 5" in r.stderr and "has dim 4" in r.stderr, r.stderr
