"""The step timeline: Chrome trace events per rank, a loadable file after a crash, the merge of ranks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from engine.report import timeline
from engine.runtime.errors import ConfigError, EngineError
from helpers import ROOT, child_env, run, run_mpi

pytestmark = [pytest.mark.tf_latest, pytest.mark.usefixtures("timeline_stopped")]


def spans_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["ph"] == "X"]


def test_spans_are_complete_events_with_sizes(tmp_path):
    path = str(tmp_path / "t.json")
    timeline.start(path, rank=1, size=2)
    assert timeline.enabled()
    with timeline.span("gradient allreduce", timeline.ALLREDUCE, bytes=4096, tensors=3):
        time.sleep(0.01)
    t0 = timeline.now()
    t1 = t0 + 0.0025
    timeline.record("step signal", timeline.STEP_SIGNAL, t0, t1, bytes=8)
    part = timeline.part_path(path, 1)
    assert part == str(tmp_path / "t.rank1.json")
    events = json.loads(open(part).read())  # strict JSON while the run goes on
    meta = {e["name"]: e for e in events if e["ph"] == "M"}
    assert meta["process_name"]["pid"] == 1 and meta["process_name"]["args"]["name"].startswith("rank 1 of 2")
    assert meta["process_sort_index"]["args"] == {"sort_index": 1}
    allreduce, signal_span = spans_of(events)
    assert allreduce["cat"] == "allreduce" and allreduce["pid"] == 1
    assert allreduce["args"] == {"bytes": 4096, "tensors": 3}
    assert allreduce["dur"] >= 10_000  # microseconds
    assert abs(allreduce["ts"] / 1e6 - time.time()) < 60  # wall-clock microseconds
    assert signal_span["dur"] == pytest.approx(2500, abs=0.2)
    assert signal_span["ts"] - allreduce["ts"] >= allreduce["dur"]


def test_a_raising_block_is_recorded_with_its_exception(tmp_path):
    path = str(tmp_path / "t.json")
    timeline.start(path)
    with pytest.raises(KeyError):
        with timeline.span("save", timeline.CHECKPOINT, path="m.001"):
            raise KeyError("x")
    timeline.stop()
    (span,) = spans_of(json.load(open(timeline.part_path(path, 0))))
    assert span["args"] == {"path": "m.001", "exception": "KeyError"}


def test_off_costs_a_shared_no_op(tmp_path):
    assert not timeline.enabled()
    assert timeline.span("a", timeline.STEP, bytes=1) is timeline.span("b", timeline.EVAL)
    with timeline.span("a", timeline.STEP):
        pass
    timeline.record("a", timeline.STEP, 0.0, 1.0)
    timeline.start(str(tmp_path / "t.json"))
    timeline.stop()
    timeline.record("after stop", timeline.STEP, 0.0, 1.0)
    assert spans_of(json.load(open(tmp_path / "t.rank0.json"))) == []


def test_path_from_config_then_environment():
    assert timeline.path_from("cfg.json", {"ENGINE_TIMELINE": "env.json"}) == "cfg.json"
    assert timeline.path_from(None, {"ENGINE_TIMELINE": "env.json"}) == "env.json"
    assert timeline.path_from(None, {}) is None
    assert timeline.path_from("", {"ENGINE_TIMELINE": "env.json"}) is None


CRASHING_RANK = """
import os, sys, signal
from engine.report import timeline
timeline.start({path!r}, rank=0, size=1)
for i in range(5):
    with timeline.span("step", timeline.STEP, step=i):
        pass
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_rank_leaves_a_loadable_trace_that_merges(tmp_path):
    path = str(tmp_path / "t.json")
    proc = subprocess.run([sys.executable, "-c", CRASHING_RANK.format(root=str(ROOT), path=path)],
                          env=child_env(), timeout=60)
    assert proc.returncode == -signal.SIGKILL
    part = timeline.part_path(path, 0)
    assert [e["args"]["step"] for e in spans_of(json.load(open(part)))] == [0, 1, 2, 3, 4]
    with open(part, "rb+") as f:  # a rank killed inside its last write: the bracket gone, a line torn
        f.seek(-3, 2)
        f.truncate()
        f.write(b',\n{"name": "step", "cat": "st')
    result = timeline.merge(path)
    assert (result.ranks, result.missing_ranks, result.events, result.torn_lines) == ([0], [], 5, 1)
    assert len(spans_of(json.load(open(path)))) == 5
    assert not (tmp_path / "t.rank0.json").exists()


def test_merge_orders_spans_and_reports_missing_ranks(tmp_path):
    path = str(tmp_path / "run.trace.json")
    for rank in (0, 2):
        timeline.start(path, rank=rank, size=3)
        timeline.record("step", timeline.STEP, 10.0 - rank, 11.0 - rank, rank=rank)
    timeline.stop()
    assert timeline.part_ranks(path) == [0, 2]
    result = timeline.merge(path, size=3, keep_parts=True)
    assert result.ranks == [0, 2] and result.missing_ranks == [1]
    events = json.load(open(path))
    assert [e["pid"] for e in spans_of(events)] == [2, 0]
    assert sorted(e["pid"] for e in events if e["name"] == "process_name") == [0, 2]
    assert (tmp_path / "run.trace.rank0.json").exists()


def test_merge_without_parts_is_a_clear_error(tmp_path):
    with pytest.raises(EngineError, match=r"t\.json': no part files.*t\.rank0\.json"):
        timeline.merge(str(tmp_path / "t.json"))


@pytest.mark.mpi
@pytest.mark.version_independent  # the trace files of two processes
def test_two_ranks_end_in_one_trace(tmp_path):
    path = tmp_path / "timeline.json"
    proc = run_mpi(2, [str(ROOT / "tests" / "mpi_scripts" / "timeline_ranks.py"), str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "merged ranks [0, 1], 30 spans, missing []" in proc.stdout
    events = json.load(open(path))
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == [0, 1] and names[1].startswith("rank 1 of 2")
    for rank in (0, 1):
        categories = {e["cat"] for e in spans_of(events) if e["pid"] == rank}
        assert categories == set(timeline.CATEGORIES)
    allreduces = [e for e in spans_of(events) if e["cat"] == "allreduce"]
    assert {e["args"]["result"] for e in allreduces} == {1, 3, 5}
    assert all(e["args"]["bytes"] == 8 for e in allreduces)
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_at_a_part_files_name_is_refused_and_not_followed(tmp_path, dangling):
    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text("precious")
    path = str(tmp_path / "t.json")
    os.symlink(victim, timeline.part_path(path, 1))
    with pytest.raises(ConfigError) as info:
        timeline.start(path, rank=1, size=2)
    assert str(info.value).startswith(f"Timeline part file '{timeline.part_path(path, 1)}' (rank 1's part "
                                      f"of timeline_file '{path}') is a symbolic link; it is not followed")
    assert not timeline.enabled()
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_text() == "precious"


def test_an_unwritable_part_file_is_a_clear_error(tmp_path):
    path = str(tmp_path / "t.json")
    os.mkdir(timeline.part_path(path, 0))  # a directory where the part file should go
    with pytest.raises(ConfigError, match=r"Cannot write timeline part file '.*t\.rank0\.json' \(rank 0's "
                                          r"part of timeline_file '.*'\): Is a directory \(EISDIR\)"):
        timeline.start(path)


@pytest.mark.mpi
@pytest.mark.version_independent
def test_a_two_rank_training_with_a_planted_part_file_link_ends_with_one_message(tmp_path):
    from test_engine_parallel import base_config

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = str(tmp_path / "timeline.json")
    os.symlink(victim, timeline.part_path(path, 1))
    config = base_config(use_horovod=True, distributed_backend="mpi", timeline_file=path)
    (tmp_path / "config.py").write_text("".join(f"{key} = {value!r}\n" for key, value in config.items()))
    proc = run_mpi(2, [str(ROOT / "rnn.py"), str(tmp_path / "config.py")])
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert output.count(f"[rank 1] rnn.py: error: Timeline part file '{timeline.part_path(path, 1)}'") == 1, \
        output
    assert "Traceback" not in output
    assert victim.read_text() == "precious"


def test_merge_tool_after_a_crash(tmp_path):
    path = str(tmp_path / "t.json")
    for rank in (0, 1):
        timeline.start(path, rank=rank, size=3)
        timeline.record("step", timeline.STEP, 1.0, 2.0)
    timeline.stop()
    tool = [sys.executable, str(ROOT / "tools" / "merge_timeline.py")]
    proc = run(tool + [path, "--ranks", "3"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"merge-timeline: wrote {path}: 2 spans from ranks 0, 1; missing ranks 2\n"
    assert len(spans_of(json.load(open(path)))) == 2 and sorted(os.listdir(tmp_path)) == ["t.json"]
    proc = run(tool + [str(tmp_path / "other.json")])
    assert proc.returncode == 1 and proc.stderr.startswith("merge-timeline: Timeline '")
    assert "Traceback" not in proc.stderr
