"""Fixtures for LibriSpeechCorpus, made by RETURNN itself, and a check of this engine against them; and
RETURNN's HDF dump of an OggZipDataset against this engine's ``hdf-dump`` (``hdf_dump_parity.py``).

    python benchmarks/returnn_librispeech_fixtures.py           # write tests/fixtures/returnn_librispeech/
    python benchmarks/returnn_librispeech_fixtures.py --check   # compare with the stored fixtures only

The inputs are made here: a tiny LibriSpeech tree ``LibriSpeech/<subdir>/<speaker>/<chapter>/`` with
``.trans.txt`` lists and ``.flac`` audio (tones with a little noise, numpy) plus the ``.flac.ogg`` copies
of ``use_ogg``: ``train-clean-100`` (speakers 19 and 103, six utterances), ``train-other-500`` (two) and
``dev-clean`` (two); its zips (``make_zips``, made again by the tests from the stored tree); a
hand-written BPE codes file and vocabularies. RETURNN (``$RETURNN_PYTHON``) reads every case of
``CASES`` for epochs 1 and 2; its tags and arrays go to ``returnn.json`` / ``returnn.npz``.
tests/test_datasets_librispeech.py replays them.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hdf_dump_parity  # noqa: E402
from dataset_parity import compare_epochs  # noqa: E402
from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "returnn_librispeech")
EPOCHS = (1, 2)
SAMPLE_RATE = 16000
UTTERANCES = [  # (subdir, speaker, chapter, utt, seconds, tone Hz, transcription)
    ("train-clean-100", 19, 198, 1, 0.30, 220.0, "HELLO WORLD"),
    ("train-clean-100", 19, 198, 2, 0.40, 330.0, "THE CAT SAT ON THE MAT"),
    ("train-clean-100", 19, 198, 5, 0.25, 440.0, "HELLO THERE CAT"),
    ("train-clean-100", 103, 1240, 0, 0.35, 550.0, "A DOG AND A CAT"),
    ("train-clean-100", 103, 1240, 1, 0.30, 260.0, "THE DOG SAT"),
    ("train-clean-100", 103, 1241, 0, 0.45, 390.0, "THAT CAT AND THE WORLD"),
    ("train-other-500", 20, 205, 0, 0.30, 300.0, "HELLO CAT"),
    ("train-other-500", 20, 205, 1, 0.35, 480.0, "THE MAT AND A DOG"),
    ("dev-clean", 84, 121123, 0, 0.30, 350.0, "HELLO DOG"),
    ("dev-clean", 84, 121123, 2, 0.40, 250.0, "THE WORLD SAT ON A MAT"),
]
BPE_CODES = ["#version: 0.2", "H E", "L L", "HE LL", "HELL O</w>", "T H", "TH E</w>", "C A", "CA T</w>",
             "W O", "WO R", "WOR L", "WORL D</w>", "A T</w>", "S AT</w>", "O N</w>", "M AT</w>", "D O",
             "DO G</w>", "TH AT</w>"]
BPE_VOCAB = ["<unk>", "</s>", "HELLO", "THE", "CAT", "WORLD", "SAT", "ON", "MAT", "A", "DOG", "THAT", "A@@",
             "N@@", "D", "R@@", "E", "TH@@", "HE@@", "T", "H@@", "E@@", "AT"]
WORDS = ["<unk>", "</s>", "hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog"]
CHARS = ["@", " "] + list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def add_noise(audio, sample_rate, random_state):
    """A ``pre_process`` both sides use: noise from the dataset's generator."""
    return audio + random_state.normal(0.0, 0.01, size=audio.shape)


def lower(text):
    """An ``orth_post_process`` both sides use."""
    return text.lower()


FUNCTIONS = {"@add_noise": add_noise, "@lower": lower}
_BPE = {"bpe_file": "{dir}/bpe.codes", "vocab_file": "{dir}/bpe.vocab", "unknown_label": "<unk>",
        "seq_postfix": [1]}
CASES = {  # name -> LibriSpeechCorpus options; "{dir}": the fixture folder, "{zips}": the zips' folder
    "tree_bpe_random": {"path": "{dir}/LibriSpeech", "prefix": "train", "audio": {"num_feature_filters": 13},
                        "bpe": _BPE, "partition_epoch": 2, "seq_ordering": "random",
                        "use_cache_manager": False},
    "zip_ogg_laplace_new_filter": {
        "path": "{zips}", "prefix": "train", "use_zip": True, "use_ogg": True,
        "audio": {"features": "log_mel_filterbank", "num_feature_filters": 10, "norm_mean": "per_seq"},
        "targets": "bpe", "bpe": _BPE, "partition_epoch": 2, "seq_ordering": "laplace:.2",
        "epoch_wise_filter": {(1, 1): {"use_new_filter": True, "subdirs": ["train-clean-100"],
                                       "max_mean_len": 18},
                              (2, None): {"use_new_filter": True, "max_mean_len": 12}}},
    "dev_chars_sorted_tags": {
        "path": "{dir}/LibriSpeech", "prefix": "dev", "audio": {"features": "db_mel_filterbank",
                                                                "num_feature_filters": 8},
        "targets": "chars", "chars": {"vocab_file": "{dir}/chars.vocab"}, "seq_ordering": "sorted",
        "seq_tag_format": "%(subdir)s/%(speaker)i-%(chapter)i-%(seq)04i/%(speaker)i-%(chapter)i-%(seq)04i"},
    "words_old_filter_subset": {
        "path": "{dir}/LibriSpeech", "prefix": "train", "audio": None,
        "targets": {"vocab_file": "{dir}/words.vocab", "unknown_label": "<unk>"},
        "orth_post_process": "@lower",
        "fixed_random_subset": 7, "seq_ordering": "sorted_reverse",
        "epoch_wise_filter": {(1, 1): {"max_mean_len": 12},
                              (2, 2): {"subdirs": ["train-clean-100"], "max_mean_len": 15}}},
    "zip_noise_default": {
        "path": "{zips}", "prefix": "train-clean", "use_zip": True, "targets": "chars",
        "chars": {"vocab_file": "{dir}/chars.vocab"},
        "audio": {"num_feature_filters": 6, "pre_process": "@add_noise"},
        "partition_epoch": 2, "random_seed_offset": 3},
    "text_fraction_fixed_seed": {
        "path": "{dir}/LibriSpeech", "prefix": "train", "audio": None, "bpe": _BPE,
        "fixed_random_subset": 0.5,
        "fixed_random_seed": 5, "seq_ordering": "random", "partition_epoch": 2},
}


def resolve(value, folder, zips):
    """The options with ``{dir}``, ``{zips}`` and ``@function`` filled in."""
    if isinstance(value, dict):
        return {k: resolve(v, folder, zips) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, folder, zips) for v in value]
    if isinstance(value, str):
        return FUNCTIONS.get(value) or value.replace("{dir}", folder).replace("{zips}", zips)
    return value


# ----- the inputs -----
def make_inputs(folder: str) -> None:
    import soundfile

    tree = os.path.join(folder, "LibriSpeech")
    shutil.rmtree(tree, ignore_errors=True)
    rng = np.random.RandomState(0)
    chapters: dict[str, list[str]] = {}
    for subdir, speaker, chapter, utt, seconds, tone, text in UTTERANCES:
        where = os.path.join(tree, subdir, str(speaker), str(chapter))
        os.makedirs(where, exist_ok=True)
        name = f"{speaker}-{chapter}-{utt:04d}"
        t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
        samples = 0.4 * np.sin(2 * np.pi * tone * t) * np.hanning(len(t)) + 0.003 * rng.randn(len(t))
        soundfile.write(os.path.join(where, name + ".flac"), samples, SAMPLE_RATE, subtype="PCM_16")
        buffer = io.BytesIO()
        soundfile.write(buffer, samples, SAMPLE_RATE, format="OGG", subtype="VORBIS")
        with open(os.path.join(where, name + ".flac.ogg"), "wb") as f:
            f.write(buffer.getvalue())
        trans = os.path.join(where, f"{speaker}-{chapter}.trans.txt")
        chapters.setdefault(trans, []).append(f"{name} {text}")
    for path, lines in chapters.items():
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
    files = {"bpe.codes": BPE_CODES, "bpe.vocab": BPE_VOCAB, "words.vocab": WORDS, "chars.vocab": CHARS}
    for name, lines in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write("\n".join(lines) + "\n")


def make_zips(folder: str, out: str) -> None:
    """``<subdir>.zip`` holding ``LibriSpeech/<subdir>/...`` for each subdir of the stored tree, the layout of
    LibriSpeech's own archives (which hold the tar's files under ``LibriSpeech/``)."""
    tree = os.path.join(folder, "LibriSpeech")
    os.makedirs(out, exist_ok=True)
    for subdir in sorted(os.listdir(tree)):
        with zipfile.ZipFile(os.path.join(out, subdir + ".zip"), "w") as archive:
            for where, dirs, files in sorted(os.walk(os.path.join(tree, subdir))):
                dirs.sort()
                for name in sorted(files):
                    path = os.path.join(where, name)
                    archive.write(path, "LibriSpeech/" + os.path.relpath(path, tree))


# ----- the RETURNN side: runs under RETURNN's Python (``--returnn-side JOBS.json``) -----
def returnn_side(jobs_path: str) -> None:
    from returnn.datasets import init_dataset
    from returnn.log import log

    log.initialize(verbosity=[0])
    with open(jobs_path) as f:
        job = json.load(f)
    folder, zips, arrays, record = job["folder"], job["zips"], {}, {"cases": {}}
    for name in job["cases"]:
        dataset = init_dataset(dict(resolve(CASES[name], folder, zips), **{"class": "LibriSpeechCorpus"}))
        record["cases"][name], dummies = {}, set()
        for epoch in EPOCHS:
            dataset.init_seq_order(epoch=epoch)
            tags, i = [], 0
            while dataset.is_less_than_num_seqs(i):
                dataset.load_seqs(i, i + 1)
                tags.append(dataset.get_tag(i))
                for key in dataset.get_data_keys():
                    value = dataset.get_data(i, key)
                    if key == "raw" or value.ndim == 0:  # audio=None: 'data' is a dummy scalar
                        dummies.add(key)
                    else:
                        arrays[f"{name}/{epoch}/{i}/{key}"] = value
                i += 1
            record["cases"][name][str(epoch)] = tags
        record["cases"][name]["dims"] = {k: dataset.get_data_dim(k) for k in dataset.get_data_keys()
                                         if k not in dummies}
        record["cases"][name]["not_compared"] = sorted(dummies)
        record["cases"][name]["labels"] = list(dataset.labels.get("classes", []))
    record["hdf_read_back"] = hdf_dump_parity.returnn_dump(job["hdf_spec"], folder, job["engine_hdf"])
    np.savez_compressed(job["out"] + ".npz", **arrays)
    with open(job["out"] + ".json", "w") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)


# ----- this engine's side -----
def compare(folder: str, zips: str) -> list[str]:
    """Differences between the engine and the stored RETURNN output (empty: none)."""
    sys.path.insert(0, ROOT)
    from engine.datasets.factory import create_dataset

    with open(os.path.join(folder, "returnn.json")) as f:
        record = json.load(f)
    arrays = np.load(os.path.join(folder, "returnn.npz"))
    problems = []
    for name, expected in record["cases"].items():
        dataset = create_dataset(dict(resolve(CASES[name], folder, zips), **{"class": "LibriSpeechCorpus"}))
        before = list(problems)
        worst = compare_epochs(dataset, name, expected, arrays, EPOCHS, problems)
        if dataset.labels.get("classes", []) != expected["labels"]:
            problems.append(f"{name}: labels differ from RETURNN's")
        if worst > 1e-5:
            problems.append(f"{name}: features differ by {worst:.2e} (relative to the largest value)")
        verdict = "tags and labels equal" if problems == before else "DIFFERENT"
        print(f"{name:<27} epochs {EPOCHS}: {'/'.join(str(len(expected[str(e)])) for e in EPOCHS)} seqs, "
              f"{verdict}; features within {worst:.1e}")
    problems += hdf_dump_parity.compare(folder)
    read_back = record["hdf_read_back"]
    print(f"RETURNN's HDFDataset read both dumps ({read_back['seqs']} seqs; keys "
          f"{read_back['returnn_file_keys']} and {read_back['engine_file_keys']}): "
          f"{read_back['problems'] or 'the same'}")
    problems += [f"RETURNN reading the engine's dump: {p}" for p in read_back["problems"]]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare with the stored fixtures")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        zips = os.path.join(tmp, "zips")
        if not args.check:
            python = returnn_python()
            if python is None:
                return no_returnn("returnn_librispeech_fixtures", "no fixtures are made")
            os.makedirs(FIXTURES, exist_ok=True)
            make_inputs(FIXTURES)
            hdf_dump_parity.make_inputs(FIXTURES)
            make_zips(FIXTURES, zips)
            spec = hdf_dump_parity.dataset_spec(FIXTURES)
            hdf_dump_parity.engine_dump(spec, os.path.join(tmp, "engine.hdf"))
            jobs = os.path.join(tmp, "jobs.json")
            with open(jobs, "w") as f:
                json.dump({"folder": FIXTURES, "zips": zips, "cases": list(CASES),
                           "hdf_spec": spec, "engine_hdf": os.path.join(tmp, "engine.hdf"),
                           "out": os.path.join(FIXTURES, "returnn")}, f)
            run_returnn_side(python, __file__, jobs)
            with open(os.path.join(FIXTURES, "returnn.json")) as f:
                record = json.load(f)
            record["versions"] = returnn_versions(python)
            with open(os.path.join(FIXTURES, "returnn.json"), "w") as f:
                json.dump(record, f, indent=1, ensure_ascii=False)
        else:
            make_zips(FIXTURES, zips)
        problems = compare(FIXTURES, zips)
    for problem in problems:
        print("DIFFERENT:", problem)
    size = sum(os.path.getsize(os.path.join(where, n))
               for where, _, names in os.walk(FIXTURES) for n in names)
    print(f"{'all equal' if not problems else f'{len(problems)} differences'}; fixtures {size // 1024} KB")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
