"""RETURNN's ``DimensionTag`` and ``extern_data``'s ``same_dim_tags_as``: streams that share one time axis
(``engine/config/dim_tags.py``, ``engine/datasets/streams.py``) must have equal lengths in every sequence,
which batching checks (``engine/datasets/batching.py``); the forms this engine has no meaning for are
refused, naming what is wrong."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from engine.config.dim_tags import DimensionTag
from engine.config.loader import Config
from engine.datasets import (BatchOptions, DataKeyInfo, HDFWriter, data_dims, dataset_from_config,
                             generate_batches)
from engine.datasets.streams import same_length_groups
from engine.main import main
from engine.runtime.errors import DATA_ERROR_EXIT_CODE, ConfigError, DataError
from helpers import run_rnn

pytestmark = pytest.mark.usefixtures("fresh_log")  # each test sees the notes anew

PUBLISHED = """\
    #!rnn.py
    from TFUtil import DimensionTag
    time_tag = DimensionTag(kind=DimensionTag.Types.Spatial, description="time")
    extern_data = {"data": {"dim": 3, "same_dim_tags_as": {"t": time_tag}},
                   "classes": {"dim": 4, "sparse": True, "dtype": "int32",
                               "same_dim_tags_as": {"T": time_tag}}}
    task = "train"
    train = {"class": "HDFDataset", "files": [%(corpus)r]}
    network = {"output": {"class": "softmax", "loss": "ce", "from": "data"}}
    batch_size = 100
    num_epochs = 1
    learning_rate = 0.01
    model = %(model)r
    """


def write_corpus(path, shorter: tuple[int, ...] = ()) -> str:
    """8 sequences, ``classes`` as long as ``data`` but in the sequences ``shorter`` (one frame less)."""
    rng = np.random.RandomState(0)
    keys = {"data": DataKeyInfo(dim=3), "classes": DataKeyInfo(dim=4, sparse=True)}
    with HDFWriter(str(path), keys) as writer:
        for i in range(8):
            n = 4 + i
            writer.insert(f"seq-{i}", {"data": rng.standard_normal((n, 3)).astype(np.float32),
                                       "classes": rng.randint(0, 4, n - (i in shorter)).astype(np.int32)})
    return str(path)


def config_file(tmp_path, text: str, **values) -> str:
    path = tmp_path / "c.config"
    path.write_text(textwrap.dedent(text) % values)
    return str(path)


def published(tmp_path, shorter: tuple[int, ...] = ()) -> str:
    return config_file(tmp_path, PUBLISHED, corpus=write_corpus(tmp_path / "corpus.hdf", shorter),
                       model=str(tmp_path / "out" / "net"))


def test_the_published_form_is_read_and_passes_the_check(tmp_path, capsys):
    path = published(tmp_path)
    config = Config.from_sources([path], [])
    assert same_length_groups(config) == [("data", "classes")]
    dims = data_dims(config, None)
    assert (dims.input_dim, dims.input_sparse, dims.target_dims) == (3, False, {"classes": 4})
    assert main([path, "--check"]) == 0
    assert "Training would start" in capsys.readouterr().out


def test_groups_are_the_streams_of_one_tag_object():
    """Tags are told apart by object, not by description; a stream alone on its tag forms no group."""
    time, output_len = DimensionTag(kind=DimensionTag.Types.Time, description="time"), DimensionTag(
        kind=DimensionTag.Types.Spatial, description="output-len")
    alone = DimensionTag(kind="spatial", description="time")
    extern = {"data": {"dim": 3, "same_dim_tags_as": {"t": time}}, "phones": {"dim": 5, "sparse": True},
              "classes": {"dim": 4, "sparse": True, "same_dim_tags_as": {"t": time}},
              "alignment": {"dim": 6, "sparse": True, "same_dim_tags_as": {"t": output_len}},
              "align2": {"dim": 6, "sparse": True, "same_dim_tags_as": {"t": output_len, "T": output_len}},
              "other": {"dim": 2, "same_dim_tags_as": {"t": alone}},
              "empty": {"dim": 2, "same_dim_tags_as": {}}}
    assert same_length_groups(Config({"extern_data": extern})) == [("data", "classes"),
                                                                   ("alignment", "align2")]
    assert same_length_groups(Config({"num_outputs": {"data": [3, 2]}})) == []


@pytest.mark.parametrize("code, words", [
    ("DimensionTag(kind=DimensionTag.Types.Feature, description='feature')",
     "kind='feature' is not supported. This engine's DimensionTag stands for one dynamic time axis"),
    ("DimensionTag(kind=DimensionTag.Types.Batch)", "kind='batch' is not supported"),
    ("DimensionTag(kind=DimensionTag.Types.Spatial, description='time', dimension=40)",
     "dimension=40 is not supported"),
    ("DimensionTag(kind=DimensionTag.Types.Spatial, description='time', auto_generated=True)",
     "takes kind, description and dimension only, not auto_generated"),
])
def test_tags_it_has_no_meaning_for_are_refused_in_config_code(tmp_path, code, words):
    path = config_file(tmp_path, "from returnn.tf.util.data import DimensionTag\ntag = %(code)s\n", code=code)
    with pytest.raises(ConfigError, match="failed while executing at line 2") as caught:
        Config.from_sources([path], [])
    assert words in str(caught.value), caught.value


@pytest.mark.parametrize("tags, words", [
    ("{'f': time_tag}", "'classes': same_dim_tags_as names axis 'f', which is not supported: only the time"),
    ("{'t': 'time'}", "'classes': same_dim_tags_as gives the time axis 'time', which is not a DimensionTag"),
    ("{'t': Dim}", "'classes': same_dim_tags_as gives the time axis <RETURNN's returnn.tf.util.data.Dim"),
    ("{'t': time_tag, 'T': DimensionTag(kind='time')}", "'classes': same_dim_tags_as gives 't' and 'T' "
                                                        "different tags"),
    ("'t'", "'classes': same_dim_tags_as must be a dict {'t': tag}, got 't'"),
])
def test_same_dim_tags_as_forms_it_cannot_honour_are_named(tmp_path, tags, words):
    text = PUBLISHED.replace('"same_dim_tags_as": {"T": time_tag}', f'"same_dim_tags_as": {tags}')
    text = text.replace("    from TFUtil import DimensionTag\n",
                        "    from TFUtil import DimensionTag\n    from returnn.tf.util.data import Dim\n")
    path = config_file(tmp_path, text, corpus=write_corpus(tmp_path / "corpus.hdf"), model="net")
    config = Config.from_sources([path], [])
    for read in (lambda: same_length_groups(config), lambda: data_dims(config, None),
                 lambda: dataset_from_config(config, "train")):
        with pytest.raises(ConfigError) as caught:
            read()
        assert str(caught.value).startswith("Config 'extern_data' entry ") and words in str(caught.value)
    assert main([path, "--check"]) == ConfigError.exit_code


def test_streams_of_one_time_axis_with_other_lengths_stop_the_epoch(tmp_path):
    config = Config.from_sources([published(tmp_path, shorter=(3, 5))], [])
    dataset = dataset_from_config(config, "train")
    assert dataset.same_length_keys == [("data", "classes")]
    dataset.init_seq_order(1)
    with pytest.raises(DataError) as caught:
        generate_batches(dataset, BatchOptions(100))
    assert str(caught.value).startswith("HDFDataset, epoch 1: sequence 'seq-3' has lengths data 7, "
                                        "classes 6, but extern_data gives streams data, classes one time "
                                        "axis"), caught.value
    assert "(2 of the epoch's 8 sequences differ)" in str(caught.value)
    dataset.same_length_keys = [("data", "classes", "alignment")]  # a stream the dataset lacks is left out
    with pytest.raises(DataError, match="streams data, classes one time axis"):
        generate_batches(dataset, BatchOptions(100))
    dataset.same_length_keys = [("data", "alignment")]  # one stream of the group: nothing to compare
    assert len(list(generate_batches(dataset, BatchOptions(100)))) > 0
    dataset.close()


def test_streams_of_one_time_axis_train_and_other_lengths_stop_the_run(tmp_path):
    r = run_rnn([published(tmp_path)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "out" / "net.001").exists(), sorted(p.name for p in (tmp_path / "out").iterdir())
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    r = run_rnn([published(wrong, shorter=(6,))])
    output = r.stdout + r.stderr
    assert r.returncode == DATA_ERROR_EXIT_CODE, output
    assert "sequence 'seq-6' has lengths data 10, classes 9, but extern_data gives streams data, " \
           "classes one time axis" in output, output
    assert "Traceback" not in output, output
