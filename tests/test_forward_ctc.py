"""Sequence outputs beyond one frame per input frame: forward of a ctc model that subsamples time writes
posteriors at the subsampled rate (blank included) and, on request, the best-path labels, on 2 ranks;
a config's own model (``get_model``) trained with ``model_loss = "ctc"`` at a subsampled rate."""
import h5py
import numpy as np
import pytest

from helpers import ROOT, run_mpi, run_rnn
from test_engine_ctc import dev_errors, write_corpus

pytestmark = [pytest.mark.tf_latest, pytest.mark.slow]

POOLED = {
    "fw": {"class": "rec", "unit": "lstm", "n_out": 16, "direction": 1},
    "bw": {"class": "rec", "unit": "lstm", "n_out": 16, "direction": -1},
    "pool": {"class": "pool", "mode": "max", "pool_size": (2,), "padding": "same", "from": ["fw", "bw"]},
    "output": {"class": "softmax", "loss": "ctc", "from": "pool"},
}
GET_MODEL = '''
import tensorflow as tf

class Subsampled(tf.Module):
    """A dense layer on pairs of frames: half the frame rate (a frame left over is dropped). Plain
    tf.Variables: a tf.Module does not track Keras 3 layers' variables."""

    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.w1 = tf.Variable(0.2 * tf.random.stateless_normal([2 * input_dim, 32], seed=[1, 2]))
        self.b1 = tf.Variable(tf.zeros([32]))
        self.w2 = tf.Variable(0.2 * tf.random.stateless_normal([32, output_dim], seed=[3, 4]))
        self.b2 = tf.Variable(tf.zeros([output_dim]))

    def output_lengths(self, lengths):
        return lengths // 2

    def __call__(self, data, lengths):
        frames = tf.shape(data)[1] // 2 * 2
        pairs = tf.reshape(data[:, :frames], [tf.shape(data)[0], frames // 2, 2 * data.shape[-1]])
        hidden = tf.tanh(tf.einsum("btf,fh->bth", pairs, self.w1) + self.b1)
        return tf.einsum("bth,ho->bto", hidden, self.w2) + self.b2, self.output_lengths(lengths)

def get_model(*, input_dim, output_dim, **kwargs):
    return Subsampled(input_dim, output_dim)

model_loss = "ctc"
'''


def numpy_best_path(posteriors):
    best = posteriors.argmax(axis=1)
    blank = posteriors.shape[1] - 1
    return [int(s) for i, s in enumerate(best) if s != blank and (i == 0 or s != best[i - 1])]


def write_config(tmp_path, corpus, model_text, num_epochs):
    path = tmp_path / "ctc.py"
    path.write_text(
        f"train = {{'class': 'HDFDataset', 'files': [{corpus[0]!r}]}}\n"
        f"dev = {{'class': 'HDFDataset', 'files': [{corpus[1]!r}]}}\n"
        f"eval = {{'class': 'HDFDataset', 'files': [{corpus[1]!r}]}}\n"
        + model_text +
        "\noptimizer = {'class': 'adam'}\nlearning_rate = 0.02\nbatch_size = 200\n"
        f"num_epochs = {num_epochs}\nmodel = {str(tmp_path / 'out' / 'model')!r}\n")
    return str(path)


@pytest.mark.mpi
def test_forward_of_a_pooled_ctc_model_on_2_ranks_writes_subsampled_posteriors_and_best_paths(tmp_path):
    corpus = write_corpus(tmp_path / "train.hdf", 60, 1), write_corpus(tmp_path / "dev.hdf", 17, 2)
    config = write_config(tmp_path, corpus, f"network = {POOLED!r}", num_epochs=2)
    assert run_rnn([config], timeout=300).returncode == 0
    out = tmp_path / "posteriors.hdf"
    r = run_mpi(2, [str(ROOT / "rnn.py"), config, "++use_horovod", "1", "++task", "forward",
                    "++output_file", str(out), "++forward_greedy_labels", "1"], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(corpus[1]) as f:
        frames = f["seqLengths"][:, 0]
    with h5py.File(out) as f:
        lengths = f["seqLengths"][:]
        posteriors = f["inputs"][:]
        best_paths = f["targets/data/greedy"][:]
        assert list(f["targets/size"].attrs["greedy"]) == [4, 1]
    np.testing.assert_array_equal(lengths[:, 0], (frames + 1) // 2)  # max-pool 2, "same": ceil(T / 2)
    assert posteriors.shape == (lengths[:, 0].sum(), 5)  # 4 labels + the blank
    np.testing.assert_allclose(posteriors.sum(axis=1), 1.0, rtol=1e-5)
    starts, label_starts = np.cumsum(lengths[:, 0]) - lengths[:, 0], np.cumsum(lengths[:, 1]) - lengths[:, 1]
    for i in range(len(lengths)):
        expected = numpy_best_path(posteriors[starts[i]:starts[i] + lengths[i, 0]])
        assert best_paths[label_starts[i]:label_starts[i] + lengths[i, 1]].tolist() == expected


def test_forward_greedy_labels_without_a_ctc_output_is_refused(tmp_path):
    corpus = write_corpus(tmp_path / "train.hdf", 20, 1), write_corpus(tmp_path / "dev.hdf", 5, 2)
    network = {"ctc": {"class": "softmax", "loss": "ctc"},  # trained, but not the output
               "output": {"class": "linear", "activation": "softmax", "n_out": 5, "from": "ctc"}}
    config = write_config(tmp_path, corpus, f"network = {network!r}", num_epochs=1)
    assert run_rnn([config], timeout=300).returncode == 0
    r = run_rnn([config, "++task", "forward", "++output_file", str(tmp_path / "o.hdf"),
                 "++forward_greedy_labels", "1"], timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "forward_greedy_labels is set, but the model's 'output' has no ctc loss" in r.stdout + r.stderr
    assert not (tmp_path / "o.hdf").exists()


def test_get_model_with_ctc_at_half_the_frame_rate_learns_and_forwards(tmp_path):
    corpus = write_corpus(tmp_path / "train.hdf", 100, 1), write_corpus(tmp_path / "dev.hdf", 20, 2)
    config = write_config(tmp_path, corpus, GET_MODEL, num_epochs=8)
    r = run_rnn([config], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    errors = dev_errors(r.stdout)
    assert len(errors) == 8 and errors[-1] < errors[0] and errors[-1] < 0.5, r.stdout
    out = tmp_path / "posteriors.hdf"
    r = run_rnn([config, "++task", "forward", "++output_file", str(out)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(corpus[1]) as f, h5py.File(out) as g:
        np.testing.assert_array_equal(g["seqLengths"][:, 0], f["seqLengths"][:, 0] // 2)
