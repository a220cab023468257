"""Resume picks the right run: every checkpoint stores its run's id; a start that does not continue the
newest files (start_epoch 1, "auto" with nothing to continue, an explicit start_epoch N) over an earlier
run's files of epoch N and later -- checkpoints, mid-epoch ones, a learning-rate file holding those epochs --
is refused with one message naming them, or with move_old_checkpoints moves them aside; the learning-rate
file defaults to <model>.learning_rates, so it follows the model path. With 2 real ranks: one message and
exit code 2 for a refusal; a fallback past a damaged checkpoint taken by both ranks; an EIO while reading
ends the job with exit code 1, and supervise's restart resumes."""
from __future__ import annotations

import glob
import os
import sys

import h5py
import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.file_format import save_checkpoint
from engine.training.checkpoints.resume import choose_resume_point
from engine.training.update.lr_history import EpochData, format_history, learning_rate_file, read_history_file
from helpers import BIN, ROOT, mpirun_cmd, run, run_mpi

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")


def old_run(folder, epochs: int = 2, run_id: str = "20240101-000000-0a0b0c") -> None:
    """Files as an earlier run leaves them: epoch checkpoints, a mid-epoch one of the next epoch and the
    learning-rate file with the trained epochs."""
    weights = {"w": tf.Variable(np.ones(3, np.float32))}
    for epoch in range(1, epochs + 1):
        save_checkpoint(str(folder / f"net.{epoch:03d}"), weights, {}, epoch, 5 * epoch,
                        attrs={"kind": "epoch", "run_id": run_id})
    (folder / f"net.{epochs + 1:03d}.step{5 * epochs + 2}").write_bytes(b"")  # not read: named by the refusal
    history = {e: EpochData(0.1, {"dev_score": 1.0 / e}) for e in range(1, epochs + 1)}
    (folder / "net.learning_rates").write_text(format_history(history))


def choose(folder, **values):
    config = Config({"model": str(folder / "net"), **values})
    return choose_resume_point(config, learning_rate_file(config))


@pytest.mark.tf_latest
def test_the_learning_rate_file_follows_the_model_path_also_in_the_shipped_configs(tmp_path):
    assert learning_rate_file(Config({"model": "out/a/net"})) == "out/a/net.learning_rates"
    assert learning_rate_file(Config({"model": "out/a/net", "learning_rate_file": "lr"})) == "lr"
    assert learning_rate_file(Config({})) is None
    for config in sorted(glob.glob(str(ROOT / "configs" / "*.py"))):
        loaded = Config.from_sources([config], [("model", str(tmp_path / "m"))])
        assert learning_rate_file(loaded) == str(tmp_path / "m.learning_rates"), config


@pytest.mark.tf_latest
@pytest.mark.parametrize("start_epoch", [1, "auto"])
def test_a_fresh_start_over_an_earlier_runs_files_is_refused_naming_them(tmp_path, start_epoch):
    old_run(tmp_path)
    if start_epoch == "auto":  # the case of a second model path with a config's fixed learning-rate file
        for name in ("net.001", "net.002", "net.003.step12"):
            os.remove(tmp_path / name)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ConfigError) as error:
        choose(tmp_path, start_epoch=start_epoch)
    message = str(error.value)
    assert message.startswith(f"Training would start afresh under the model prefix '{tmp_path / 'net'}', "
                              "but an earlier run left files of epoch 1 and later: "), message
    if start_epoch == 1:
        names = ", ".join(str(tmp_path / name) for name in ("net.001", "net.002", "net.003.step12"))
        assert names + " and " in message, message
    assert f"the learning-rate file '{tmp_path / 'net.learning_rates'}' with epochs 1-2." in message
    assert 'start_epoch = "auto"' in message and "move_old_checkpoints = True" in message
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.tf_latest
def test_move_old_checkpoints_moves_the_earlier_run_into_one_folder(tmp_path, capsys):
    old_run(tmp_path)
    point, stored = choose(tmp_path, start_epoch=1, move_old_checkpoints=True)
    assert (point.start_epoch, point.path, stored) == (1, None, None)
    assert point.run_id and point.run_id != "20240101-000000-0a0b0c"
    (moved,) = [name for name in os.listdir(tmp_path) if name.startswith("net.old-")]
    assert os.listdir(tmp_path) == [moved]
    assert sorted(os.listdir(tmp_path / moved)) == ["net.001", "net.002", "net.003.step12",
                                                    "net.learning_rates"]
    assert capsys.readouterr().out.count(f"move_old_checkpoints: moved {tmp_path / 'net.001'}") == 1


@pytest.mark.tf_latest
def test_a_restart_at_epoch_n_is_refused_over_later_files_or_moves_them_keeping_the_history_before(tmp_path):
    old_run(tmp_path, epochs=3)
    expected = (r"Training would continue from '.*net.001' \(start_epoch = 2\), but an earlier run left "
                r"files of epoch 2 and later: .*net.002, .*net.003, .*net.004.step17 and the learning-rate "
                r"file .* with epochs 2-3.")
    with pytest.raises(ConfigError, match=expected):
        choose(tmp_path, start_epoch=2)
    point, stored = choose(tmp_path, start_epoch=2, move_old_checkpoints=True)
    assert (point.start_epoch, point.path) == (2, str(tmp_path / "net.001"))
    assert point.run_id == stored.run_id == "20240101-000000-0a0b0c"  # continuing epoch 1's run
    kept = sorted(name for name in os.listdir(tmp_path) if not name.startswith("net.old-"))
    assert kept == ["net.001", "net.learning_rates"]
    assert sorted(read_history_file(str(tmp_path / "net.learning_rates"))) == [1]
    (moved,) = glob.glob(str(tmp_path / "net.old-*" / "net.learning_rates"))
    assert sorted(read_history_file(moved)) == [1, 2, 3]


# ----- with 2 real ranks -----

def config(folder, **overrides) -> dict:
    values = {
        "train": {"class": "Task12AXDataset", "num_seqs": 48, "fixed_random_seed": 1,
                  "seq_ordering": "random"},
        "dev": {"class": "Task12AXDataset", "num_seqs": 8, "fixed_random_seed": 2},
        "network": {"lstm": {"class": "rec", "unit": "lstm", "n_out": 6},
                    "output": {"class": "softmax", "loss": "ce", "from": "lstm"}},
        "optimizer": {"class": "adam"}, "learning_rate": 0.02, "model": str(folder / "net"),
        "batch_size": 300, "max_seqs": 4, "num_epochs": 1, "log_verbosity": 3, "use_horovod": True,
        "distributed_backend": "mpi", "checkpoint_interval": 0,
    }
    return dict(values, **overrides)


def train(folder, values: dict, *options: str, expect: int = 0) -> str:
    result = run_mpi(2, [SCRIPT, str(folder), repr(values), *options], timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == expect, output
    assert "Traceback" not in output, output
    return output


def run_id(path) -> str:
    with h5py.File(path, "r") as f:
        return f.attrs["run_id"]


@pytest.mark.mpi
def test_two_ranks_refuse_a_fresh_start_over_an_earlier_run_then_move_it_aside(tmp_path):
    earlier = run([sys.executable, SCRIPT, str(tmp_path), repr(config(tmp_path, use_horovod=False))])
    assert earlier.returncode == 0, earlier.stdout + earlier.stderr  # one process: quicker, files alike
    first_run = run_id(tmp_path / "net.001")
    refused = train(tmp_path, config(tmp_path, start_epoch=1), expect=2)
    assert refused.count("Training would start afresh under the model prefix") == 1, refused
    assert f"{tmp_path / 'net.001'} and the learning-rate file '{tmp_path / 'net.learning_rates'}'" in refused
    moved = train(tmp_path, config(tmp_path, start_epoch=1, move_old_checkpoints=True))
    assert moved.count("move_old_checkpoints: moved") == 1, moved
    (old,) = glob.glob(str(tmp_path / "net.old-*" / "net.001"))
    assert run_id(old) == first_run != run_id(tmp_path / "net.001")


@pytest.mark.mpi
def test_two_ranks_fall_back_together_and_an_io_error_ends_with_1_which_supervise_restarts(tmp_path):
    values = config(tmp_path, num_epochs=2, checkpoint_interval=4)
    train(tmp_path, values, "fail=SIGUSR1", "fail_rank=1", "fail_step=9", expect=99)  # 6 steps an epoch
    (mid,) = glob.glob(str(tmp_path / "net.002.step*"))
    with h5py.File(mid, "a") as f:
        del f["resume"]
    command = mpirun_cmd(2, [sys.executable, SCRIPT, str(tmp_path), repr(values), "fail=eio", "fail_rank=0",
                             f"fail_once={tmp_path / 'eio'}"])
    result = run([str(BIN / "supervise"), "--backoff", "0.1", "--", *command], timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert output.count(f"Checkpoint '{mid}' could not be read: Input/output error (EIO)") == 1, output
    assert "exit code 1 (attempt 1 of 4); restart 1 of 3" in output, output
    assert output.count(f"Checkpoint '{mid}' cannot be used: it has no group 'resume'. Falling back") == 1
    assert output.count("resuming after epoch 1 from") == 1 and "Traceback" not in output, output
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    np.testing.assert_array_equal(ranks[0]["params"], ranks[1]["params"])  # both continued from net.001
    assert len(ranks[0]["after_step"]) == 6  # epoch 2 again, from its start
