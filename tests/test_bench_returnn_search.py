"""The pure functions of ``benchmarks/bench_returnn_search.py`` (corpus, batching, scoring, RETURNN's search
output) and of ``bench_returnn_attention_speed.py`` (the search span)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_returnn_attention_speed as speed  # noqa: E402
import bench_returnn_search as bench  # noqa: E402
from timing import Output  # noqa: E402


def test_synthetic_sequence_holds_each_label_and_ends_in_eos():
    prototypes = np.random.RandomState(0).standard_normal((6, 4))
    features, labels = bench.synthetic_sequence(np.random.RandomState(3), prototypes, noise=0.0)
    assert labels[-1] == 0 and 3 <= len(labels) - 1 <= 8
    assert np.all(labels[:-1] > 0) and np.all(labels[1:-1] != labels[:-2])
    assert len(features) % 6 == 0
    # without noise, the frames are the labels' prototypes in order, each held 12 or 18 frames
    starts = [0] + [t for t in range(1, len(features)) if not np.array_equal(features[t], features[t - 1])]
    holds = np.diff(starts + [len(features)])
    assert set(holds.tolist()) <= {12, 18}
    np.testing.assert_allclose(features[starts], prototypes[labels[:-1]], rtol=1e-6)


def test_edit_distance_and_error_rate():
    assert bench.edit_distance(list("kitten"), list("sitting")) == 3
    assert bench.edit_distance([], [1, 2]) == 2
    assert bench.error_rate([["a", "b"], ["c"]], [["a", "c"], ["c", "d", "e"]]) == pytest.approx(3 / 5)


def test_parse_search_output_reads_numpy_scalars():
    text = ("{\n'seq-0': {\n'decision': 'w1 w2',\n'output': [\n(np.float32(-1.5), 'w1 w2'),\n"
            "(-2.25, 'w1'),\n],\n},\n}\n")
    assert bench.parse_search_output(text) == {"seq-0": {"decision": "w1 w2",
                                                         "output": [(-1.5, "w1 w2"), (-2.25, "w1")]}}


def test_compare_counts_equal_decisions_beams_scores_and_wers():
    theirs = {"a": {"decision": "w1 w2", "output": [(-1.0, "w1 w2"), (-2.0, "w1")]},
              "b": {"decision": "w3", "output": [(-0.5, "w3"), (-0.7, "w4")]}}
    ours = {"a": {"decision": "w1 w2", "output": [(-1.00005, "w1 w2"), (-2.0002, "w1")]},
            "b": {"decision": "w4", "output": [(-0.5, "w4"), (-0.7, "w3")]}}
    result = bench.compare(ours, theirs, {"a": "w1 w2", "b": "w3"})
    assert (result["same"], result["seqs"], result["differing"]) == (1, 2, ["b"])
    assert result["score diff"] == pytest.approx(5e-5)
    assert result["beams same"] == 1 and result["beam score diff"] == pytest.approx(1e-4)
    assert result["wer returnn"] == 0.0 and result["wer engine"] == pytest.approx(1 / 3)
    assert bench.same_lines("a\nb\nc\n", "a\nx\nc") == 2


def test_search_rate_between_each_programs_lines():
    engine = Output("", [(1.0, "search: 300 sequences of dev"),
                         (7.0, "search 'decision', finished after 9 steps")])
    returnn = Output("", [(2.0, "Will write outputs to: x"), (5.0, "epoch 3 search, finished after 9 steps")])
    assert speed.search_rate(engine, "engine", 300) == pytest.approx(50.0)
    assert speed.search_rate(returnn, "returnn", 300) == pytest.approx(100.0)


def test_closing_lines_are_read_and_compared_in_returnns_format():
    theirs = "Search done. Num steps 3, Final: score 2.744618026785616 error ctc 0.84375 decision 0.953125\n"
    assert bench.closing_scores(theirs) == ({"": 2.744618026785616}, {"ctc": 0.84375, "decision": 0.953125})
    assert bench.closing_scores("Search done. Num steps 1, Final: score None error None") == ({}, {})
    ours = "Search done. Num steps 3, Final: score 2.7446 error ctc 0.84375 decision 0.953125"
    expected = (2.744618026785616 - 2.7446) / 2.744618026785616
    assert bench.compare_closing_lines(ours, theirs) == pytest.approx(expected)
    assert bench.compare_closing_lines("Final: score 2.7 error ctc 0.8", theirs) == float("inf")
    with pytest.raises(ValueError):
        bench.closing_scores("epoch 2 search, finished after 3 steps")


def test_the_coverage_function_is_written_into_the_config(tmp_path):
    choice = {"class": "choice", "target": "classes", "beam_size": 12, "from": "output_prob"}
    network = {"output": {"class": "rec", "from": [], "unit": {"output": choice}}}
    lines = [f"network = {bench.with_coverage_combine(network)!r}"]
    path = bench.write_config(str(tmp_path / "c.config"), lines)
    namespace: dict = {}
    exec(compile(open(path).read(), path, "exec"), namespace)
    choice = namespace["network"]["output"]["unit"]["output"]
    assert choice["custom_score_combine"] is namespace["coverage_score_combine"]
    assert choice["explicit_search_sources"] == ["prev:coverage", "coverage"]


def test_search_plan_reads_the_lists_a_log_prints(tmp_path):
    log = tmp_path / "search.log"
    log.write_text("\n".join([
        "Rec layer 'output' (search False, train True) sub net:", "  Layers in loop: (#: 1)", "    s",
        "  Unused layers: (#: 0)", "Rec layer 'output' (search True, train False) sub net:",
        "  Input layers moved out of loop: (#: 0)", "    None", "  Layers in loop: (#: 2)", "    end",
        "    output", "  Unused layers: (#: 0)"]) + "\n")
    assert bench.search_plan(str(log)) == ["Rec layer 'output' (search True, train False) sub net:",
                                           "Input layers moved out of loop: (#: 0)", "None",
                                           "Layers in loop: (#: 2)", "end", "output"]


def test_plan_lists_are_compared_as_sets():
    theirs = ["Rec layer 'output' (search True, train False) sub net:",
              "Input layers moved out of loop: (#: 0)", "None", "Output layers moved out of loop: (#: 0)",
              "None", "Layers in loop: (#: 2)", "output", "end"]
    ours = theirs[:6] + ["end", "output"]
    assert bench.plan_lists(theirs) == bench.plan_lists(ours) == [set(), set(), {"end", "output"}]
    assert bench.plan_lists(ours[:6] + ["end", "s"]) != bench.plan_lists(theirs)
