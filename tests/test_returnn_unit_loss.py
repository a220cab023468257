"""A CE loss on a rec unit's eval layer equals RETURNN's: ``benchmarks/returnn_unit_loss.py``'s numbers,
written by RETURNN 1.20261022 (loss, objective, frame error and input gradient, with a frame under its
1e-20 clip), replayed without RETURNN."""
from __future__ import annotations

import sys

import numpy as np

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as scripts do

import returnn_unit_loss  # noqa: E402


def test_an_eval_loss_equals_returnns_on_its_fixture():
    theirs = dict(np.load(returnn_unit_loss.FIXTURE))
    ours = returnn_unit_loss.engine_side(returnn_unit_loss.batch())
    ok, grad_diff = returnn_unit_loss.differences(theirs, ours)
    assert ok, (float(theirs["loss"]), grad_diff)
