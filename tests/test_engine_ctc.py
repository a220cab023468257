"""A BLSTM trained with the ctc loss through rnn.py, on one rank and on two with real mpirun, on a generated
corpus whose targets have their own lengths; grad mode with ``global_frames``, which divides by all
ranks' target labels, gives the parameters of one process on the union batch; the epoch lines count
input frames while the scores divide by the target labels."""
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


def corpus_sequences(num_seqs, seed):
    """Input: one-hot symbols (plus noise), each held for 2-4 frames; target: the symbols, one per run, so
    a sequence has 2-5 labels and 4-20 frames. Yields (data, classes)."""
    rng = np.random.RandomState(seed)
    for _ in range(num_seqs):
        symbols = [rng.randint(4)]
        for _ in range(rng.randint(1, 5)):
            symbols.append((symbols[-1] + rng.randint(1, 4)) % 4)  # never the same symbol twice in a row
        frames = np.concatenate([[s] * rng.randint(2, 5) for s in symbols])
        x = np.eye(5, dtype=np.float32)[frames] + 0.3 * rng.randn(len(frames), 5).astype(np.float32)
        yield x, np.array(symbols, np.int32)


def write_corpus(path, num_seqs, seed):
    from engine.datasets import DataKeyInfo, HDFWriter

    with HDFWriter(str(path), {"data": DataKeyInfo(dim=5), "classes": DataKeyInfo(dim=4, sparse=True)}) as w:
        for i, (x, classes) in enumerate(corpus_sequences(num_seqs, seed)):
            w.insert(f"seq-{i}", {"data": x, "classes": classes})
    return str(path)


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "train.hdf", 100, 1), write_corpus(tmp_path / "dev.hdf", 30, 2)


def config_file(tmp_path, corpus, num_epochs=6, network=NETWORK):
    path = tmp_path / "ctc.py"
    path.write_text(
        f"train = {{'class': 'HDFDataset', 'files': [{corpus[0]!r}]}}\n"
        f"dev = {{'class': 'HDFDataset', 'files': [{corpus[1]!r}]}}\n"
        f"network = {network!r}\n"
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


def test_epoch_lines_count_input_frames_and_the_scores_divide_by_target_labels(tmp_path, corpus):
    """One linear softmax layer, so numpy can score the saved model: the dev score is the summed -log p
    over the labels (as RETURNN), the epoch lines' frames are the corpus' input frames."""
    from engine.training.checkpoints.reading import read_checkpoint
    from test_model_ctc import ctc_forward

    network = {"output": {"class": "softmax", "loss": "ctc", "from": "data"}}
    r = run_rnn([config_file(tmp_path, corpus, num_epochs=1, network=network)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    train_seqs, dev_seqs = list(corpus_sequences(100, 1)), list(corpus_sequences(30, 2))
    frames = [sum(len(x) for x, _ in seqs) for seqs in (train_seqs, dev_seqs)]
    labels = sum(len(y) for _, y in dev_seqs)
    assert labels < frames[1] / 2  # so a count of labels cannot pass for one of frames
    line = re.search(r"^train epoch 1: ([\d.]+) frames/sec \((\d+) frames", r.stdout, re.M)
    assert line and int(line.group(2)) == frames[0], (frames, r.stdout)
    rate = float(line.group(1))
    line = re.search(r"^epoch 1 'dev' eval: [\d.]+ frames/sec \((\d+) frames", r.stdout, re.M)
    assert line and int(line.group(1)) == frames[1], (frames, r.stdout)
    # TensorBoard and the run summary show the same rate of input frames
    from test_monitor_training import read_curves

    ((_, logged),) = read_curves(tmp_path / "out" / "tensorboard")["epoch/frames_per_sec"]
    assert rate > 0 and logged == pytest.approx(rate, abs=0.051)
    assert re.search(rf"^ +1 +\S+ +{rate:.1f} ", r.stdout, re.M), r.stdout

    params = read_checkpoint(str(tmp_path / "out" / "model.001")).groups["params"]
    (weights,) = [v for k, v in params.items() if v.ndim == 2]
    (bias,) = [v for k, v in params.items() if v.ndim == 1]
    loss = sum(ctc_forward(x.astype(np.float64) @ weights + bias, y) for x, y in dev_seqs)
    dev_score = float(re.search(r"^dev: score (\S+) error", r.stdout, re.M).group(1))
    np.testing.assert_allclose(dev_score, loss / labels, rtol=1e-4)


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
    # global_frames is use_normalized_loss over the union batch: each batch holds both ranks' of that step
    normalized = {**NETWORK, "output": {**NETWORK["output"], "loss_opts": {"use_normalized_loss": True}}}
    single, _ = train(tmp_path, 1, config(max_seqs=4, network=normalized), timeout=300)
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
