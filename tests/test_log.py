"""Logging: verbosity, log files, per-rank file names, rank prefixes; mpirun starts rnn.py on every rank."""
import pytest

from engine.runtime import log
from helpers import ROOT, run_mpi

pytestmark = pytest.mark.tf_latest


@pytest.fixture(autouse=True)
def reset_log():
    yield
    log.init()


def test_verbosity_filters_and_files_receive_messages(tmp_path, capsys):
    path = tmp_path / "run.log"
    log.init(verbosity=3, files=[str(path)])
    log.info("epoch line")
    log.debug("detail line")
    log.error("bad thing")
    log.close()
    out, err = capsys.readouterr()
    assert "epoch line" in out and "detail line" not in out and "bad thing" in err
    assert path.read_text().splitlines() == ["epoch line", "bad thing"]


def test_rank_file_name():
    assert log.rank_log_file_name("out/train.log", 1, 4) == "out/train.horovod-1-4.log"
    assert log.rank_log_file_name("train", 0, 2) == "train.horovod-0-2"


def test_other_ranks_print_only_warnings_prefixed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    log.init(verbosity=5, files=[str(tmp_path / "t.log")], per_rank_files=True)
    log.info("progress")
    log.warning("careful\nsecond line")
    log.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "[rank 1] careful\n[rank 1] second line\n"
    assert "progress" in (tmp_path / "t.horovod-1-2.log").read_text()


def test_all_ranks_stdout_option(capsys, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    log.init(verbosity=3, all_ranks_stdout=True)
    log.info("progress")
    assert capsys.readouterr().out == "[rank 1] progress\n"


@pytest.mark.mpi
@pytest.mark.version_independent
def test_mpirun_starts_rnn_py_on_both_ranks(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("task = 'no_such_task'\nlog_verbosity = 4\n")
    r = run_mpi(2, [str(ROOT / "rnn.py"), str(cfg), "++use_horovod", "1", "++log", str(tmp_path / "t.log")],
                timeout=60)
    assert r.returncode != 0
    for rank in (0, 1):
        text = (tmp_path / f"t.horovod-{rank}-2.log").read_text()
        assert "starting" in text and "task 'no_such_task'" in text
    # a config error is the same on every rank: printed once, by rank 0, without a traceback
    assert r.stderr.count("rnn.py: error:") == 1 and "Traceback" not in r.stderr
