"""A BLSTM trained with the ctc loss through rnn.py, on one rank and on two with real mpirun, on a generated
corpus whose targets have their own lengths; and grad mode with ``global_frames``, which divides by all
ranks' target labels, gives the parameters of one process on the union batch."""
import re

import numpy as np
import pytest

from helpers import ROOT, run_mpi, run_rnn
from test_engine_parallel import train

pytestmark = [pytest.mark.tf_latest, pytest.mark.slow]

NETWORK = {
    "fw": {"class": "rec", "unit": "lstm", "n_out": 16, "direction": 1},
    "bw": {"class": "rec", "unit": "lstm", "n_out": 16, "direction": -1},
    "output": {"class": "softmax", "loss": "ctc", "from": ["fw", "bw"]},
}


def write_corpus(path, num_seqs, seed):
    """Input: one-hot symbols (plus noise), each held for 2-4 frames; target: the symbols, one per run, so
    a sequence has 2-5 labels and 4-20 frames."""
    from engine.datasets import DataKeyInfo, HDFWriter

    rng = np.random.RandomState(seed)
    with HDFWriter(str(path), {"data": DataKeyInfo(dim=5), "classes": DataKeyInfo(dim=4, sparse=True)}) as w:
        for i in range(num_seqs):
            symbols = [rng.randint(4)]
            for _ in range(rng.randint(1, 5)):
                symbols.append((symbols[-1] + rng.randint(1, 4)) % 4)  # never the same symbol twice in a row
            frames = np.concatenate([[s] * rng.randint(2, 5) for s in symbols])
            x = np.eye(5, dtype=np.float32)[frames] + 0.3 * rng.randn(len(frames), 5).astype(np.float32)
            w.insert(f"seq-{i}", {"data": x, "classes": np.array(symbols, np.int32)})
    return str(path)


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "train.hdf", 100, 1), write_corpus(tmp_path / "dev.hdf", 30, 2)


def config_file(tmp_path, corpus, num_epochs=6):
    path = tmp_path / "ctc.py"
    path.write_text(
        f"train = {{'class': 'HDFDataset', 'files': [{corpus[0]!r}]}}\n"
        f"dev = {{'class': 'HDFDataset', 'files': [{corpus[1]!r}]}}\n"
        f"network = {NETWORK!r}\n"
        "optimizer = {'class': 'adam'}\nlearning_rate = 0.02\nbatch_size = 200\n"
        f"num_epochs = {num_epochs}\nmodel = {str(tmp_path / 'out' / 'model')!r}\n")
    return str(path)


def dev_errors(stdout):
    return [float(e) for e in re.findall(r"^dev: score \S+ error (\S+)$", stdout, re.M)]


def test_blstm_ctc_learns_on_one_rank(tmp_path, corpus):
    r = run_rnn([config_file(tmp_path, corpus)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    errors = dev_errors(r.stdout)
    assert len(errors) == 6 and errors[0] > 0.3, r.stdout  # label error: edit distance / target labels
    assert errors[-1] < 0.1, r.stdout


@pytest.mark.mpi
def test_blstm_ctc_learns_on_two_ranks_with_mpirun(tmp_path, corpus):
    r = run_mpi(2, [str(ROOT / "rnn.py"), config_file(tmp_path, corpus, num_epochs=8), "++use_horovod", "1"],
                timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    errors = dev_errors(r.stdout)
    assert len(errors) == 8 and errors[-1] < 0.1, r.stdout


@pytest.mark.mpi
def test_global_frames_with_ctc_equals_one_process_on_the_union_batch(tmp_path, corpus):
    from engine.datasets import HDFDataset

    reference = HDFDataset(files=[corpus[0]])
    reference.init_seq_order(1)
    labels = reference.epoch_seq_lengths()[:, 1]  # columns: data, classes
    assert labels[0:2].sum() != labels[2:4].sum()  # step 1: rank 0 has seqs 0-1, rank 1 seqs 2-3

    def config(**overrides):
        return {"train": {"class": "HDFDataset", "files": [corpus[0]]}, "network": NETWORK,
                "optimizer": {"class": "sgd"}, "learning_rate": 0.1, "batch_size": 10000, "max_seqs": 2,
                "num_epochs": 1, "log_verbosity": 2, "random_seed": 3, **overrides}

    exact, _ = train(tmp_path, 2, config(use_horovod=True, distributed_backend="mpi",
                                         horovod_grad_normalization="global_frames"), timeout=300)
    single, _ = train(tmp_path, 1, config(max_seqs=4), timeout=300)  # each batch: both ranks' of that step
    assert exact[0]["num_steps"] == single[0]["num_steps"] == 25
    np.testing.assert_array_equal(exact[0]["params"], exact[1]["params"])
    assert not np.allclose(exact[0]["params"], exact[0]["after_step"][0])  # it did train
    np.testing.assert_allclose(exact[0]["params"], single[0]["params"], rtol=1e-5, atol=1e-6)


def test_an_unalignable_sequence_stops_rnn_py_with_a_data_error(tmp_path):
    from engine.datasets import DataKeyInfo, HDFWriter

    path = tmp_path / "bad.hdf"
    with HDFWriter(str(path), {"data": DataKeyInfo(dim=5), "classes": DataKeyInfo(dim=4, sparse=True)}) as w:
        w.insert("ok", {"data": np.zeros([6, 5], np.float32), "classes": np.array([0, 1], np.int32)})
        w.insert("bad", {"data": np.zeros([3, 5], np.float32), "classes": np.array([2, 2, 1], np.int32)})
    r = run_rnn([config_file(tmp_path, (str(path), str(path)), num_epochs=1)], timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Network layer 'output' (ctc loss, target 'classes'): sequences with fewer frames than their " \
           "labels need" in r.stdout + r.stderr
    assert "Count: 1 batch positions: 1 frames: 3 labels needing frames: 4" in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
