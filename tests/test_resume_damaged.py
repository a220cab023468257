"""A damaged newest checkpoint does not end a job for good: a truncated, overwritten or incomplete one is
named in a warning and the one before it taken (mid-epoch -> the newest epoch checkpoint, epoch N -> N-1,
within the run of the newest); an I/O error that may pass (EIO, ESTALE, ETIMEDOUT) ends the start with exit
code 1, on which supervise restarts; a valid HDF5 file that is no checkpoint of this engine, or one of
another network shape, is a clear error. The files are the real checkpoints of one run stopped in
epoch 3 (module fixture), damaged per test. The 2-rank versions are in test_resume_runs.py."""
from __future__ import annotations

import errno
import os
import re
import shutil
import sys

import h5py
import numpy as np
import pytest

from engine.config.loader import Config
from engine.runtime.errors import NOT_RESTARTABLE_EXIT_CODES, ConfigError, TransientIOError
from engine.training.checkpoints import reading as checkpoint_read
from engine.training.checkpoints.resume import ResumePoint, choose_resume_point
from engine.training.update.lr_history import learning_rate_file, read_history_file
from helpers import ROOT, run

pytestmark = pytest.mark.tf_latest
SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")


def values(folder, **overrides) -> dict:
    config = {
        "train": {"class": "Task12AXDataset", "num_seqs": 40, "fixed_random_seed": 1,
                  "seq_ordering": "laplace:4"},
        "dev": {"class": "Task12AXDataset", "num_seqs": 8, "fixed_random_seed": 2},
        "network": {"lstm": {"class": "rec", "unit": "lstm", "n_out": 6},
                    "output": {"class": "softmax", "loss": "ce", "from": "lstm"}},
        "optimizer": {"class": "adam"}, "learning_rate": 0.02, "model": str(folder / "net"),
        "batch_size": 200, "max_seqs": 4, "num_epochs": 3, "log_verbosity": 3,
        "checkpoint_interval": "3 steps",
    }
    return dict(config, **overrides)


def train(folder, config: dict, *options: str, expect: int = 0) -> str:
    result = run([sys.executable, SCRIPT, str(folder), repr(config), *options], timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == expect, output
    return output


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """net.001, net.002, net.003.step26 (10 steps an epoch, stopped after the 6th of epoch 3), the
    learning-rate file."""
    folder = tmp_path_factory.mktemp("stopped")
    train(folder, values(folder), "fail=SIGTERM", "fail_rank=0", "fail_step=25", expect=99)
    assert sorted(os.listdir(folder)) == ["net.001", "net.002", "net.003.step26", "net.learning_rates",
                                          "tensorboard"]
    return folder


@pytest.fixture
def folder(stopped_run, tmp_path):
    shutil.copytree(stopped_run, tmp_path / "run")
    return tmp_path / "run"


def choose(folder, **overrides):
    config = Config(values(folder, **overrides))
    return choose_resume_point(config, learning_rate_file(config))


def truncate(path, keep: float = 0.5) -> None:
    data = open(path, "rb").read()
    open(path, "wb").write(data[:int(len(data) * keep)])


def test_the_newest_checkpoint_is_taken_when_it_is_good(folder):
    point, stored = choose(folder)
    assert point == ResumePoint(3, str(folder / "net.003.step26"), mid_epoch=True, run_id=stored.run_id)
    assert stored.run_id and stored.global_step == 26


def test_a_truncated_mid_epoch_checkpoint_falls_back_to_the_newest_epoch_checkpoint(folder, capsys):
    truncate(folder / "net.003.step26")
    point, stored = choose(folder)
    assert (point.start_epoch, point.path, point.mid_epoch) == (3, str(folder / "net.002"), False)
    warning = capsys.readouterr().err
    assert f"Checkpoint '{folder / 'net.003.step26'}' cannot be used: it is truncated (" in warning, warning
    assert "Falling back to the checkpoint before it." in warning


@pytest.mark.parametrize("remove, why", [("group:resume", "it has no group 'resume'"),
                                         ("group:optimizer", "it has no group 'optimizer'"),
                                         ("attr:learning_rate", "it has no attribute 'learning_rate'")])
def test_a_mid_epoch_checkpoint_missing_a_part_falls_back(folder, capsys, remove, why):
    kind, name = remove.split(":")
    with h5py.File(folder / "net.003.step26", "a") as f:
        del (f if kind == "group" else f.attrs)[name]
    point, _ = choose(folder)
    assert (point.start_epoch, point.path) == (3, str(folder / "net.002"))
    assert f"'{folder / 'net.003.step26'}' cannot be used: {why}." in capsys.readouterr().err


def test_garbage_in_the_newest_epoch_checkpoint_falls_back_to_the_epoch_before(folder, capsys):
    os.remove(folder / "net.003.step26")
    (folder / "net.002").write_bytes(np.random.default_rng(1).bytes(5000))
    point, _ = choose(folder)
    assert (point.start_epoch, point.path) == (2, str(folder / "net.001"))
    assert "net.002' cannot be used: it is not an HDF5 file" in capsys.readouterr().err


def test_without_any_usable_checkpoint_one_error_names_each(folder):
    truncate(folder / "net.003.step26")
    truncate(folder / "net.002", keep=0.001)  # its header survives, not the rest
    (folder / "net.001").write_bytes(b"")
    with pytest.raises(ConfigError) as error:
        choose(folder)
    message = str(error.value)
    assert message.startswith(f"No usable checkpoint under the model prefix '{folder / 'net'}': "), message
    for part in ("net.003.step26': it is truncated (", "net.002': it cannot be read as HDF5 (",
                 "net.001': it is not an HDF5 file"):
        assert part in message, message
    assert "move_old_checkpoints" in message


def test_a_valid_hdf5_file_that_is_no_checkpoint_is_a_clear_error(folder):
    os.remove(folder / "net.003.step26")
    with h5py.File(folder / "net.002", "w") as f:  # e.g. a corpus written under the model prefix
        f["inputs"] = np.zeros((3, 2))
        f["seqLengths"] = np.ones((3, 2), np.int32)
    with pytest.raises(ConfigError, match="is an HDF5 file but not a checkpoint of this engine") as error:
        choose(folder)
    assert str(folder / "net.002") in str(error.value) and "inputs, seqLengths" in str(error.value)
    assert not isinstance(error.value, checkpoint_read.CheckpointDamaged)  # no fallback past it


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ETIMEDOUT, "in the message"])
def test_an_io_error_that_may_pass_is_a_restartable_failure(folder, monkeypatch, code):
    real = checkpoint_read.h5py.File

    def file(path, mode="r", *args, **kwargs):
        if str(path).endswith("net.003.step26"):
            if code == "in the message":  # how h5py reports some failed reads: errno only in the text
                raise OSError(f"Can't read data (file read failed: time = ..., filename = '{path}', "
                              "errno = 5, error message = 'Input/output error')")
            raise OSError(code, os.strerror(code))
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint_read.h5py, "File", file)
    with pytest.raises(TransientIOError) as error:
        choose(folder)
    assert not isinstance(error.value, ConfigError)
    assert error.value.exit_code == 1 and 1 not in NOT_RESTARTABLE_EXIT_CODES
    assert f"Checkpoint '{folder / 'net.003.step26'}' could not be read: " in str(error.value)
    assert "supervise" in str(error.value)


def test_the_fallback_stays_within_the_run_of_the_newest_checkpoint(folder, capsys):
    """net.002 carries another run's id (files copied in by hand): the damaged mid-epoch checkpoint falls
    back to net.001, which belongs to its run."""
    with h5py.File(folder / "net.003.step26", "a") as f:
        del f["resume"]
        newest_run = f.attrs["run_id"]
    with h5py.File(folder / "net.002", "a") as f:
        f.attrs["run_id"] = "20240101-000000-abcdef"
    point, stored = choose(folder)
    assert (point.path, stored.run_id, point.run_id) == (str(folder / "net.001"), newest_run, newest_run)
    assert "net.002' belongs to another run (run id 20240101-000000-abcdef)" in capsys.readouterr().err


def test_checkpoints_from_before_run_ids_are_taken_and_the_run_gets_one(folder):
    for name in ("net.001", "net.002", "net.003.step26"):
        with h5py.File(folder / name, "a") as f:
            del f.attrs["run_id"]
    (folder / "net.003.step26").write_bytes(b"")  # the fallback accepts old ones too
    point, stored = choose(folder)
    assert point.path == str(folder / "net.002") and stored.run_id is None and point.run_id


def test_a_run_resumes_past_a_truncated_checkpoint_and_finishes(folder):
    truncate(folder / "net.003.step26")
    output = train(folder, values(folder))
    assert output.count("net.003.step26' cannot be used: it is truncated") == 1, output
    assert "resuming after epoch 2 from" in output and "Traceback" not in output, output
    assert sorted(os.listdir(folder))[:2] == ["net.001", "net.002"] and os.path.isfile(folder / "net.003")
    assert not os.path.exists(folder / "net.003.step26")  # the first save of the resumed run removed it


def test_a_checkpoint_of_another_network_shape_is_a_clear_error_not_a_fallback(folder):
    wider = values(folder)
    wider["network"] = dict(wider["network"], lstm={"class": "rec", "unit": "lstm", "n_out": 9})
    output = train(folder, wider, expect=2)
    expected = f"Checkpoint '{folder / 'net.003.step26'}' does not match the network (parameters)"
    assert expected in output, output
    assert "Falling back" not in output and "Traceback" not in output, output


@pytest.mark.slow  # several training runs (kill or stop, then resume)
def test_a_damaged_learning_rate_file_is_named_with_the_way_out_and_removing_it_resumes(folder):
    """The learning-rate file may be a user's edit, so a bad one is not overwritten unasked (exit 2); the
    message says that the checkpoint holds the history too, and without the file the resume finishes."""
    lr_file = folder / "net.learning_rates"
    lr_file.write_text(lr_file.read_text()[: len(lr_file.read_text()) // 2])
    output = train(folder, values(folder), expect=2)
    assert f"Learning-rate file '{lr_file}' has a syntax error" in output, output
    assert f"remove it: the resume then takes the history stored in {folder / 'net.003.step26'}" in output
    lr_file.unlink()
    output = train(folder, values(folder))
    assert f"resuming in epoch 3 at global step 26 from {folder / 'net.003.step26'}" in output, output
    assert set(read_history_file(str(lr_file))) == {1, 2, 3}  # rewritten from the checkpoint's copy


def keep_score_columns(path, width: int) -> None:
    """Cut the mid-epoch score sums to their first ``width`` columns (3: as written before the input
    frames were counted)."""
    with h5py.File(path, "a") as f:
        scores = f["resume/scores"][()]
        assert scores.shape == (1, 4)  # loss, error, count, input frames
        del f["resume/scores"]
        f["resume/scores"] = scores[:, :width]


def epoch_lines(output: str, epoch: int) -> tuple[str, str]:
    """The epoch's frame count and its score line."""
    frames = re.search(rf"^train epoch {epoch}: [\d.]+ frames/sec \((\d+) frames", output, re.M)
    score = re.search(rf"^epoch {epoch} score: (\S+) error: (\S+) ", output, re.M)
    assert frames and score, output
    return frames.group(1), score.groups()


@pytest.mark.slow  # several training runs (kill or stop, then resume)
def test_a_mid_epoch_checkpoint_without_input_frames_resumes_as_one_with_them(folder, tmp_path):
    """Older checkpoints hold [loss, error, count]; with ce the input frames equal the count, so the
    resumed epoch reports what a resume from a current checkpoint reports: all the epoch's frames."""
    from engine.datasets import create_dataset

    old = tmp_path / "old"
    shutil.copytree(folder, old)
    keep_score_columns(old / "net.003.step26", 3)
    current, before = train(folder, values(folder)), train(old, values(old))
    assert "resuming in epoch 3 at global step 26" in before and "Traceback" not in before, before
    assert epoch_lines(before, 3) == epoch_lines(current, 3)
    dataset = create_dataset(values(folder)["train"])
    dataset.init_seq_order(3)
    assert int(epoch_lines(before, 3)[0]) == dataset.epoch_seq_lengths()[:, 0].sum()


def test_mid_epoch_scores_of_another_width_are_a_damaged_checkpoint(folder, capsys):
    keep_score_columns(folder / "net.003.step26", 2)
    point, _ = choose(folder)
    assert (point.start_epoch, point.path) == (3, str(folder / "net.002"))
    err = capsys.readouterr().err
    assert "net.003.step26' cannot be used: its group 'resume' has 'scores' of shape (1, 2), not (ranks, 4)" \
        in err, err
