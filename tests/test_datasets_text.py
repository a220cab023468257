"""LmDataset and TranslationDataset against what RETURNN yields on the same files
(tests/fixtures/returnn_text/, made by benchmarks/returnn_text_fixtures.py; RETURNN is not needed here),
plus the refusals, errors naming files, hdf-dump, batching and a MetaDataset joining them by tag."""
import json
import sys

import numpy as np
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import returnn_text_fixtures as F  # noqa: E402

from engine.datasets.factory import create_dataset  # noqa: E402
from engine.runtime.errors import DataError  # noqa: E402

FIXTURES = str(ROOT / "tests" / "fixtures" / "returnn_text")
with open(f"{FIXTURES}/returnn.json") as _f:
    RECORD = json.load(_f)
CASES = F.all_cases()


def make(case, **changes):
    cls, options = CASES[case] if isinstance(case, str) else case
    return create_dataset({"class": cls, **F.resolve(options, FIXTURES), **changes})


@pytest.mark.parametrize("case", sorted(CASES))
def test_dataset_equals_returnn(case):
    expected = RECORD["cases"][case]
    dataset = make(case)
    assert sorted(dataset.data_keys) == expected["keys"]
    assert {k: [dataset.get_data_dim(k), 1] for k in dataset.data_keys} == \
        {k: v for k, v in expected["num_outputs"].items() if k in expected["keys"]}
    assert dataset.labels == expected["labels"]
    for epoch in F.EPOCHS:
        seqs = F.engine_seqs(dataset, epoch)
        assert [tag for tag, _ in seqs] == [tag for tag, _ in expected[str(epoch)]], epoch
        lengths = dataset.epoch_seq_lengths()
        for i, ((tag, ours), (_, theirs)) in enumerate(zip(seqs, expected[str(epoch)])):
            assert sorted(ours) == sorted(theirs), tag
            assert list(lengths[i]) == [len(ours[k]) for k in dataset.data_keys], tag
            for key, arr in ours.items():
                assert (arr.dtype.name, arr.tolist()) == (expected["dtypes"][key], theirs[key]), \
                    (epoch, tag, key)
    dataset.close()


def test_the_cases_cover_what_the_published_setups_use():
    """RETURNN's orders with partition_epoch 2, word and BPE vocabularies; RETURNN ran out of sequences
    where it skipped some (and then fails on the next read); the classes' dim is the target vocabulary's
    (num_outputs), where RETURNN's get_data_dim says the source's."""
    orders = {opts.get("seq_ordering", "default") for _, opts in CASES.values()
              if opts.get("partition_epoch") == 2}
    assert {"random", "sorted", "laplace:.4", "laplace:.3"} <= orders
    assert RECORD["cases"]["words_skip_sorted"].get("runs_out")
    tr = RECORD["cases"]["tr_random"]
    assert tr["num_outputs"]["classes"] == [16, 1] and tr["get_data_dim"]["classes"] == 14


@pytest.mark.parametrize("case", sorted(F.FAILING))
def test_what_returnn_fails_on_is_refused(case):
    assert RECORD["failing"][case].startswith("TypeError")
    with pytest.raises(DataError, match="RETURNN"):
        make(F.FAILING[case])


_LM = {"corpus_file": f"{FIXTURES}/a.txt", "orth_symbols_file": f"{FIXTURES}/words.syms",
       "word_based": True, "seq_end_symbol": "<sb>", "unknown_symbol": "<unk>"}
_TR = {"path": f"{FIXTURES}/tr", "file_postfix": "train", "unknown_label": "<UNK>"}


@pytest.mark.parametrize("cls, options, message", [
    ("LmDataset", {**_LM, "phone_info": {"lexicon_file": "x"}},
     "phone_info is not implemented: it turns words"),
    ("LmDataset", {**_LM, "add_random_phone_seqs": 2}, "add_random_phone_seqs needs phone_info"),
    ("LmDataset", {**_LM, "orth_post_process": "english_cleaners"}, "RETURNN's text cleaners"),
    ("LmDataset", {**_LM, "orth_symbols_map_file": f"{FIXTURES}/words.map"},
     "either orth_symbols_file or"),
    ("LmDataset", {"corpus_file": "x", "orth_vocab": {"vocab_file": f"{FIXTURES}/words.syms"},
                   "parse_orth_opts": {"word_based": True}}, "parse_orth_opts cannot be given with it"),
    ("LmDataset", {"corpus_file": "x"}, "needs its labels"),
    ("LmDataset", {**_LM, "auto_replace_unknown_symbol": True, "unknown_symbol": "<oov>"},
     "needs unknown_symbol '<oov>' in the vocabulary"),
    ("LmDataset", {**_LM, "add_delayed_seq_data": True},
     "delayed_seq_data_start_symbol '[START]' is not in"),
    ("LmDataset", {**_LM, "parse_orth_opts": {"lowercase": True}}, "['lowercase'] are not options"),
    ("LmDataset", {**_LM, "dtype": "float32"}, "dtype 'float32' cannot hold the label indices 0..20"),
    ("LmDataset", {**_LM, "orth_replace_map_file": f"{FIXTURES}/words.map"}, "is not JSON"),
    ("TranslationDataset", {**_TR, "unknown_label": "<unk>"}, "unknown_label '<unk>' is not in"),
    ("TranslationDataset", {**_TR, "file_postfix": "eval"}, "tr/source.eval' (or"),
    ("TranslationDataset", {**_TR, "path": f"{FIXTURES}/a.txt"}, "is not a directory"),
    ("TranslationFactorsDataset", _TR,
     "'TranslationFactorsDataset' is not implemented: it splits every word"),
    ("ConfusionNetworkDataset", _TR, "'ConfusionNetworkDataset' is not implemented"),
])
def test_refusals_name_the_option(cls, options, message):
    with pytest.raises(DataError) as info:
        create_dataset({"class": cls, **options})
    assert message in str(info.value)


def test_bad_corpora_are_errors_naming_file_and_line(tmp_path):
    lm = create_dataset({"class": "LmDataset", **_LM, "corpus_file": str(tmp_path / "none.txt")})
    with pytest.raises(DataError, match="corpus file '.*none.txt' cannot be read"):
        lm.init_seq_order(1)
    lm = create_dataset({"class": "LmDataset", **_LM})  # 'zebra' is not a word of the vocabulary
    # in its file's ninth line, which is 'line-7': the empty line before is no sequence (as in RETURNN)
    with pytest.raises(DataError, match=r"sequence 'line-7' of '.*a.txt': symbol 'zebra' of .* not in the "):
        lm.init_seq_order(1)
    lm = create_dataset({"class": "LmDataset", **_LM, "seq_list_file": f"{FIXTURES}/list_c.pkl"})
    with pytest.raises(DataError, match="lists 5 tags, but the corpus has 35 sequences"):
        lm.init_seq_order(1)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    lm = create_dataset({"class": "LmDataset", **_LM, "corpus_file": str(tmp_path / "latin1.txt")})
    with pytest.raises(DataError, match="latin1.txt', its line b'caf\\\\xe9'...: not UTF-8"):
        lm.init_seq_order(1)
    tr = create_dataset({"class": "TranslationDataset", **_TR, "unknown_label": None})
    with pytest.raises(DataError, match=r"tr/source.train', line 1: word 'wort' is not in .*source.vocab"):
        tr.init_seq_order(1)
    (tmp_path / "source.x").write_text("a\nb\n")
    (tmp_path / "target.x").write_text("a\n")
    for prefix in ("source", "target"):
        (tmp_path / f"{prefix}.vocab.pkl").write_bytes((ROOT / FIXTURES / "tr" / "source.vocab.pkl")
                                                       .read_bytes())
    tr = create_dataset({"class": "TranslationDataset", "path": str(tmp_path), "file_postfix": "x",
                         "unknown_label": "<UNK>"})
    with pytest.raises(DataError, match="the same number of lines.*source.x': 2.*target.x': 1"):
        tr.init_seq_order(1)


def test_hdf_dump_writes_the_datasets(tmp_path):
    from engine.datasets.hdf_reader import HDFDataset
    from engine.tools.hdf_dump import main as hdf_dump

    for case in ("words_laplace", "tr_random"):
        cls, options = CASES[case]
        spec = {"class": cls, **F.resolve(options, FIXTURES)}
        out = tmp_path / f"{case}.hdf"
        assert hdf_dump([repr(spec), str(out), "--epoch", "2"]) == 0
        expected = F.engine_seqs(create_dataset(spec), 2)
        dumped = HDFDataset([str(out)])
        seqs = F.engine_seqs(dumped, 1)
        assert [t for t, _ in seqs] == [t for t, _ in expected]
        assert "data" not in dumped.labels  # RETURNN's dump stores no label names for the input
        for (_, ours), (_, theirs) in zip(seqs, expected):
            assert all(ours[k].tolist() == theirs[k].tolist() for k in theirs)


def test_batches_hold_the_sequences():
    from engine.datasets.batching import BatchOptions, generate_batches

    dataset = make("words_random")
    for epoch in F.EPOCHS:
        expected = dict(F.engine_seqs(dataset, epoch))
        batches = list(generate_batches(dataset, BatchOptions(batch_size=40, max_seqs=4)))
        assert sorted(tag for b in batches for tag in b.seq_tags) == sorted(expected)
        for batch in batches:
            for row, tag in enumerate(batch.seq_tags):
                for key in ("data", "delayed"):
                    frames = batch.data[key][row, :batch.lengths[key][row]]
                    assert frames.tolist() == expected[tag][key].tolist()


def test_meta_dataset_joins_them_by_tag(tmp_path):
    """The published speech-translation setups join a TranslationDataset by its tags 'line-N'; a
    MetaDataset renames LmDataset's keys (the delayed words as 'data')."""
    from engine.datasets.base import DataKeyInfo
    from engine.datasets.hdf_writer import HDFWriter

    features = tmp_path / "feat.hdf"
    tags = [f"line-{i}" for i in (5, 0, 17, 3)]
    with HDFWriter(str(features), {"data": DataKeyInfo(dim=2)}) as writer:
        for i, tag in enumerate(tags):
            writer.insert(tag, {"data": np.full((i + 2, 2), i, np.float32)})
    translation = {"class": "TranslationDataset", **F.resolve(F.TRANSLATION_CASES["tr_random"], FIXTURES)}
    meta = create_dataset({"class": "MetaDataset", "seq_order_control_dataset": "speech",
                           "datasets": {"speech": {"class": "HDFDataset", "files": [str(features)]},
                                        "translation": translation},
                           "data_map": {"data": ("speech", "data"), "source_text": ("translation", "data"),
                                        "classes": ("translation", "classes")}})
    alone = create_dataset(translation)
    by_tag = {t: d for t, d in RECORD["cases"]["tr_random"]["1"] + RECORD["cases"]["tr_random"]["2"]}
    meta.init_seq_order(1)
    assert [meta.get_seq_tag(i) for i in range(meta.num_seqs)] == tags and alone.corpus_num_seqs == 18
    for i, tag in enumerate(tags):
        assert meta.get_data(i, "source_text").tolist() == by_tag[tag]["data"]
        assert meta.get_data(i, "classes").tolist() == by_tag[tag]["classes"]

    lm_case = F.LM_CASES["words_laplace"]
    lm = {"class": "LmDataset", **F.resolve(lm_case, FIXTURES)}
    meta = create_dataset({"class": "MetaDataset", "datasets": {"lm": lm},
                           "seq_order_control_dataset": "lm",
                           "data_map": {"data": ("lm", "delayed"), "classes": ("lm", "data")}})
    for epoch in F.EPOCHS:
        meta.init_seq_order(epoch)
        expected = RECORD["cases"]["words_laplace"][str(epoch)]
        assert [meta.get_seq_tag(i) for i in range(meta.num_seqs)] == [t for t, _ in expected]
        for i, (tag, data) in enumerate(expected):
            assert meta.get_data(i, "data").tolist() == data["delayed"], tag
            assert meta.get_data(i, "classes").tolist() == data["data"], tag


def test_lm_config_trains_on_data_delayed(capsys, tmp_path):
    """configs/lm_text.py, as RETURNN's LM setups: the network reads 'data:delayed' and trains on 'data'."""
    from engine.main import main

    config = str(ROOT / "configs" / "lm_text.py")
    assert main([config, "--check"]) == 0
    out = capsys.readouterr().out
    assert "LmDataset: orth_symbols_map_file" in out and out.rstrip().endswith("Training would start.")
    assert main([config, "++model", str(tmp_path / "model")]) == 0
    out = capsys.readouterr().out
    assert "train epoch 1, finished after 2 steps" in out and "dev: score" in out
    assert (tmp_path / "model.001").exists()


def test_a_meta_dataset_reads_its_control_lm_dataset_as_it_reads_itself():
    """auto_replace_unknown_symbol makes RETURNN's labels depend on the lines labelled before (an unknown
    word joins the replace map, and the map is applied again: 'hi' -> 'hello' -> 'world' then). RETURNN's
    MetaDataset reads its control dataset's epochs, so through it every line has the labels the LmDataset
    gives alone (checked with RETURNN 1.20261022 on this config: 63 sequences of epochs 1-3 equal, and
    equal to this engine's); the engine's corpus-wide labels (the MetaDataset's construction reads them)
    must not change them either."""
    import runpy

    lm = runpy.run_path(str(ROOT / "configs" / "lm_text.py"))["train"]
    alone = create_dataset(lm)
    meta = create_dataset({"class": "MetaDataset", "datasets": {"lm": lm}, "seq_order_control_dataset": "lm",
                           "data_map": {"data": ("lm", "delayed"), "classes": ("lm", "data")}})
    for epoch in (1, 2, 3):
        alone.init_seq_order(epoch)
        meta.init_seq_order(epoch)
        assert meta.num_seqs == alone.num_seqs
        for i in range(alone.num_seqs):
            assert meta.get_seq_tag(i) == alone.get_seq_tag(i)
            assert meta.get_data(i, "classes").tolist() == alone.get_data(i, "data").tolist(), (epoch, i)
            assert meta.get_data(i, "data").tolist() == alone.get_data(i, "delayed").tolist(), (epoch, i)
