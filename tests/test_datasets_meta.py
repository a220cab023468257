"""``MetaDataset`` against RETURNN's (the fixtures of benchmarks/returnn_meta_fixtures.py: sequences per
epoch, hdf_dump's file, the errors), its own errors, sharding over ranks, the RASR refusal, and a short
training of features joined with alignments through ``rnn.py``."""
from __future__ import annotations

import json
import re
import sys

import h5py
import numpy as np
import pytest

from engine.datasets import BatchOptions, DataKeyInfo, HDFWriter, create_dataset, generate_batches
from engine.datasets.factory import dataset_findings
from engine.runtime.errors import DataError
from helpers import ROOT, run_rnn

pytestmark = pytest.mark.tf_latest
FIXTURES = ROOT / "tests" / "fixtures" / "returnn_meta"
DIR = str(FIXTURES)
MANIFEST = json.loads((FIXTURES / "cases.json").read_text())
EXPECTED = np.load(FIXTURES / "sequences.npz")
sys.path.insert(0, str(ROOT / "benchmarks"))
# the script that makes the fixtures judges by these
from returnn_meta_fixtures import (dataset_of, dump_differences, engine_dump, engine_sequences,  # noqa: E402
                                   sequence_differences)


def feat(name: str = "features") -> dict:
    return {"class": "HDFDataset", "files": [f"{DIR}/{name}.hdf"]}


def hybrid(**options) -> dict:
    return {"class": "MetaDataset", "datasets": {"features": feat(), "alignments": feat("alignments")},
            "data_map": {"data": ("features", "data"), "classes": ("alignments", "data")},
            "seq_order_control_dataset": "alignments", **options}


# ----- equal to RETURNN -----
@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_sequences_and_keys_equal_returnns(case):
    got, keys = engine_sequences(case, DIR, MANIFEST["cases"])
    assert sequence_differences(EXPECTED, got, f"{case}|") == []
    assert keys == MANIFEST["returnn_keys"][case]


@pytest.mark.parametrize("case", MANIFEST["dumps"])
def test_hdf_dump_writes_returnns_file(case, tmp_path):
    out = str(tmp_path / "dump.hdf")
    engine_dump(case, DIR, out, MANIFEST["cases"])
    misses, notes = dump_differences(str(FIXTURES / f"returnn_dump_{case}.hdf"), out)
    assert misses == [] and notes == []  # the root attributes too: RETURNN's MetaDataset's inputPattSize, 0


@pytest.mark.parametrize("case, named", [("missing_tag_count", ["'corpus/extra/1'", "'alignments'",
                                                                "alignments.hdf"]),
                                         ("missing_tag_lookup", ["'align/0'", "'features'", "features.hdf"])])
def test_a_missing_tag_is_refused_as_returnn_refuses_it(case, named):
    assert MANIFEST["returnn_errors"][case]  # RETURNN failed on it too
    with pytest.raises(DataError) as info:
        create_dataset(dataset_of(case, DIR, MANIFEST["error_cases"]))
    for words in named + ["missing from sub-dataset", "joined by sequence tag"]:
        assert words in str(info.value)


# ----- errors of our own making -----
@pytest.mark.parametrize("change, words", [
    ({"data_map": {"data": "features"}}, "data_map must be a non-empty dict"),
    ({"data_map": {"data": ("feats", "data")}}, "data_map uses sub-dataset(s) ['feats']"),
    ({"seq_order_control_dataset": "nope"}, "seq_order_control_dataset 'nope' is not one of"),
    ({"seq_order_control_dataset": None, "data_map": {"classes": ("alignments", "data")}},
     "without seq_order_control_dataset, data_map needs the key 'data'"),
    ({"data_map": {"data": ("features", "data"), "classes": ("alignments", "classes")}},
     "has no key 'classes'; its keys are ['data']"),
    ({"data_dims": {"data": (3, 2), "classes": (6, 1)}}, "data_dims['classes'] = (6, 1)"),
    ({"data_dims": {"data": 3}}, "data_dims gives no dims for key 'classes'"),
    ({"seq_list_file": f"{DIR}/nope.txt"}, "nope.txt' does not exist"),
    ({"seq_list_file": {"features": f"{DIR}/seq_list.txt"}}, "no file for sub-dataset(s) ['alignments']"),
    ({"seq_list_file": f"{DIR}/seq_list.txt"}, "lists 7 tags for 'alignments', but that sub-dataset"),
    ({"seq_lens_file": f"{DIR}/seq_lens.json"}, "key 'classes': the file says"),  # the subsampled lengths
    ({"datasets": {"features": {"class": "HDFDataset", "files": [f"{DIR}/none.hdf"]},
                   "alignments": feat("alignments")}}, "sub-dataset 'features': HDF file"),
])
def test_bad_options_name_what_is_wrong(change, words):
    with pytest.raises(DataError) as info:
        create_dataset({**hybrid(), **change}, key="train")
    assert words in str(info.value) and "MetaDataset 'train'" in str(info.value)


def test_with_a_control_dataset_the_tag_list_follows_its_order(tmp_path):
    with h5py.File(f"{DIR}/alignments.hdf", "r") as f:
        tags = [t.decode() for t in f["seqTags"][...]]
    (tmp_path / "sorted.txt").write_text("".join(f"{t}\n" for t in sorted(tags)))
    (tmp_path / "same.txt").write_text("".join(f"{t}\n" for t in tags + ["corpus/extra/1"]))
    with pytest.raises(DataError, match="entry 0 of seq_list_file .* is 'corpus/rec00/1', but sequence 0 of "
                                        "that sub-dataset .* is 'corpus/rec0[1-8]/1'"):
        create_dataset(hybrid(seq_list_file=str(tmp_path / "sorted.txt")))
    ds = create_dataset(hybrid(seq_list_file=str(tmp_path / "same.txt")))  # entries beyond: never read
    ds.init_seq_order(1)
    assert [ds.get_seq_tag(i) for i in range(ds.num_seqs)] == tags


def test_fewer_sequences_than_the_tag_list_is_refused_as_in_returnn(tmp_path):
    """The features list rec02 twice (11 entries, 10 tags): RETURNN wants at least 11 sequences of each."""
    path = str(tmp_path / "ten.hdf")
    with h5py.File(f"{DIR}/features.hdf", "r") as f:
        tags = list(dict.fromkeys(t.decode() for t in f["seqTags"][...]))
    with HDFWriter(path, {"data": DataKeyInfo(dim=2, sparse=True)}) as writer:
        for tag in tags:
            writer.insert(tag, {"data": np.zeros(3, np.int32)})
    spec = {"class": "MetaDataset",
            "datasets": {"features": feat(), "ten": {"class": "HDFDataset", "files": [path]}},
            "data_map": {"data": ("features", "data"), "classes": ("ten", "data")}}
    with pytest.raises(DataError, match="has 10 sequences, fewer than the 11 tags"):
        create_dataset(spec)
    create_dataset({**spec, "seq_list_file": f"{DIR}/seq_list.txt"}).close()  # a list without repeats


def test_sub_dataset_options_are_checked_with_the_key_and_ignore_keys(tmp_path):
    spec = hybrid(datasets={"features": {**feat(), "unique_seq_tags": True},
                            "alignments": feat("alignments")})
    with pytest.raises(DataError, match="'train/features'.*unique_seq_tags"):
        create_dataset(spec, key="train")
    create_dataset(spec, key="train", ignored={"dataset:unique_seq_tags"}).close()
    found = {(f.owners, f.name, f.verdict) for f in dataset_findings(spec, "train")}
    assert (("train/features",), "unique_seq_tags", "not implemented") in found
    assert (("train",), "seq_order_control_dataset", "implemented") in found


# ----- epochs, ranks, seeds -----
def test_ranks_share_the_epoch_by_batches():
    ds = create_dataset(hybrid(datasets={"features": feat(), "alignments": {**feat("alignments"),
                                                                            "seq_ordering": "random"}}))
    ds.init_seq_order(1)
    seen = {}
    for rank in (0, 1):
        for batch in generate_batches(ds, BatchOptions(batch_size=24), shard_rank=rank, shard_size=2):
            for j, (tag, pos) in enumerate(zip(batch.seq_tags, batch.seq_idx.tolist())):
                assert tag not in seen
                seen[tag] = rank
                for key in ("data", "classes"):
                    n = batch.lengths[key][j]
                    np.testing.assert_array_equal(batch.data[key][j, :n], ds.get_data(pos, key))
    assert sorted(seen) == sorted(ds.get_seq_tag(i) for i in range(ds.num_seqs))
    assert set(seen.values()) == {0, 1}


def test_the_control_dataset_inherits_the_seed_offset_unless_it_has_its_own():
    inherit = create_dataset(hybrid(), random_seed_offset=16127)  # a rank's offset, as the trainer gives it
    assert inherit.datasets["alignments"].random_seed_offset == 16127
    own = create_dataset(hybrid(datasets={"features": feat(), "alignments": {**feat("alignments"),
                                                                             "random_seed_offset": 3}}),
                         random_seed_offset=16127)
    assert own.datasets["alignments"].random_seed_offset == 3  # RETURNN: the sub-dataset's own wins


# ----- RASR -----
@pytest.mark.parametrize("spec", [
    {"class": "ExternSprintDataset", "sprintTrainerExecPath": "nn-trainer.linux-x86_64-standard",
     "sprintConfigStr": "--config=train.config", "partitionEpoch": 6},
    "sprint:--config=train.config",
    {"class": "SprintCacheDataset", "data": {}},
    hybrid(datasets={"features": {"class": "ExternSprintDataset", "sprintConfigStr": "x",
                                  "sprintTrainerExecPath": "y"}, "alignments": feat("alignments")}),
])
def test_rasr_datasets_are_refused_with_the_way_to_convert(spec):
    with pytest.raises(DataError) as info:
        create_dataset(spec)
    text = str(info.value)
    assert "\n" not in text and "cannot run in this engine" in text
    assert re.search(r"Dataset class '(ExternSprintDataset|SprintCacheDataset)' reads its data through RASR",
                     text)
    for words in ("returnn/tools/hdf_dump.py", "{'class': 'HDFDataset', 'files': ['features.hdf']}",
                  "'class': 'MetaDataset'", "'seq_order_control_dataset': 'alignments'"):
        assert words in text


# ----- training -----
TRAIN = """
def _meta(part):
    return {"class": "MetaDataset", "seq_order_control_dataset": "alignments",
            "datasets": {"features": {"class": "HDFDataset", "files": [%(feat)r]},
                         "alignments": {"class": "HDFDataset", "files": [%(align)r],
                                        "partition_epoch": part}},
            "data_map": {"data": ("features", "data"), "classes": ("alignments", "data")}}
train = _meta(2)
dev = _meta(1)
network = {"output": {"class": "softmax", "loss": "ce", "from": "data"}}
batch_size = 1000
max_seqs = 2
learning_rate = 0.01
num_epochs = 1
model = %(model)r
"""


@pytest.mark.version_independent  # the data path is NumPy and h5py; rnn.py's training is tested per version
def test_features_joined_with_alignments_train_through_rnn_py(tmp_path):
    """Features and alignments in two files, in different orders; epoch 1 is half of the 6 sequences
    (the alignments' partition_epoch), 2 steps of 2 and 1 sequences."""
    rng = np.random.RandomState(0)
    lengths = rng.randint(4, 9, size=6)
    feat_path, align_path = str(tmp_path / "feat.hdf"), str(tmp_path / "align.hdf")
    with HDFWriter(feat_path, {"data": DataKeyInfo(dim=3)}) as writer:
        for i, n in enumerate(lengths):
            writer.insert(f"rec{i}", {"data": rng.standard_normal((n, 3)).astype(np.float32)})
    with HDFWriter(align_path, {"data": DataKeyInfo(dim=5, sparse=True)}) as writer:
        for i in rng.permutation(6):
            writer.insert(f"rec{i}", {"data": rng.randint(0, 5, size=lengths[i]).astype(np.int32)})
    config = tmp_path / "meta.py"
    config.write_text(TRAIN % {"feat": feat_path, "align": align_path, "model": str(tmp_path / "net")})
    r = run_rnn([str(config)], timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^train epoch 1, finished after 2 steps", r.stdout, re.M), r.stdout
    assert re.search(r"^dev: score [\d.]+ error [\d.]+$", r.stdout, re.M), r.stdout
    assert (tmp_path / "net.001.index").exists() or list(tmp_path.glob("net.001*")), r.stdout
