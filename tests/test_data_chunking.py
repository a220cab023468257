"""Chunking (``chunking = "size:step"``, per-key sizes, ``min_chunk_size``): the chunks, their batches, the
dev/eval rule, and steps and frames per epoch as RETURNN counts them on the same corpus."""
import re

import numpy as np
import pytest

from engine.config.loader import Config
from engine.datasets import (BatchOptions, DataKeyInfo, HDFDataset, HDFWriter, dataset_from_config,
                             generate_batches)
from engine.datasets.chunking import Chunking, cut_into_chunks, parse_chunking
from engine.runtime.errors import ConfigError, DataError
from helpers import ROOT, run_mpi, run_rnn

pytestmark = pytest.mark.tf_latest


def write_corpus(path, num_seqs=40, seed=123):
    """The corpus the RETURNN numbers below were measured on (40 sequences of 1..299 frames)."""
    rng = np.random.RandomState(seed)
    keys = {"data": DataKeyInfo(dim=5), "classes": DataKeyInfo(dim=4, sparse=True)}
    with HDFWriter(str(path), keys) as writer:
        for i in range(num_seqs):
            n = int(rng.randint(1, 300))
            writer.insert(f"seq-{i}", {"data": rng.standard_normal((n, 5)).astype(np.float32),
                                       "classes": rng.randint(0, 4, n).astype(np.int32)})
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("chunking") / "corpus.hdf")


def chunks(lengths, chunking, min_chunk_size=0, keys=("data", "classes")):
    pieces = cut_into_chunks(np.array(lengths), list(keys), parse_chunking(chunking, min_chunk_size), "test")
    return pieces.positions.tolist(), pieces.starts.tolist(), pieces.lengths.tolist()


def test_parse_forms():
    assert parse_chunking("50:25") == Chunking(50, 25, 0)
    assert parse_chunking("50") == parse_chunking(50) == Chunking(50, 50, 0)
    assert parse_chunking((50, 25), {"data": 3}) == Chunking(50, 25, {"data": 3})
    assert parse_chunking("50:0") == Chunking(50, 50, 0)  # step 0: the size
    assert parse_chunking(({"data": 8, "classes": 4}, {"data": 4, "classes": 2})) == Chunking(
        {"data": 8, "classes": 4}, {"data": 4, "classes": 2}, 0)
    for off in (None, 0, "0"):
        assert parse_chunking(off) is None
    for bad, message in [("50:x", "not understood"), ("", "not understood"), ("1:2:3", "not understood"),
                         (-5, "positive"), (({"data": 4}, {"classes": 2}), "same data keys"),
                         (lambda **kw: [], "function"), (("50", 2), "chunk size")]:
        with pytest.raises(ConfigError, match=message):
            parse_chunking(bad)


def test_chunks_follow_returnns_rules():
    # length 9, size 4, step 2: starts 0, 2, 4, 6, 8 (while frames are left), the last ones shorter
    assert chunks([[9, 9]], "4:2") == ([0] * 5, [[0, 0], [2, 2], [4, 4], [6, 6], [8, 8]],
                                       [[4, 4], [4, 4], [4, 4], [3, 3], [1, 1]])
    # min_chunk_size 2: no chunk at 8, where only 1 frame is left
    assert chunks([[9, 9]], "4:2", 2)[2] == [[4, 4], [4, 4], [4, 4], [3, 3]]
    # a sequence of length 0 gives no chunk; one of length 4 gives [0, 4) and [2, 4)
    assert chunks([[0, 0], [4, 4]], "4:2") == ([1, 1], [[0, 0], [2, 2]], [[4, 4], [2, 2]])
    # one label per sequence is repeated whole; that key has no frame left after chunk 0, so one chunk
    assert chunks([[9, 1]], "4:2") == ([0], [[0, 0]], [[4, 1]])
    # streams of different rates with their own sizes and steps: 20 and 10 frames give 5 chunks each
    pos, starts, lengths = chunks([[20, 10]], ({"data": 8, "classes": 4}, {"data": 4, "classes": 2}))
    assert starts == [[0, 0], [4, 2], [8, 4], [12, 6], [16, 8]]
    assert lengths == [[8, 4], [8, 4], [8, 4], [8, 4], [4, 2]]


def test_keys_that_cannot_be_cut_together_are_an_error():
    with pytest.raises(DataError, match="key 'classes' has 7 frames but 'data' has 9, with chunk step 2"):
        chunks([[9, 7]], "4:2")
    with pytest.raises(DataError, match="gives 3 chunks"):
        chunks([[20, 5]], ({"data": 8, "classes": 4}, {"data": 4, "classes": 2}))
    with pytest.raises(ConfigError, match=r"also hold \['classes'\]"):
        chunks([[9, 9]], ({"data": 4}, {"data": 2}))


def test_batches_hold_the_chunks_frames(corpus):
    ds = HDFDataset(corpus, seq_ordering="random", chunking="50:25")
    ds.init_seq_order(2)
    seen = 0
    for batch in generate_batches(ds, BatchOptions(500, max_seqs=7)):
        assert batch.num_seqs <= 7 and batch.data["data"].shape[0] * batch.data["data"].shape[1] <= 500
        for j, pos in enumerate(batch.seq_idx):
            assert batch.seq_tags[j] == ds.get_seq_tag(pos)
            n = batch.lengths["data"][j]
            whole = ds.get_data(pos, "data")
            starts = [s for s in range(0, len(whole), 25) if len(whole[s:s + 50]) == n]
            assert any(np.array_equal(batch.data["data"][j, :n], whole[s:s + 50]) for s in starts)
            assert not batch.data["data"][j, n:].any()
            k = next(s for s in starts if np.array_equal(batch.data["data"][j, :n], whole[s:s + 50]))
            np.testing.assert_array_equal(batch.data["classes"][j, :n], ds.get_data(pos, "classes")[k:k + 50])
            seen += 1
    lengths = ds.epoch_seq_lengths()[:, 0]
    assert seen == sum(-(-int(n) // 25) for n in lengths)  # a chunk at every 25th frame


# Measured with RETURNN 1.20261022 (TF 2.15, /tmp/returnn-venv) on write_corpus()'s corpus, a network with
# one rec layer, through its train loop: "train epoch 1, finished after N steps" and the frames its Runner
# accumulated. (ordering, chunking, min_chunk_size, batch_size, max_seqs) -> (steps, frames per key)
RETURNN_EPOCHS = [
    (("sorted", "50:25", 0, 500, 10), (26, 10929)),
    (("random", "50:25", 0, 500, 10), (26, 10929)),
    (("laplace:.10", "40:10", 0, 300, 7), (88, 21473)),
    (("default", "100", 20, 1000, 20), (8, 5881)),
    (("sorted", "0", 0, 500, 10), (19, 5932)),
]


@pytest.mark.parametrize("settings, expected", RETURNN_EPOCHS)
def test_steps_and_frames_per_epoch_are_returnns(corpus, settings, expected):
    ordering, chunking, min_chunk_size, batch_size, max_seqs = settings
    ds = HDFDataset(corpus, seq_ordering=ordering, chunking=chunking, min_chunk_size=min_chunk_size)
    ds.init_seq_order(1)
    batches = list(generate_batches(ds, BatchOptions(batch_size, max_seqs)))
    frames = {key: sum(b.num_frames[key] for b in batches) for key in ("data", "classes")}
    assert (len(batches), frames["data"], frames["classes"]) == (expected[0], expected[1], expected[1])


TRAIN = """
train = {"class": "HDFDataset", "files": [%(corpus)r], "seq_ordering": "sorted"}
dev = {"class": "HDFDataset", "files": [%(corpus)r]}
network = {"lstm": {"class": "rec", "unit": "lstmp", "n_out": 4},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
chunking = "50:25"
batch_size = 500
max_seqs = 10
adam = True
learning_rate = 0.01
num_epochs = 1
"""


def test_training_epoch_is_chunked_and_dev_is_not(tmp_path, corpus):
    cfg = tmp_path / "train.py"
    cfg.write_text(TRAIN % {"corpus": corpus})
    r = run_rnn([str(cfg)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^train epoch 1, finished after 26 steps", r.stdout, re.M), r.stdout
    assert re.search(r"^train epoch 1: [\d.]+ frames/sec \(10929 frames", r.stdout, re.M), r.stdout
    assert re.search(r"^epoch 1 'dev' eval: [\d.]+ frames/sec \(5932 frames", r.stdout, re.M), r.stdout


@pytest.mark.mpi
@pytest.mark.version_independent
def test_chunks_are_sharded_over_2_ranks(tmp_path, corpus):
    cfg = tmp_path / "train.py"
    cfg.write_text(TRAIN % {"corpus": corpus}
                   + "use_horovod = True\ndistributed_backend = 'mpi'\ndev = None\n")
    r = run_mpi(2, [str(ROOT / "rnn.py"), str(cfg)])
    assert r.returncode == 0, r.stdout + r.stderr
    # 26 batches of chunks: rank r takes batches r, r + 2, ...; the frames are summed over both ranks
    assert re.search(r"^train epoch 1, finished after 13 steps", r.stdout, re.M), r.stdout
    assert re.search(r"^train epoch 1: [\d.]+ frames/sec \(10929 frames", r.stdout, re.M), r.stdout


def test_dev_and_eval_are_chunked_only_when_asked(corpus):
    spec = {"class": "HDFDataset", "files": [corpus]}

    def chunking_of(key, **values):
        return dataset_from_config(Config({key: spec, "chunking": "50:25", **values}), key).chunking

    assert chunking_of("train") == Chunking(50, 25, 0)
    assert chunking_of("dev") is None and chunking_of("eval") is None
    assert chunking_of("dev", chunk_eval=True) == Chunking(50, 25, 0)
    assert dataset_from_config(Config({"dev": spec, "chunking": "1"}), "dev").chunking == Chunking(1, 1, 0)
    own = dataset_from_config(Config({"dev": {**spec, "chunking": "10:5"}, "chunking": "50:25"}), "dev")
    assert own.chunking == Chunking(10, 5, 0)  # a dataset's own option always wins
    assert dataset_from_config(Config({"train": spec, "chunking": "20", "min_chunk_size": 5}),
                               "train").chunking == Chunking(20, 20, 5)


def test_non_recurrent_network_is_not_chunked(corpus):
    from engine.model.network import NetworkModel

    ff = NetworkModel({"output": {"class": "softmax", "loss": "ce"}}, input_dim=5, input_sparse=False,
                      target_dims={"classes": 4}, random_seed=1)
    assert not ff.recurrent
    ds = HDFDataset(corpus, seq_ordering="sorted", chunking="50:25")
    ds.init_seq_order(1)
    whole = list(generate_batches(ds, BatchOptions(500, 10), recurrent=False))
    assert sum(b.num_frames["data"] for b in whole) == 5932 and len(whole) == 19  # as unchunked, above


def test_forward_refuses_a_chunked_eval_dataset(tmp_path, corpus):
    cfg = tmp_path / "forward.py"
    cfg.write_text(TRAIN % {"corpus": corpus} + f"task = 'forward'\nchunk_eval = True\neval = train\n"
                                                f"output_file = {str(tmp_path / 'out.hdf')!r}\n")
    r = run_rnn([str(cfg)])
    assert (r.returncode != 0
            and "writes one output per sequence, but the 'eval' dataset is chunked" in r.stderr)
    assert "Traceback" not in r.stderr
