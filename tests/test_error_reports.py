"""A config error found while the model is built, or while a step is traced, is one paragraph at any
log_verbosity (RETURNN recipes run at 5), printed once on 1 and on 2 ranks; ``debug`` adds the traceback."""
import pytest

from helpers import ROOT, run_mpi, run_rnn

TRAIN = ("task = 'train'\ntrain = {'class': 'Task12AXDataset', 'num_seqs': 100, 'fixed_random_seed': 1}\n"
         "batch_size = 300\nnum_epochs = 1\nmodel = 'out/model'\n")
UNIMPLEMENTED_CLASS = TRAIN + (
    "network = {'in': {'class': 'forced_align', 'topology': 'ctc'},\n"
    "           'fw': {'class': 'rec', 'unit': 'BasicLSTM', 'n_out': 4, 'from': 'in'},\n"
    "           'output': {'class': 'softmax', 'loss': 'ce', 'from': 'fw'}}\n")
TIME_AXES = TRAIN + (  # found when the network is built: the loss is on the chunks' time axis
    "network = {'in': {'class': 'time_chunking', 'chunk_size': 22, 'chunk_step': 11},\n"
    "           'fw': {'class': 'rec', 'unit': 'BasicLSTM', 'n_out': 4, 'from': 'in'},\n"
    "           'output': {'class': 'softmax', 'loss': 'ce', 'from': 'fw'}}\n")
UNKNOWN_UNIT = TRAIN + ("network = {'fw': {'class': 'rec', 'unit': 'NoSuchLstm', 'n_out': 4},\n"
                        "           'output': {'class': 'softmax', 'loss': 'ce', 'from': 'fw'}}\n")
GET_NETWORK = TRAIN + (  # checked when the model is built, not at start
    "def get_network(epoch, **kwargs):\n"
    "    return {'in': {'class': 'forced_align', 'topology': 'ctc'},\n"
    "            'output': {'class': 'softmax', 'loss': 'ce', 'from': 'in'}}\n")
NO_LOSS = TRAIN + ("network = {'fw': {'class': 'rec', 'unit': 'lstm', 'n_out': 4},\n"  # found when tracing
                   "           'output': {'class': 'softmax', 'from': 'fw'}}\n")
NOT_OURS = "'forced_align' is a RETURNN layer class this engine does not"
CASES = {"unimplemented class": (UNIMPLEMENTED_CLASS, NOT_OURS),
         "time axes": (TIME_AXES, "is on the time axis of time_chunking layer 'in'"),
         "unknown unit": (UNKNOWN_UNIT, "unit 'NoSuchLstm' is not supported"),
         "get_network": (GET_NETWORK, NOT_OURS),
         "traced": (NO_LOSS, "The network has no layer with a loss")}


def write(tmp_path, text, verbosity):
    path = tmp_path / "c.config"
    path.write_text(f"#!rnn.py\n{text}log_verbosity = {verbosity}\n")
    return str(path)


def assert_one_paragraph(r, message):
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "in user code" not in r.stderr, r.stderr
    assert r.stderr.count("rnn.py: error:") == 1 and message in r.stderr, r.stderr


@pytest.mark.tf_latest
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("verbosity", [3, 5])
def test_one_paragraph_in_one_process(tmp_path, case, verbosity):
    text, message = CASES[case]
    assert_one_paragraph(run_rnn([write(tmp_path, text, verbosity)], cwd=tmp_path), message)


@pytest.mark.tf_latest
def test_debug_adds_the_traceback(tmp_path):
    r = run_rnn([write(tmp_path, NO_LOSS, 3), "++debug", "1"], cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr and "compute_losses" in r.stderr, r.stderr
    assert "in user code" not in r.stderr  # the error as raised, with its own stack


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["unimplemented class", "time axes", "get_network", "traced"])
def test_one_paragraph_once_on_two_ranks(tmp_path, case):
    text, message = CASES[case]
    r = run_mpi(2, [str(ROOT / "rnn.py"), write(tmp_path, text, 5), "++use_horovod", "1"], cwd=tmp_path)
    assert_one_paragraph(r, message)


@pytest.mark.tf_latest
def test_check_numerics_stops_at_the_first_nan_with_one_paragraph(tmp_path):
    import numpy as np

    from engine.datasets import DataKeyInfo, HDFWriter

    keys = {"data": DataKeyInfo(dim=3), "classes": DataKeyInfo(dim=2, sparse=True)}
    with HDFWriter(str(tmp_path / "nan.hdf"), keys) as writer:
        for i in range(4):
            data = np.ones((5, 3), np.float32)
            data[2, 1] = np.nan if i == 3 else 0.5  # a corrupt frame in the last sequence
            writer.insert(f"seq-{i}", {"data": data, "classes": np.zeros(5, np.int32)})
    text = ("task = 'train'\ntrain = {'class': 'HDFDataset', 'files': ['nan.hdf']}\nbatch_size = 5\n"
            "num_epochs = 1\nnetwork = {'output': {'class': 'softmax', 'loss': 'ce'}}\n")
    config = write(tmp_path, text, 3)
    # without either check (stop_on_nonfinite_train_score off, as RETURNN allows) the NaN spoils the score
    r = run_rnn([config, "++stop_on_nonfinite_train_score", "False"], cwd=tmp_path)
    assert r.returncode == 0 and "score: nan" in r.stdout, r.stdout + r.stderr
    r = run_rnn([config, "++debug_add_check_numerics_ops", "1"], cwd=tmp_path)
    assert_one_paragraph(r, "debug_add_check_numerics_ops: Detected Infinity or NaN in output 0 of graph op")
    assert "(in the train_step)" in r.stderr and "train epoch 1, finished" not in r.stdout
