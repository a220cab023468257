"""The verdicts of the scripts that compare this engine with RETURNN, and the fixtures they may replace.

``bench_returnn_parity.py``, ``returnn_checkpoints.py`` and ``bench_returnn_hybrid.py`` print a PASS or MISS
line per comparison and exit with status 1 when any is a MISS, so that a run that finds a difference beyond
the tolerance it prints cannot pass for a good one. The first two write the RETURNN side of the tests'
fixtures; they do so only when asked (``--update-fixtures``) and only when every comparison passed
(``update_fixtures``): a run that disagrees with the engine leaves the golden data as it was.
Only numpy and the standard library: the verdicts are tested without RETURNN (tests/test_benchmarks.py).
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Sequence

import numpy as np


def parity_misses(returnn_after: dict[str, np.ndarray], engine_params: dict[str, np.ndarray],
                  returnn_change: float, engine_change: float, rtol: float, atol: float,
                  change_rtol: float) -> list[str]:
    """What of one update is beyond the tolerance (empty: it passes): parameters that only one side has, a
    parameter off by more than ``atol + rtol * |RETURNN's|`` anywhere (numpy's ``assert_allclose`` rule;
    NaN is beyond), a dev-score change off by more than ``change_rtol`` of RETURNN's."""
    misses = []
    theirs_only, ours_only = sorted(set(returnn_after) - set(engine_params)), sorted(
        set(engine_params) - set(returnn_after))
    if theirs_only or ours_only:
        misses.append(f"parameters differ (RETURNN's only: {theirs_only}, the engine's only: {ours_only})")
    for key in sorted(set(returnn_after) & set(engine_params)):
        theirs, ours = np.asarray(returnn_after[key]), np.asarray(engine_params[key])
        if theirs.shape != ours.shape:
            misses.append(f"{key}: shape {ours.shape}, RETURNN's {theirs.shape}")
            continue
        excess = np.abs(ours - theirs) - (atol + rtol * np.abs(theirs))
        excess = np.where(np.isnan(excess), np.inf, excess)
        if excess.size and excess.max() > 0:
            at = np.unravel_index(int(excess.argmax()), theirs.shape)
            misses.append(f"{key}[{', '.join(map(str, at))}]: {ours[at]:.8g}, RETURNN's {theirs[at]:.8g} "
                          f"(beyond rtol {rtol:g}, atol {atol:g})")
    if not abs(engine_change - returnn_change) <= change_rtol * abs(returnn_change):
        misses.append(f"dev-score change {engine_change:+.6f}, RETURNN's {returnn_change:+.6f} (beyond "
                      f"{100 * change_rtol:g} %)")
    return misses


def within_tolerance(differences: Sequence[float], tolerance: float) -> tuple[bool, float]:
    """(whether the largest of ``differences`` is at most ``tolerance``, that largest); a NaN is the largest
    and beyond any tolerance."""
    largest = float(np.max(differences))
    return bool(largest <= tolerance), largest


def summary(names: Sequence[str], missed: Sequence[str], tolerance: str) -> tuple[str, int]:
    """The last line of a run and its exit status: MISS and 1 when any of ``names`` missed."""
    if missed:
        return f"MISS: {len(missed)} of {len(names)} case(s) beyond the tolerance ({tolerance}): " \
            f"{', '.join(missed)}", 1
    return f"PASS: all {len(names)} case(s) within the tolerance ({tolerance})", 0


def seed_spread_verdict(epoch: int, ours: Sequence[float], theirs: Sequence[float]) -> tuple[bool, str]:
    """Whether each side's median dev score of ``epoch`` lies within the other side's seed-to-seed range
    (min..max over the seeds), and the PASS or MISS line saying so."""
    ours_median, theirs_median = float(np.median(ours)), float(np.median(theirs))
    inside = min(theirs) <= ours_median <= max(theirs) and min(ours) <= theirs_median <= max(ours)
    sides = (f"engine {ours_median:.4f} ({min(ours):.4f}..{max(ours):.4f}); RETURNN {theirs_median:.4f} "
             f"({min(theirs):.4f}..{max(theirs):.4f}), {len(ours)} seeds each")
    return inside, (f"{'PASS' if inside else 'MISS'}: epoch {epoch}: each side's median dev score lies "
                    f"within the other's seed spread [{sides}]")


def update_fixtures(status: int, work: str, files: Sequence[str], fixtures: str) -> str:
    """With exit ``status`` 0: ``files`` of ``work`` replace those of ``fixtures``, and ``work``'s
    ``cases.json`` replaces theirs with the cases it does not hold kept; each file goes to a temporary name
    beside its target and is renamed into place. Else nothing changes. Returns the line to print."""
    if status != 0:
        return f"{fixtures} left as it was: a comparison missed"
    os.makedirs(fixtures, exist_ok=True)
    with open(os.path.join(work, "cases.json")) as f:
        manifest = json.load(f)
    target = os.path.join(fixtures, "cases.json")
    if os.path.exists(target):
        with open(target) as f:
            manifest["cases"] = {**json.load(f)["cases"], **manifest["cases"]}
    manifest["cases"] = dict(sorted(manifest["cases"].items()))
    for name in files:
        temp = os.path.join(fixtures, f".{name}.tmp")
        shutil.copyfile(os.path.join(work, name), temp)
        os.replace(temp, os.path.join(fixtures, name))
    temp = os.path.join(fixtures, ".cases.json.tmp")
    with open(temp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(temp, target)
    return f"updated {len(files) + 1} file(s) in {fixtures}"
