"""The RETURNN comparison scripts' verdicts and exit codes, on made-up results (RETURNN is not needed):
a difference beyond the tolerance they print is a MISS and exit status 1, and the tests' fixtures are
replaced only when asked and only after every case passed (``benchmarks/returnn_verdicts.py``)."""
from __future__ import annotations

import json
import sys

import numpy as np

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as scripts do

import bench_returnn_hybrid  # noqa: E402
import bench_returnn_parity  # noqa: E402
from returnn_verdicts import parity_misses, summary, update_fixtures, within_tolerance  # noqa: E402

TOLERANCES = dict(rtol=bench_returnn_parity.PARAM_RTOL, atol=bench_returnn_parity.PARAM_ATOL,
                  change_rtol=bench_returnn_parity.DEV_CHANGE_RTOL)
AFTER = {"lstm/rec/W": np.array([[1.0, -0.5], [0.25, 2.0]], np.float32), "output/b": np.array([0.1, 0.0])}


def test_an_update_within_the_tolerance_passes_and_one_beyond_it_misses_naming_what():
    close = {"lstm/rec/W": AFTER["lstm/rec/W"] * (1 + 9e-6), "output/b": AFTER["output/b"] - 1e-6}
    assert parity_misses(AFTER, close, -0.1, -0.1005, **TOLERANCES) == []
    off = {**close, "lstm/rec/W": AFTER["lstm/rec/W"] + np.array([[0, 0], [0, 3e-5]], np.float32)}
    assert parity_misses(AFTER, off, -0.1, -0.1, **TOLERANCES) == [
        "lstm/rec/W[1, 1]: 2.00003, RETURNN's 2 (beyond rtol 1e-05, atol 1e-06)"]
    nan = {**close, "output/b": np.array([np.nan, 0.0])}
    assert parity_misses(AFTER, nan, -0.1, -0.1, **TOLERANCES)[0].startswith("output/b[0]: nan")
    assert parity_misses(AFTER, close, -0.1, -0.102, **TOLERANCES) == [
        "dev-score change -0.102000, RETURNN's -0.100000 (beyond 1 %)"]
    nan_change = parity_misses(AFTER, close, -0.1, float("nan"), **TOLERANCES)
    assert nan_change[0].startswith("dev-score change +nan"), nan_change
    renamed = {"lstm/rec/W": close["lstm/rec/W"], "output/bias": close["output/b"]}
    assert parity_misses(AFTER, renamed, -0.1, -0.1, **TOLERANCES) == [
        "parameters differ (RETURNN's only: ['output/b'], the engine's only: ['output/bias'])"]


def parity_run(folder, changes: dict[str, tuple[float, float]]) -> None:
    """What bench_returnn_parity.py leaves in its folder: RETURNN's parameters after the update and its
    dev scores (``changes``: per case RETURNN's dev score before and after)."""
    cases = {name: {"ranks": 1, "dev_score_before": before, "dev_score_after": after}
             for name, (before, after) in changes.items()}
    (folder / "cases.json").write_text(json.dumps({"cases": cases}))
    for name in changes:
        np.savez(folder / f"{name}.after.npz", **AFTER)


def test_the_parity_table_says_miss_and_the_run_exits_1_when_a_case_is_beyond_the_tolerance(tmp_path):
    parity_run(tmp_path, {"ce_sgd": (2.0, 1.9), "ce_adam": (2.0, 1.95)})
    engine = {"ce_sgd": {"params": dict(AFTER), "dev_score_before": 2.0, "dev_score_after": 1.9},
              "ce_adam": {"params": {**AFTER, "output/b": AFTER["output/b"] + 1e-3},
                          "dev_score_before": 2.0, "dev_score_after": 1.95}}
    lines, missed = bench_returnn_parity.table(str(tmp_path), ["ce_sgd", "ce_adam"], engine)
    assert missed == ["ce_adam"]
    assert lines[2].startswith("| ce_sgd | 1 | 0.0e+00 | 0.0e+00 | -0.100000 | -0.100000 | 1.00000 | PASS |")
    assert lines[3].startswith("| ce_adam | 1 | 1.0e-03 |") and "| MISS: output/b[" in lines[3], lines[3]
    assert summary(["ce_sgd", "ce_adam"], missed, "tol") == (
        "MISS: 1 of 2 case(s) beyond the tolerance (tol): ce_adam", 1)
    assert summary(["ce_sgd"], [], "tol") == ("PASS: all 1 case(s) within the tolerance (tol)", 0)


def test_the_fixtures_change_only_after_every_case_passed(tmp_path):
    work, fixtures = tmp_path / "run", tmp_path / "fixtures"
    work.mkdir()
    fixtures.mkdir()
    (fixtures / "cases.json").write_text(json.dumps({"made_by": "old", "cases": {"a": 1, "b": 2}}))
    (fixtures / "a.npz").write_text("old a")
    (work / "cases.json").write_text(json.dumps({"made_by": "new", "cases": {"a": 10}}))
    (work / "a.npz").write_text("new a")
    before = {p.name: p.read_text() for p in fixtures.iterdir()}
    assert update_fixtures(1, str(work), ["a.npz"], str(fixtures)) == \
        f"{fixtures} left as it was: a comparison missed"
    assert {p.name: p.read_text() for p in fixtures.iterdir()} == before
    assert update_fixtures(0, str(work), ["a.npz"], str(fixtures)) == f"updated 2 file(s) in {fixtures}"
    assert (fixtures / "a.npz").read_text() == "new a"
    assert json.loads((fixtures / "cases.json").read_text()) == {"made_by": "new", "cases": {"a": 10, "b": 2}}
    assert sorted(p.name for p in fixtures.iterdir()) == ["a.npz", "cases.json"]  # no temp file left


def test_the_parity_script_touches_the_fixtures_only_with_update_fixtures_and_all_cases_passing(
        tmp_path, monkeypatch, capsys):
    """main() end to end with RETURNN's and the engine's side made up: by default its files go to a
    temporary folder; a MISS is exit 1 and leaves the fixtures; --update-fixtures after a PASS replaces
    them."""
    import os

    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    (fixtures / "cases.json").write_text(json.dumps({"cases": {"ctc_sgd": {"kept": True}}}))
    engine_after = {"params": dict(AFTER)}

    def run_returnn(python, names, out, tmp):
        np.savez(os.path.join(out, "batches.npz"), data=np.zeros(1))
        for name in names:
            np.savez(os.path.join(out, f"{name}.after.npz"), **AFTER)
            for suffix in (".index", ".data-00000-of-00001"):
                open(os.path.join(out, name + suffix), "w").write("RETURNN's checkpoint")
        return {name: {"dev_score_before": 2.0, "dev_score_after": 1.9} for name in names}

    def engine_results(out, names, tmp):
        return {name: {**engine_after, "dev_score_before": 2.0, "dev_score_after": 1.9} for name in names}

    for name, value in {"FIXTURES": str(fixtures), "returnn_python": lambda: sys.executable,
                        "returnn_versions": lambda python: {"returnn": "x", "tensorflow": "y"},
                        "run_returnn": run_returnn, "engine_results": engine_results}.items():
        monkeypatch.setattr(bench_returnn_parity, name, value)

    def main(*args: str) -> int:
        monkeypatch.setattr(sys, "argv", ["bench_returnn_parity.py", "--cases", "ce_sgd", *args])
        return bench_returnn_parity.main()

    before = sorted(p.name for p in fixtures.iterdir())
    assert main() == 0 and sorted(p.name for p in fixtures.iterdir()) == before  # no --update-fixtures
    assert capsys.readouterr().out.splitlines()[-1].startswith("PASS: all 1 case(s) within the tolerance")
    engine_after["params"] = {**AFTER, "output/b": AFTER["output/b"] + 1e-3}
    assert main("--update-fixtures") == 1 and sorted(p.name for p in fixtures.iterdir()) == before
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "MISS: 1 of 1 case(s) beyond the tolerance (parameters rtol 1e-05, atol 1e-06; dev-score change 1 "
        "%): ce_sgd", f"{fixtures} left as it was: a comparison missed"]
    engine_after["params"] = dict(AFTER)
    assert main("--update-fixtures") == 0
    assert sorted(p.name for p in fixtures.iterdir()) == [
        "batches.npz", "cases.json", "ce_sgd.after.npz", "ce_sgd.data-00000-of-00001", "ce_sgd.index"]
    assert sorted(json.loads((fixtures / "cases.json").read_text())["cases"]) == ["ce_sgd", "ctc_sgd"]


def test_the_checkpoint_comparison_misses_beyond_its_tolerance_and_on_nan():
    assert within_tolerance([3e-7, 1e-5], 1e-5) == (True, 1e-5)
    assert within_tolerance([3e-7, 2e-5], 1e-5) == (False, 2e-5)
    ok, largest = within_tolerance([float("nan"), 0.0], 1e-5)
    assert not ok and np.isnan(largest)
    ok, largest = within_tolerance([0.0, float("nan")], 1e-5)  # wherever the NaN is
    assert not ok and np.isnan(largest)


def test_the_hybrid_benchmark_exits_1_when_an_epoch_misses(capsys):
    engine = [[2.44, 2.39], [2.45, 2.38], [2.46, 2.40]]
    returnn = [[2.443, 2.391], [2.452, 2.380], [2.448, 2.395]]
    assert bench_returnn_hybrid.verdicts({"engine": engine, "returnn": returnn}, 2) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(
        "PASS: epoch 1: each side's median dev score lies within the other's seed spread [engine 2.4500 "
        "(2.4400..2.4600); RETURNN 2.4480 (2.4430..2.4520), 3 seeds each]")
    apart = [[2.44, 2.30], [2.45, 2.31], [2.46, 2.32]]
    assert bench_returnn_hybrid.verdicts({"engine": apart, "returnn": returnn}, 2) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PASS: epoch 1") and lines[1].startswith("MISS: epoch 2"), lines
