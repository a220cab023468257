"""The coverage benchmark over RETURNN's published setups reads a config as RETURNN would run it and labels
what the check refuses (``benchmarks/returnn_setups.py``, ``benchmarks/bench_returnn_coverage.py``), on
configs written here in the style of those setups."""
from __future__ import annotations

import sys
import textwrap

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as scripts do

import bench_returnn_coverage as coverage  # noqa: E402
from returnn_setups import read_setup, setup_paths  # noqa: E402

SETUP = """
from Pretrain import WrapEpochValue
import TFUtil
import os, sys
sys.path.insert(0, "/nonexistent/crnn")
assert os.path.exists("/nonexistent/corpus.hdf"), "the authors' corpus"
task = config.value("task", "train")
beam_size = config.int("beam_size", 12)
extern_data = {"data": {"dim": 40, "shape": (None, 40)}, "bpe": {"dim": 1030, "sparse": True}}
target = "bpe"
LstmDim = 32
network = {
    "#info": {"note": "a note"},
    "lstm0_fw": {"class": "rec", "unit": "nativelstm2", "n_out": LstmDim, "direction": 1, "from": ["data"]},
    "output": {"class": "softmax", "loss": "ce", "from": ["lstm0_fw"]},
}
if task == "search":
    network["output"]["beam"] = beam_size
"""


def write(folder, path: str, text: str) -> None:
    file = folder / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(textwrap.dedent(text))


def test_a_setup_is_read_as_returnn_runs_it_and_what_fails_is_skipped(tmp_path):
    write(tmp_path, "2019-asr-x/base.config", SETUP)
    write(tmp_path, "2016-old/base.config", SETUP)
    write(tmp_path, "2020-rasr/recog.config", "[*.corpus]\nfile = corpus.xml\n")
    assert setup_paths(str(tmp_path)) == ["2019-asr-x/base.config", "2020-rasr/recog.config"]
    path_before = list(sys.path)
    setup = read_setup(str(tmp_path), "2019-asr-x/base.config")
    assert setup.failed_statements == 1 and setup.namespace["beam_size"] == 12
    assert set(setup.network) == {"#info", "lstm0_fw", "output"} and "beam" not in setup.network["output"]
    assert sys.path == path_before and "Pretrain" not in sys.modules and "TFUtil" not in sys.modules
    assert coverage.streams(setup.namespace) == {"data": (40, False), "bpe": (1030, True)}
    assert read_setup(str(tmp_path), "2020-rasr/recog.config").problem.startswith("not Python")


def test_the_check_accepts_the_setup_and_names_each_refusal(tmp_path):
    write(tmp_path, "2019-asr-x/base.config", SETUP)
    setup = read_setup(str(tmp_path), "2019-asr-x/base.config")
    corpus = str(tmp_path / "corpus.hdf")
    coverage.make_corpus(corpus, coverage.streams(setup.namespace), ctc=False)
    assert coverage.check(setup, corpus) == []
    setup.namespace["network"]["output"]["from"] = ["decision"]
    setup.namespace["network"]["decision"] = {"class": "scatter_nd", "from": ["lstm0_fw"]}
    assert coverage.check(setup, corpus) == ["layer class 'scatter_nd'"]
    setup.namespace["network"]["decision"] = {"class": "rec", "from": [], "unit": {
        "output": {"class": "choice", "target": "classes", "beam_size": 4, "from": "x"},
        "x": {"class": "twod_lstm", "from": "prev:output"}}}
    assert coverage.check(setup, corpus) == ["unit layer class 'twod_lstm'"]
    setup.namespace["network"]["decision"] = {"class": "linear", "n_out": 3, "spatial_smoothing": 0.1}
    assert coverage.check(setup, corpus) == ["layer option linear:spatial_smoothing"]


def test_a_training_config_keeps_the_constants_functions_and_eval_strings_read(tmp_path):
    write(tmp_path, "2022-x/base.config", """
    import os
    num_inputs = 40
    threshold = 0.5
    scale = float("0.36")
    unused = 3
    corpus = os.path.join("/nonexistent", "train.hdf")
    def transform(x):
        return x * num_inputs * scale
    network = {"t": {"class": "eval",
                     "eval": "source(0) + self.network.get_config().typed_value('threshold')"}}
    """)
    kept = coverage.config_functions(str(tmp_path), "2022-x/base.config")
    assert kept == ["import os", "num_inputs = 40", "threshold = 0.5",
                    "def transform(x):\n    return x * num_inputs * scale"]
    # a value computed by code: from the config's namespace, as it ran
    kept = coverage.config_functions(str(tmp_path), "2022-x/base.config", {"scale": 0.36})
    assert "scale = 0.36" in kept
