"""plot-learning-curve on a learning-rate file this engine wrote and on one in RETURNN's format: one
line per run and measure, the image written atomically, clear errors for bad files."""
from __future__ import annotations

import os
import sys

import pytest
from matplotlib.figure import Figure

from engine.tools import plot_learning_curve as tool
from engine.training.update.lr_control import LearningRateControl
from helpers import ROOT, run

pytestmark = pytest.mark.tf_latest

RETURNN_FILE = str(ROOT / "tests" / "data" / "returnn_learning_rates.data")
RETURNN_KEYS = ["dev_error_output/output_prob", "dev_score_output/output_prob",
                "devtrain_score_output/output_prob", "train_score_output/output_prob"]


def engine_file(path: str) -> str:
    """Three newbob epochs written by the engine's own learning-rate control."""
    control = LearningRateControl("newbob", default_learning_rate=0.01, filename=path)
    for epoch, (train, dev) in enumerate([(3.0, 2.5), (2.0, 2.49), (1.8, 2.2)], start=1):
        control.learning_rate_for_epoch(epoch)
        control.set_epoch_scores(epoch, {"train_score": train, "dev_score": dev, "dev_error": dev / 5})
    control.learning_rate_for_epoch(4)
    control.save()
    return path


def lines_by_label(ax) -> dict[str, tuple[list, list]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_engine_and_returnn_runs_overlaid(tmp_path):
    runs = [tool.load_run(engine_file(str(tmp_path / "lr.txt")), "engine"),
            tool.load_run(RETURNN_FILE, "returnn")]
    fig = tool.build_figure(runs)
    score_ax, error_ax, rate_ax = fig.axes[:3]
    scores = lines_by_label(score_ax)
    assert sorted(scores) == ["engine: dev_score", "engine: train_score",
                              "returnn: dev_score_output/output_prob",
                              "returnn: devtrain_score_output/output_prob",
                              "returnn: train_score_output/output_prob"]
    assert scores["engine: dev_score"] == ([1, 2, 3], [2.5, 2.49, 2.2])
    assert scores["returnn: dev_score_output/output_prob"] == ([1, 2, 3, 4], [2.95, 2.1, 2.08, 1.7])
    assert sorted(lines_by_label(error_ax)) == ["engine: dev_error", "returnn: dev_error_output/output_prob"]
    rates = lines_by_label(rate_ax)
    assert sorted(rates) == ["engine", "returnn"]
    assert rates["engine"][0] == [1, 2, 3, 4]
    assert rates["engine"][1][3] == pytest.approx(0.005)  # newbob's decay
    assert rates["returnn"] == ([1, 2, 3, 4, 5], [0.001, 0.001, 0.001, 0.0005, 0.0005])
    assert rate_ax.get_yscale() == "log"
    colors = {label.split(":")[0]: line.get_color() for ax in fig.axes[:3] for line in ax.get_lines()
              for label in [line.get_label()]}
    assert colors["engine"] != colors["returnn"]
    assert all(ax.get_legend() is not None for ax in fig.axes[:3])


def test_command_line_writes_the_png(tmp_path):
    out = tmp_path / "plots" / "curve.png"
    proc = run([sys.executable, str(ROOT / "tools" / "plot_learning_curve.py"),
                engine_file(str(tmp_path / "a")), RETURNN_FILE, "-o", str(out),
                "--label", "mine", "--label", "returnn's"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"plot-learning-curve: wrote {out} (2 runs)\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(out.parent) == ["curve.png"]


def test_the_image_is_written_atomically(tmp_path, monkeypatch):
    out = tmp_path / "curve.png"
    out.write_bytes(b"the previous plot")
    written_to = []

    def failing_savefig(self, path, **kwargs):
        written_to.append(path)
        with open(path, "wb") as f:
            f.write(b"half a pn")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", failing_savefig)
    assert tool.main([RETURNN_FILE, "-o", str(out)]) == 1
    assert written_to and written_to[0] != str(out)
    assert out.read_bytes() == b"the previous plot" and os.listdir(tmp_path) == ["curve.png"]


def test_same_file_names_are_told_apart_by_path(tmp_path):
    paths = [str(tmp_path / "run1" / "lr.txt"), str(tmp_path / "run2" / "lr.txt")]
    assert tool.run_labels(paths, None) == paths
    assert tool.run_labels(["a/x", "b/y"], None) == ["x", "y"]


def test_a_file_without_errors_gets_no_error_panel(tmp_path):
    path = tmp_path / "lr"
    path.write_text("{1: EpochData(learningRate=0.1, error={'train_score': 1.0}),\n"
                    " 2: EpochData(learningRate=0.0, error={'train_score': 0.5})}\n")
    fig = tool.build_figure([tool.load_run(str(path), "r")])
    assert len(fig.axes) == 2 and [ax.get_ylabel() for ax in fig.axes] == ["score", "learning rate"]
    assert fig.axes[1].get_yscale() == "linear"  # a rate of 0 cannot go on a log scale


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("{}", "holds no epochs"),
    ("{1: EpochData(learningRate=0.1, error={'dev_score': 'x'})}", "a number was expected"),
    ("not a history", "syntax error at line 1"),
    ("[1, 2]", "must hold one dict"),
    (b"\xff\xfe", "cannot be read"),
])
def test_bad_files_give_one_clear_paragraph(tmp_path, capsys, content, message):
    path = tmp_path / "bad.lr"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert tool.main([str(path), "-o", str(tmp_path / "c.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"plot-learning-curve: Learning-rate file '{path}'") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "c.png").exists()


def test_bad_command_lines(tmp_path, capsys):
    assert tool.main(["/nonexistent/lr", "-o", str(tmp_path / "c.png")]) == 1
    assert "Learning-rate file '/nonexistent/lr' cannot be read" in capsys.readouterr().err
    assert tool.main([RETURNN_FILE, "-o", str(tmp_path / "c.xyz")]) == 1
    assert "cannot tell the image format" in capsys.readouterr().err
    assert tool.main([RETURNN_FILE, "-o", str(tmp_path / "c.png"), "--label", "a", "--label", "b"]) == 1
    assert "--label was given 2 times for 1 files" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        tool.main([RETURNN_FILE])
    assert exc.value.code == 2
