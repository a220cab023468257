"""LibriSpeechCorpus against what RETURNN yields on the same tiny LibriSpeech tree and its zips
(tests/fixtures/returnn_librispeech/, made by benchmarks/returnn_librispeech_fixtures.py; RETURNN is not
needed here), its refusals, and this engine's hdf-dump of the OggZipDataset of
configs/speech_ctc_oggzip.py against RETURNN's HDFDatasetWriter dump (benchmarks/hdf_dump_parity.py)."""
import json
import os
import shutil
import sys
import zipfile

import numpy as np
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import hdf_dump_parity  # noqa: E402
import returnn_librispeech_fixtures as F  # noqa: E402

from engine.config import returnn_names_table  # noqa: E402
from engine.datasets.factory import create_dataset, dataset_findings  # noqa: E402
from engine.runtime.errors import DataError  # noqa: E402

FIXTURES = str(ROOT / "tests" / "fixtures" / "returnn_librispeech")
TREE = f"{FIXTURES}/LibriSpeech"
with open(f"{FIXTURES}/returnn.json") as _f:
    RECORD = json.load(_f)


@pytest.fixture(scope="module")
def zips(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("zips"))
    F.make_zips(FIXTURES, folder)
    return folder


@pytest.fixture(scope="module")
def returnn_arrays():
    with np.load(f"{FIXTURES}/returnn.npz") as arrays:
        return dict(arrays)


def corpus(options, zips="", **changes):
    return create_dataset({"class": "LibriSpeechCorpus", **F.resolve(options, FIXTURES, zips), **changes})


def all_seqs(dataset, epoch):
    dataset.init_seq_order(epoch)
    return [(dataset.get_seq_tag(i), {k: dataset.get_data(i, k) for k in dataset.data_keys})
            for i in range(dataset.num_seqs)]


@pytest.mark.parametrize("case", sorted(F.CASES))
def test_dataset_equals_returnn(case, zips, returnn_arrays):
    expected = RECORD["cases"][case]
    dataset = corpus(F.CASES[case], zips)
    assert {k: dataset.get_data_dim(k) for k in dataset.data_keys} == expected["dims"]
    assert dataset.labels.get("classes", []) == expected["labels"]
    # RETURNN's only other keys: 'raw' (a string) and, with audio=None, a scalar dummy 'data'
    assert set(expected["not_compared"]) <= {"raw", "data"} and "data" not in dataset.data_keys or \
        "data" not in expected["not_compared"]
    for epoch in F.EPOCHS:
        seqs = all_seqs(dataset, epoch)
        assert [tag for tag, _ in seqs] == expected[str(epoch)], epoch
        for i, (tag, data) in enumerate(seqs):
            assert list(dataset.epoch_seq_lengths()[i]) == [len(data[k]) for k in dataset.data_keys], tag
            for key, ours in data.items():
                theirs = returnn_arrays[f"{case}/{epoch}/{i}/{key}"]
                assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), (epoch, tag, key)
                np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * max(1, np.abs(theirs).max()),
                                           err_msg=f"epoch {epoch} {tag} {key}")


def test_hdf_dump_equals_returnns_dataset_for_dataset_and_attribute_for_attribute(capsys):
    assert hdf_dump_parity.DIFFERENCES == {}
    assert hdf_dump_parity.compare(FIXTURES) == []
    out = capsys.readouterr().out
    assert "hdf-dump against RETURNN's dump_from_dataset: 0 differences" in out, out
    # and RETURNN's HDFDataset read the engine's file as it read its own (recorded by the fixture script)
    assert RECORD["hdf_read_back"]["problems"] == [] and RECORD["hdf_read_back"]["seqs"] == 3


def test_every_returnn_option_has_a_verdict():
    spec = {"class": "LibriSpeechCorpus", **{name: None for name in returnn_names_table.DATASET_OPTIONS[
        "LibriSpeechCorpus"]}}
    verdicts = {f.name: f.verdict for f in dataset_findings(spec)}
    assert verdicts.pop("use_cache_manager") == "no effect"
    assert set(verdicts.values()) == {"implemented"}, verdicts


_BPE = F.CASES["tree_bpe_random"]


@pytest.mark.parametrize("change, message", [
    ({"prefix": "training"}, "prefix must start with one of train, dev, test"),
    ({"path": FIXTURES}, "does not look like LibriSpeech: '" + FIXTURES + "/train-clean-100' is missing"),
    ({"use_zip": True}, "use_zip is set, but there are no zip files"),
    ({"targets": "bpe", "bpe": None}, "targets 'bpe' needs the options dict 'bpe'"),
    ({"targets": {"class": "CharacterTargets"}}, "targets is a vocabulary dict, so bpe and chars"),
    ({"bpe": {**_BPE["bpe"], "class": "BytePairEncoding"}}, "bpe must be a dict of BytePairEncoding options"),
    ({"chars": {"vocab_file": "x"}}, "targets 'bpe' needs the options dict 'bpe' and no 'chars'"),
    ({"targets": "words", "bpe": None}, "targets must be a vocabulary dict, 'bpe', 'chars' or None"),
    ({"orth_post_process": "english_cleaners"}, "orth_post_process 'english_cleaners' names one of"),
    ({"audio": {"features": "raw_ogg"}}, "features 'raw_ogg' is not implemented"),
    ({"audio": None, "bpe": None}, "nothing is left to read"),
    ({"fixed_random_subset": 1.5}, "fixed_random_subset must be a fraction"),
    ({"fixed_random_subset": 0.01}, "fixed_random_subset must be a fraction"),
    ({"seq_tag_format": "%(spk)i"}, "seq_tag_format '%(spk)i' cannot be filled in"),
    ({"epoch_wise_filter": {(1, 2): {"max_len": 3}}}, "knows only subdirs, use_new_filter, max_mean_len"),
    ({"epoch_wise_filter": {(None, 2): {}, (1, 3): {}}}, "cannot be sorted"),
    ({"epoch_wise_filter": {(3, 2): {}}}, "must be 1 <= first <= last"),
    ({"epoch_wise_filter": {(1, 2): {"subdirs": "train-clean-100"}}}, "must be a list of subdir names"),
])
def test_bad_options_are_refused_by_name(change, message):
    with pytest.raises(DataError) as info:
        corpus(_BPE, **change)
    assert message in str(info.value)


def test_subdir_filter_that_keeps_nothing_names_the_subdirs():
    dataset = corpus(_BPE, epoch_wise_filter={(1, 1): {"subdirs": ["train-clean-360"]}})
    with pytest.raises(DataError, match=r"no sequence is of subdirs \['train-clean-360'\].*'train-other"):
        dataset.init_seq_order(1)


@pytest.fixture
def tree(tmp_path):
    shutil.copytree(TREE, tmp_path / "LibriSpeech")
    return tmp_path / "LibriSpeech"


def test_bad_files_are_named(tree, tmp_path):
    trans = tree / "train-other-500" / "20" / "205" / "20-205.trans.txt"
    trans.write_text(trans.read_text() + "20-205-0007\n")
    with pytest.raises(DataError, match=r"20-205.trans.txt', line 3: expected '<speaker>-<chapter>-<utt> "):
        corpus(_BPE, path=str(tree))
    trans.write_text(trans.read_text().replace("20-205-0007\n", "20-205-0000 AGAIN\n"))
    with pytest.raises(DataError, match="line 3: utterance 20-205-0000 of train-other-500 is listed twice"):
        corpus(_BPE, path=str(tree))
    trans.write_text(trans.read_text().replace("20-205-0000 AGAIN\n", "20-205-0009 CAT\n"))
    dataset = corpus(_BPE, path=str(tree), seq_ordering="sorted")
    dataset.init_seq_order(1)
    with pytest.raises(DataError, match=r"audio of 'train-other-500-20-205-0009', '.*/20-205-0009.flac'"):
        dataset.epoch_seq_lengths()
    with zipfile.ZipFile(tmp_path / "train-clean-100.zip", "w") as archive:
        archive.writestr("LibriSpeech/train-clean-100/1/2/1-2.trans.txt", "1-2-0000 A\n")
        archive.writestr("README.TXT", "not here")
    with pytest.raises(DataError, match="has member 'README.TXT' outside LibriSpeech/"):
        corpus(_BPE, path=str(tmp_path), use_zip=True)


def test_leading_zeros_and_number_order_follow_returnn(tree):
    """Speaker 103 sorts after 19 (numbers, not text), and '0019' in a list means the folder '19'."""
    dataset = corpus({**_BPE, "audio": None}, path=str(tree), seq_ordering="default", partition_epoch=1)
    dataset.init_seq_order(1)
    tags = [dataset.get_seq_tag(i) for i in range(dataset.num_seqs)]
    assert tags[:3] == [f"train-clean-100-19-198-000{n}" for n in (1, 2, 5)]
    assert tags[3] == "train-clean-100-103-1240-0000"
    trans = tree / "train-clean-100" / "19" / "198" / "19-198.trans.txt"
    trans.write_text(trans.read_text().replace("19-198-0001", "0019-198-1"))
    dataset = corpus(_BPE, path=str(tree), seq_ordering="default", partition_epoch=1)
    assert all_seqs(dataset, 1)[0][0] == "train-clean-100-19-198-0001"


def test_batches_hold_the_sequences(zips):
    from engine.datasets.batching import BatchOptions, generate_batches

    dataset = corpus(F.CASES["zip_ogg_laplace_new_filter"], zips)
    for epoch in F.EPOCHS:
        expected = dict(all_seqs(dataset, epoch))
        batches = list(generate_batches(dataset, BatchOptions(batch_size=80, max_seqs=2)))
        assert sorted(tag for b in batches for tag in b.seq_tags) == sorted(expected)
        for batch in batches:
            for row, tag in enumerate(batch.seq_tags):
                for key in ("data", "classes"):
                    got = batch.data[key][row, :batch.lengths[key][row]]
                    np.testing.assert_array_equal(got, expected[tag][key])


def test_oggzip_config_and_bpe_learner():
    """configs/speech_ctc_oggzip.py's datasets have no option without a verdict; the demo's BPE learner
    merges as subword-nmt does (most frequent pair, ties to the larger pair)."""
    sys.path.insert(0, str(ROOT / "demos"))
    import make_oggzip_corpus

    spec = hdf_dump_parity.dataset_spec(FIXTURES)
    assert spec["path"] == os.path.join(FIXTURES, "oggzip", "train.zip")
    assert {f.verdict for f in dataset_findings(spec)} == {"implemented", "no effect"}
    codes = make_oggzip_corpus.learn_bpe(["ONE ONE NINE", "SEVEN NINE"], 4)
    assert codes == [("N", "E</w>"), ("O", "NE</w>"), ("N", "I"), ("NI", "NE</w>")]
