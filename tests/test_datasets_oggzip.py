"""OggZipDataset and the target vocabularies against what RETURNN yields on the same files
(tests/fixtures/returnn_oggzip/, made by benchmarks/returnn_oggzip_fixtures.py; RETURNN is not needed
here), plus the corpus layouts, the refusals and hdf-dump."""
import json
import shutil
import sys
import zipfile

import numpy as np
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import returnn_oggzip_fixtures as F  # noqa: E402

from engine.datasets.factory import create_dataset, dataset_findings  # noqa: E402
from engine.datasets.vocabulary import create_vocabulary  # noqa: E402
from engine.runtime.errors import DataError  # noqa: E402

FIXTURES = str(ROOT / "tests" / "fixtures" / "returnn_oggzip")
with open(f"{FIXTURES}/returnn.json") as _f:
    RECORD = json.load(_f)


@pytest.fixture(scope="module")
def returnn_arrays():
    with np.load(f"{FIXTURES}/returnn.npz") as arrays:
        return dict(arrays)


def oggzip(options, **changes):
    return create_dataset({"class": "OggZipDataset", **F.resolve(options, FIXTURES), **changes})


def all_seqs(dataset, epoch):
    dataset.init_seq_order(epoch)
    return [(dataset.get_seq_tag(i), {k: dataset.get_data(i, k) for k in dataset.data_keys})
            for i in range(dataset.num_seqs)]


@pytest.mark.parametrize("case", sorted(F.CASES))
def test_dataset_equals_returnn(case, returnn_arrays):
    expected = RECORD["cases"][case]
    dataset = oggzip(F.CASES[case])
    assert {k: dataset.get_data_dim(k) for k in dataset.data_keys} == expected["dims"]
    for epoch in F.EPOCHS:
        seqs = all_seqs(dataset, epoch)
        assert [tag for tag, _ in seqs] == expected[str(epoch)], epoch
        for i, (tag, data) in enumerate(seqs):
            assert list(dataset.epoch_seq_lengths()[i]) == [len(data[k]) for k in dataset.data_keys], tag
            for key, ours in data.items():
                theirs = returnn_arrays[f"{case}/{epoch}/{i}/{key}"]
                assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), (epoch, tag, key)
                if ours.dtype.kind == "f":
                    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * np.abs(theirs).max(),
                                               err_msg=f"epoch {epoch} {tag} {key}")
                else:
                    np.testing.assert_array_equal(ours, theirs, err_msg=f"epoch {epoch} {tag} {key}")


@pytest.mark.parametrize("case", sorted(F.VOCAB_CASES))
def test_vocabulary_equals_returnn(case):
    vocab = create_vocabulary(F.resolve(F.VOCAB_CASES[case], FIXTURES))
    expected = RECORD["vocabs"][case]
    assert vocab.num_labels == expected["num_labels"] and vocab.labels == expected["labels"]
    assert [vocab.get_seq(text) for text in F.TEXTS] == expected["seqs"]
    assert [vocab.unknown_label_id, vocab.bos_label_id, vocab.eos_label_id, vocab.pad_label_id,
            vocab.control_symbol_ids] == expected["ids"]


def test_the_random_case_draws_in_epoch_order():
    """random_permute changes lengths, so they come from the features of the whole epoch, computed in order:
    reading the second sequence first gives RETURNN's features all the same."""
    dataset = oggzip(F.CASES["random_audio"])
    dataset.init_seq_order(1)
    late_first = [dataset.get_data(i, "data") for i in reversed(range(dataset.num_seqs))][::-1]
    dataset.init_seq_order(1)
    in_order = [dataset.get_data(i, "data") for i in range(dataset.num_seqs)]
    assert all(np.array_equal(a, b) for a, b in zip(late_first, in_order))
    from engine.datasets.oggzip_corpus import audio_info

    headers = [audio_info(dataset.corpus.audio_bytes(i), "")[:2] for i in dataset.order]
    assert [len(x) for x in in_order] != [dataset.features.num_frames(*h) for h in headers]


def test_directory_and_unprefixed_and_several_zips_give_the_same_data(tmp_path):
    options = {**F.CASES["mfcc_bpe"], "partition_epoch": 1, "seq_ordering": "default"}
    reference = all_seqs(oggzip(options), 1)
    with zipfile.ZipFile(f"{FIXTURES}/corpus.zip") as archive:
        archive.extractall(tmp_path / "plain")
        flat = tmp_path / "flat.zip"
        with zipfile.ZipFile(flat, "w") as out:
            for name in archive.namelist():
                out.writestr(name.split("/")[-1], archive.read(name))
    layouts = [
        {"path": str(tmp_path / "plain" / "corpus")},
        {"path": str(flat), "content_name": "corpus", "zip_audio_files_have_name_as_prefix": False},
    ]
    for layout in layouts:
        seqs = all_seqs(oggzip(options, **layout), 1)
        assert [t for t, _ in seqs] == [t for t, _ in reference], layout
        for (_, ours), (_, theirs) in zip(seqs, reference):
            assert all(np.array_equal(ours[k], theirs[k]) for k in theirs), layout
    shutil.copy(f"{FIXTURES}/corpus.zip", tmp_path / "other.zip")
    both = oggzip(options, path=[f"{FIXTURES}/corpus.zip", str(tmp_path / "other.zip")],
                  content_name="corpus")
    both.init_seq_order(1)
    assert both.num_seqs == 8 and both.get_seq_tag(4) == "corpus/utt0"


def test_hdf_dump_writes_the_dataset(tmp_path):
    from engine.datasets.hdf_reader import HDFDataset
    from engine.tools.hdf_dump import main as hdf_dump

    options = {"class": "OggZipDataset", **F.resolve(F.CASES["logmel_chars"], FIXTURES)}
    out = tmp_path / "dump.hdf"
    assert hdf_dump([repr(options), str(out), "--epoch", "2"]) == 0
    dataset = create_dataset(options)
    expected = all_seqs(dataset, 2)
    dumped = HDFDataset([str(out)])
    assert dumped.labels["classes"] == dataset.labels["classes"]
    assert [t for t, _ in all_seqs(dumped, 1)] == [t for t, _ in expected]
    for (_, ours), (_, theirs) in zip(all_seqs(dumped, 1), expected):
        assert all(np.array_equal(ours[k], theirs[k]) for k in ("data", "classes"))
    assert "orth" not in dumped.data_keys  # RETURNN's dump leaves the text out too


@pytest.mark.parametrize("change, message", [
    ({"path": "/nonexistent/x.zip"}, "zip file '/nonexistent/x.zip' does not exist"),
    ({"path": f"{FIXTURES}/bpe02.codes"}, "neither a .zip nor a .txt.gz"),
    ({"audio": {"features": "raw_ogg"}}, "features 'raw_ogg' is not implemented: it decodes Ogg Vorbis"),
    ({"audio": {"features": "f0"}}, "'pyworld'"),
    ({"audio": {"num_channels": 2}}, "option 'num_channels' is not implemented"),
    ({"audio": {"window": 3}}, "unknown option(s) 'window'"),
    ({"audio": {"feature_options": {"n_mel": 3}}}, "'n_mel' are not options of features 'mfcc'"),
    ({"audio": {"random_permute": {"rnd_zoom_switch": 0, "rnd_zoom_lower": 0.5}}}, "would never be used"),
    ({"audio": {"norm_mean": [1.0, 2.0]}}, "expected 40 values"),
    ({"targets": {"class": "SamplingBytePairEncoding"}}, "'SamplingBytePairEncoding' is not implemented"),
    ({"targets": {"vocab_file": f"{FIXTURES}/words.vocab"}}, "unknown_label 'UNK' is not in the vocabulary"),
    ({"targets": {"vocab_file": f"{FIXTURES}/words.vocab", "unknown_label": "<unk>", "bos_label": "<s>"}},
     "bos_label '<s>' is not in the vocabulary"),
    ({"targets_post_process": "english_cleaners"}, "RETURNN's text cleaners"),
    ({"fixed_random_subset": 1.5}, "fixed_random_subset must be a fraction"),
    ({"epoch_wise_filter": {(1, 2): {"max_len": 3}}}, "knows only max_mean_len"),
    ({"segment_file": "/nonexistent/segments"}, "segment_file '/nonexistent/segments' cannot be read"),
])
def test_bad_options_are_refused_by_name(change, message):
    with pytest.raises(DataError) as info:
        oggzip(F.CASES["mfcc_bpe"], **change)
    assert message in str(info.value)


def test_unknown_words_without_unknown_label_name_the_sequence():
    targets = {"vocab_file": f"{FIXTURES}/words.vocab", "unknown_label": None}
    dataset = oggzip(F.CASES["text_words"], targets=targets)
    dataset.init_seq_order(1)
    with pytest.raises(DataError, match=r"sequence 'corpus/utt\d'.*'zebra' is not in the vocabulary"):
        dataset.epoch_seq_lengths()


def test_text_only_and_options_without_effect():
    dataset = oggzip(F.CASES["text_words"], audio=None, targets=None)
    assert dataset.data_keys == ["orth"]
    spec = {"class": "OggZipDataset", "path": "x.zip", "audio": None, "targets": None,
            "use_cache_manager": True}
    findings = {f.name: f.verdict for f in dataset_findings(spec)}
    assert findings["use_cache_manager"] == "no effect"
    with pytest.raises(DataError, match="required option.*'audio'"):
        create_dataset({"class": "OggZipDataset", "path": f"{FIXTURES}/corpus.zip", "targets": None})


@pytest.mark.parametrize("chunking", [None, "20:15"])
def test_batches_hold_the_sequences(chunking):
    """What the training loop reads (rnn.py with this dataset and configs/speech_ctc.py's network trains:
    the command is in the OggZipDataset docs; a run takes longer than this suite's budget)."""
    from engine.datasets.batching import BatchOptions, generate_batches

    options = {**F.CASES["mfcc_bpe"], "chunking": chunking}
    dataset = oggzip(options)
    for epoch in F.EPOCHS:
        expected = dict(all_seqs(dataset, epoch))
        keys = None if chunking is None else ["data"]  # the labels' rate is not the features'
        batches = list(generate_batches(dataset, BatchOptions(batch_size=120, max_seqs=2), keys=keys))
        assert {tag for b in batches for tag in b.seq_tags} == set(expected)
        for batch in batches:
            for row, tag in enumerate(batch.seq_tags):
                frames = batch.data["data"][row, :batch.lengths["data"][row]]
                if chunking is None:
                    np.testing.assert_array_equal(frames, expected[tag]["data"])
                    orth = batch.data["orth"][row, :batch.lengths["orth"][row]]
                    assert list(orth) == list(expected[tag]["orth"])
                else:
                    assert any(np.array_equal(frames, expected[tag]["data"][s:s + len(frames)])
                               for s in range(0, len(expected[tag]["data"]), 15))


def _encoded(tmp_path, name: str, samples: np.ndarray, rate: int, fmt: str, subtype: str | None) -> bytes:
    import soundfile
    path = tmp_path / name
    soundfile.write(str(path), samples, rate, format=fmt, subtype=subtype)
    return path.read_bytes()


@pytest.mark.parametrize("seconds,rate,channels", [(0.3, 16000, 1), (3.7, 16000, 1), (1.1, 8000, 2),
                                                   (2.0, 44100, 1)])
def test_vorbis_length_from_the_pages_equals_libsndfiles(tmp_path, seconds, rate, channels):
    import io
    import soundfile
    from engine.datasets.ogg_pages import vorbis_length
    noise = np.random.RandomState(0).uniform(-0.3, 0.3, (int(seconds * rate), channels)).squeeze()
    data = _encoded(tmp_path, "a.ogg", noise, rate, "OGG", "VORBIS")
    info = soundfile.info(io.BytesIO(data))
    assert vorbis_length(data) == (info.frames, info.samplerate, info.channels)
    assert vorbis_length(data)[0] == len(soundfile.read(io.BytesIO(data))[0])


def test_vorbis_length_leaves_other_files_to_libsndfile(tmp_path):
    import soundfile
    from engine.datasets.ogg_pages import vorbis_length
    noise = np.random.RandomState(0).uniform(-0.3, 0.3, 16000)
    vorbis = _encoded(tmp_path, "a.ogg", noise, 16000, "OGG", "VORBIS")
    assert vorbis_length(vorbis[:len(vorbis) // 2]) is None  # truncated
    assert vorbis_length(vorbis[:4] + b"\x01" + vorbis[5:]) is None  # not version 0
    assert vorbis_length(vorbis + vorbis) is None  # chained: a second stream's pages
    assert vorbis_length(_encoded(tmp_path, "a.flac", noise, 16000, "FLAC", None)) is None
    assert vorbis_length(_encoded(tmp_path, "a.wav", noise, 16000, "WAV", None)) is None
    if "OPUS" in soundfile.available_subtypes("OGG"):
        assert vorbis_length(_encoded(tmp_path, "a.opus", noise, 48000, "OGG", "OPUS")) is None
