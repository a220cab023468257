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


TAGGED = """
from TFUtil import DimensionTag
import cachemanager as cm
time_tag = DimensionTag(kind=DimensionTag.Types.Spatial, description="time")
speaker_tag = DimensionTag(kind=DimensionTag.Types.Spatial, description="speaker")
extern_data = {"data": {"dim": 4, "same_dim_tags_as": {"t": time_tag}},
               "classes": {"dim": 6, "sparse": True, "same_dim_tags_as": {"t": time_tag}},
               "speaker": {"dim": 3, "sparse": True, "same_dim_tags_as": {"T": speaker_tag}}}
network = {
    "state": {"class": "eval", "eval": "tf.math.floormod(source(0), 2)", "from": "data:classes",
              "out_type": {"dim": 2, "dtype": "int32", "sparse": True}, "register_as_extern_data": "state"},
    "enc": {"class": "linear", "activation": "tanh", "n_out": 3, "from": "data"},
    "label": {"class": "squeeze", "axis": "T", "from": "data:speaker", "register_as_extern_data": "label"},
    "e": {"class": "linear", "activation": None, "n_out": 1, "from": "enc"},
    "w": {"class": "softmax_over_spatial", "from": "e"},
    "pooled": {"class": "generic_attention", "weights": "w", "base": "enc"},
    "spk": {"class": "softmax", "loss": "ce", "target": "label", "from": "pooled"},
    "output": {"class": "softmax", "loss": "ce", "target": "state", "from": "enc"},
}
"""


def test_time_tags_one_frame_streams_and_cluster_imports_reach_the_training_config(tmp_path):
    """The configs' dim tags become this engine's (the check) and code of the training config; streams of
    the data's tag get its frames, a squeezed stream one frame; an import of i6's cluster is left out."""
    write(tmp_path, "2022-x/base.config", TAGGED)
    setup = read_setup(str(tmp_path), "2022-x/base.config")
    tags = coverage.time_tags(setup.namespace)
    assert tags["data"] == tags["classes"] != tags["speaker"]
    assert coverage.one_frame_streams(setup.network) == ("speaker",)
    dims = coverage.described_streams(setup.namespace)
    corpus = str(tmp_path / "corpus.hdf")
    coverage.make_corpus(corpus, dims, ctc=True, tied=("classes", "data"), single=("speaker",))
    from engine.datasets import HDFDataset

    lengths = HDFDataset(files=[corpus])._corpus_lengths()  # columns in the corpus' keys' order
    keys = HDFDataset(files=[corpus]).data_keys
    assert (lengths[:, keys.index("classes")] == lengths[:, keys.index("data")]).all()
    assert (lengths[:, keys.index("speaker")] == 1).all()
    assert coverage.check(setup, corpus) == []
    kept = coverage.config_functions(str(tmp_path), "2022-x/base.config", setup.namespace)
    assert "from TFUtil import DimensionTag" in kept and not any("cachemanager" in k for k in kept)
    assert coverage.train_step(setup, corpus, str(tmp_path), dims, str(tmp_path)) == ""


def test_the_benchmark_trains_its_accepted_networks_two_at_a_time_and_reports_each(tmp_path):
    """``main`` with ``--jobs 2``: the training configs are prepared in the main thread (TensorFlow objects
    for stand-ins), the runs go in parallel, each is reported as it ends, and the counts add up."""
    import subprocess

    write(tmp_path, "2019-asr-x/base.config", SETUP)
    write(tmp_path, "2019-asr-x/other.config", SETUP.replace("LstmDim = 32", "LstmDim = 16"))
    write(tmp_path, "2019-asr-x/refused.config", SETUP.replace('"loss": "ce"', '"loss": "sprint"'))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_returnn_coverage.py"),
                           str(tmp_path), "--jobs", "2", "--folder", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--check accepts 2 of 3" in done.stdout, done.stdout
    assert "trained one epoch (2 steps): 2 of the 2 accepted" in done.stdout, done.stdout
    reported = sorted(line for line in done.stderr.splitlines() if line.startswith("trained "))
    assert reported == ["trained 2019-asr-x/base.config: OK", "trained 2019-asr-x/other.config: OK"], \
        done.stderr[-2000:]
