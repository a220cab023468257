"""The attention benchmark's own functions (``benchmarks/returnn_attention_side.py``,
``benchmarks/bench_returnn_attention.py``): the reduced network, the batch, the output comparison."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as scripts do

from bench_returnn_attention import output_difference  # noqa: E402
from returnn_attention_side import deterministic, label_lengths, make_batch, reduced, scaled  # noqa: E402

NETWORK = {
    "lstm_fw": {"class": "rec", "unit": "nativelstm2", "n_out": 1024, "dropout": 0.3},
    "value": {"class": "split_dims", "axis": "F", "dims": (1, 2048), "from": "lstm_fw"},
    "heads": {"class": "linear", "n_out": 1, "from": "lstm_fw"},
    "#comment": "kept",
    "output": {"class": "rec", "from": [], "max_seq_len": "max_len_from('base:encoder')", "unit": {
        "embed": {"class": "linear", "n_out": 621, "from": "output", "initial_output": 0},
        "readout_in": {"class": "linear", "n_out": 1000, "from": "embed"},
        "readout": {"class": "reduce_out", "mode": "max", "num_pieces": 2, "from": "readout_in"},
        "prob": {"class": "softmax", "from": "readout", "dropout": 0.3, "loss": "ce",
                 "loss_opts": {"label_smoothing": 0.1}},
        "output": {"class": "choice", "beam_size": 12, "from": "prob", "target": "classes"}}},
}


def test_scaled_is_even_and_keeps_head_counts() -> None:
    assert [scaled(n, 0.0625) for n in (1024, 2048, 1000, 621, 1, 3)] == [64, 128, 62, 38, 1, 2]
    assert scaled(1024, 0.1) * 2 == scaled(2048, 0.1)  # a bidirectional pair still sums to the scaled dim


def test_reduced_scales_n_out_and_split_dims_in_subnetworks() -> None:
    small = reduced(NETWORK, 0.0625)
    assert small["lstm_fw"]["n_out"] == 64 and small["heads"]["n_out"] == 1
    assert small["value"]["dims"] == (1, 128)
    unit = small["output"]["unit"]
    assert unit["embed"]["n_out"] == 38 and unit["readout_in"]["n_out"] == 62
    assert unit["readout"]["num_pieces"] == 2 and unit["output"]["beam_size"] == 12
    assert unit["embed"]["initial_output"] == 0 and unit["prob"]["loss_opts"] == {"label_smoothing": 0.1}
    assert small["output"]["max_seq_len"] == "max_len_from('base:encoder')"
    assert NETWORK["output"]["unit"]["readout_in"]["n_out"] == 1000  # a copy: the config's dict unchanged


def test_deterministic_sets_every_dropout_to_zero() -> None:
    quiet = deterministic(NETWORK)
    assert quiet["lstm_fw"]["dropout"] == 0.0 and quiet["output"]["unit"]["prob"]["dropout"] == 0.0
    assert NETWORK["output"]["unit"]["prob"]["dropout"] == 0.3


def test_batch_labels_end_in_eos_and_fit_ctc() -> None:
    assert label_lengths(3, 36).tolist() == [5, 6, 4]
    batch = make_batch(4, 36, 40, 60)
    assert batch["data"].shape == (4, 36, 40) and batch["lengths"].tolist() == [36] * 4
    for labels, length in zip(batch["classes"], batch["label_lengths"]):
        assert length <= 36 // 6 and labels[length - 1] == 0 and (labels[length:] == 0).all()
        assert ((labels[:length - 1] >= 1) & (labels[:length - 1] < 60)).all()
        assert (labels[1:length - 1] != labels[:length - 2]).all()  # no repeats (CTC would need more frames)


def test_output_difference_reads_each_sequence_up_to_its_length() -> None:
    theirs = np.ones((2, 3, 4), np.float32)
    ours = theirs.copy()
    ours[1, 2] = 5.0  # padding of the second sequence
    assert output_difference(ours, theirs, np.array([3, 2])) == 0.0
    ours[0, 2, 0] = 1.5
    assert output_difference(ours, theirs, np.array([3, 2])) == pytest.approx(0.5)
    assert output_difference(ours[:, :1], theirs, np.array([3, 2])) == np.inf
