"""Learning curves from learning-rate files: scores, errors and the learning rate per epoch.

    plot-learning-curve LR_FILE [LR_FILE ...] -o curve.png [--label NAME ...] [--title TEXT]

Reads the files this engine writes (``learning_rate_file``) and those RETURNN writes: the same
``{epoch: EpochData(learningRate=..., error={...})}`` format, with RETURNN's key names such as
``dev_score_output``, ``train_score_output/output_prob`` or ``dev_error_output``; its ``:meta:`` entries
are skipped. One panel for the scores (every key without ``error`` in its name), one for the errors,
one for the learning rate (log scale when all rates are above 0); one line per run and measure, a
colour per run, a line style per dataset (train solid, dev dashed, eval dotted, others dash-dotted).
A run is named by its file name, or by ``--label`` (once per file, in order). The image format follows
the output's extension (png, pdf, svg, ...); the image is written under a temporary name and renamed.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from engine.runtime.atomic_file import atomic_path
from engine.runtime.errors import EngineError
from engine.training.update.lr_control import EpochData, parse_history

LINE_STYLES = {"train": "-", "dev": "--", "eval": ":"}


@dataclass
class Run:
    label: str
    path: str
    history: dict[int, EpochData]

    def keys(self) -> list[str]:
        return sorted({key for data in self.history.values() for key in data.scores})


class PlotError(EngineError):
    """A learning-rate file or the command line cannot give a plot."""


def load_run(path: str, label: str) -> Run:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PlotError(f"Learning-rate file '{path}' cannot be read: {exc}.") from None
    history = parse_history(text, path)
    if not history:
        raise PlotError(f"Learning-rate file '{path}' holds no epochs: there is nothing to plot.")
    return Run(label, path, history)


def run_labels(paths: list[str], labels: list[str] | None) -> list[str]:
    """``--label`` values, else the file names (the paths as given where two file names are equal)."""
    if labels is not None:
        if len(labels) != len(paths):
            raise PlotError(f"--label was given {len(labels)} times for {len(paths)} files; give it once per "
                            f"file, in the order of the files, or not at all.")
        return labels
    names = [os.path.basename(path) for path in paths]
    return names if len(set(names)) == len(names) else list(paths)


def _line_style(key: str) -> str:
    return LINE_STYLES.get(key.split("_", 1)[0], "-.")


def _plot_measure(ax: Axes, runs: list[Run], keys_of_panel) -> None:
    for index, run in enumerate(runs):
        for key in keys_of_panel(run):
            epochs = sorted(e for e, data in run.history.items() if key in data.scores)
            values = [run.history[e].scores[key] for e in epochs]
            ax.plot(epochs, values, color=f"C{index % 10}", linestyle=_line_style(key),
                    marker="o" if len(epochs) <= 30 else None, markersize=3, label=f"{run.label}: {key}")


def build_figure(runs: list[Run], title: str | None = None) -> Figure:
    """The figure: a panel for scores and one for errors where any run has them, one for the rate."""
    def scores(run: Run) -> list[str]:
        return [k for k in run.keys() if "error" not in k]

    def errors(run: Run) -> list[str]:
        return [k for k in run.keys() if "error" in k]

    panels = [(name, keys) for name, keys in (("score", scores), ("error", errors))
              if any(keys(run) for run in runs)]
    fig = Figure(figsize=(9, 3.2 * (len(panels) + 1)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels) + 1, 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, keys) in zip(axes, panels):
        _plot_measure(ax, runs, keys)
        ax.set_ylabel(name)
    rate_ax = axes[-1]
    for index, run in enumerate(runs):
        epochs = sorted(run.history)
        rates = [run.history[e].learning_rate for e in epochs]
        rate_ax.plot(epochs, rates, color=f"C{index % 10}", drawstyle="steps-mid",
                     marker="o" if len(epochs) <= 30 else None, markersize=3, label=run.label)
    if all(data.learning_rate > 0 for run in runs for data in run.history.values()):
        rate_ax.set_yscale("log")
    rate_ax.set_ylabel("learning rate")
    rate_ax.set_xlabel("epoch")
    rate_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="best")
    fig.suptitle(title or "learning curves")
    return fig


def save_figure(fig: Figure, output: str) -> None:
    """Write ``fig`` to ``output`` atomically, in the format its extension names."""
    fmt = os.path.splitext(output)[1].lstrip(".").lower()
    if fmt not in fig.canvas.get_supported_filetypes():
        raise PlotError(f"Output '{output}': cannot tell the image format from its extension; use .png, .pdf "
                        f"or .svg.")
    try:
        with atomic_path(output) as tmp:
            fig.savefig(tmp, format=fmt)
    except OSError as exc:
        raise PlotError(f"Output '{output}' cannot be written: {exc}.") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="plot-learning-curve",
        description="Plot scores, errors and the learning rate per epoch from learning-rate files "
                    "(this engine's or RETURNN's), several runs overlaid.")
    parser.add_argument("files", nargs="+", metavar="LR_FILE", help="learning-rate files, one per run")
    parser.add_argument("-o", "--output", required=True, help="image to write (.png, .pdf, .svg, ...)")
    parser.add_argument("--label", action="append", help="name of a run in the legend, once per file")
    parser.add_argument("--title", help="figure title (default: learning curves)")
    args = parser.parse_args(argv)
    try:
        labels = run_labels(args.files, args.label)
        runs = [load_run(path, label) for path, label in zip(args.files, labels)]
        save_figure(build_figure(runs, args.title), args.output)
    except EngineError as exc:
        print(f"plot-learning-curve: {exc}", file=sys.stderr)
        return 1
    print(f"plot-learning-curve: wrote {args.output} ({len(runs)} run{'s' * (len(runs) != 1)})")
    return 0
