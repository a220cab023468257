"""A train epoch that runs no step ends the training with the numbers (batches, ranks) and exit code 3,
before a NaN score reaches the log, the learning-rate file or a checkpoint; and the warning that
``stop_on_nonfinite_train_score = False`` lets training go on appears only when the key is False
(``engine/training/epoch_end.py``)."""
from __future__ import annotations

import math

import pytest

from engine.runtime import log
from engine.runtime.errors import DATA_ERROR_EXIT_CODE, DataError, NonFiniteTrainScore
from engine.training.epoch_end import check_train_score, no_step_error
from helpers import ROOT, run_mpi


def test_the_no_step_error_gives_the_batches_and_ranks():
    two = no_step_error(1, batches=1, ranks=2, num_seqs=4, rank=0)
    assert isinstance(two, DataError) and two.exit_code == DATA_ERROR_EXIT_CODE
    assert str(two).startswith("train epoch 1 ran no step: the train set gives 1 batch for 2 ranks "
                               "(horovod_dataset_distribution 'shard'"), str(two)
    assert "so rank 1 got none and no rank trained" in str(two) and "at least 2 batches" in str(two)
    assert two.agreed and not two.quiet
    three = no_step_error(4, batches=1, ranks=3, num_seqs=2, rank=2)
    assert "so ranks 1 to 2 got none" in str(three) and three.quiet  # rank 2: rank 0 says it
    alone = no_step_error(2, batches=0, ranks=1, num_seqs=0, rank=0)
    assert str(alone).startswith("train epoch 2 ran no step: the train set gives 0 batches (0 sequences")


def test_the_key_false_warns_and_goes_on_and_the_key_true_stops(capsys):
    log.init(verbosity=log.INFO)
    capsys.readouterr()
    check_train_score(3, math.nan, 0.0, stop_on_nonfinite=False, rank=0)
    assert "train epoch 3: the score is nan (Inf/NaN); stop_on_nonfinite_train_score = False, so training " \
           "goes on" in capsys.readouterr().err
    with pytest.raises(NonFiniteTrainScore) as caught:
        check_train_score(3, math.nan, 0.0, stop_on_nonfinite=True, rank=0)
    assert "train epoch 3 ends with the score nan, though no step met an Inf or NaN: the epoch counted 0 " \
           "target frames" in str(caught.value)
    check_train_score(3, 1.25, 40.0, stop_on_nonfinite=True, rank=0)
    check_train_score(3, math.inf, 40.0, stop_on_nonfinite=False, rank=1)  # rank 0 warns, not the others
    output = capsys.readouterr()
    assert "stop_on_nonfinite_train_score = False" not in output.out + output.err, output


@pytest.mark.mpi
def test_two_ranks_and_one_train_batch_stop_with_the_numbers_and_write_no_nan(tmp_path):
    """The train set fits one batch; sharded over 2 ranks, rank 1 gets none, so epoch 1 runs no step.
    Before, it reported "score: nan", claimed stop_on_nonfinite_train_score was False and wrote the NaN
    into the learning-rate file and a checkpoint."""
    config = tmp_path / "one_batch.config"
    config.write_text(
        "#!rnn.py\n"
        "train = {'class': 'DummyDataset', 'input_dim': 3, 'output_dim': 2, 'num_seqs': 4, 'seq_len': 3}\n"
        "network = {'output': {'class': 'softmax', 'loss': 'ce'}}\n"
        "batch_size = 1000\nmax_seqs = 100\nnum_epochs = 1\nlearning_rate = 0.1\n"
        f"model = {str(tmp_path / 'net')!r}\nlearning_rate_file = {str(tmp_path / 'lr.txt')!r}\n"
        "use_horovod = True\ndistributed_backend = 'mpi'\nlog_verbosity = 4\n")
    r = run_mpi(2, [str(ROOT / "rnn.py"), str(config)], timeout=240)
    output = r.stdout + r.stderr
    assert r.returncode == DATA_ERROR_EXIT_CODE, output
    assert output.count("ran no step") == 1, output  # rank 0 says it
    assert "train epoch 1 ran no step: the train set gives 1 batch for 2 ranks" in output, output
    assert "so rank 1 got none and no rank trained" in output, output
    assert "stop_on_nonfinite_train_score = False" not in output and "score: nan" not in output, output
    assert "Traceback" not in output and "Another rank failed" not in output, output
    lr_file = tmp_path / "lr.txt"
    assert not lr_file.exists() or "nan" not in lr_file.read_text().lower(), lr_file.read_text()
    assert not list(tmp_path.glob("net.*")), sorted(p.name for p in tmp_path.iterdir())
