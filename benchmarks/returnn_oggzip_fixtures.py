"""Fixtures for OggZipDataset and the target vocabularies, made by RETURNN itself, and a check of this
engine against them.

    python benchmarks/returnn_oggzip_fixtures.py           # write tests/fixtures/returnn_oggzip/, compare
    python benchmarks/returnn_oggzip_fixtures.py --check   # compare with the stored fixtures only

The inputs are made here: four short utterances (sine tones with a little noise, numpy) written as Ogg
Vorbis with soundfile into ``corpus.zip`` (``corpus.txt`` beside ``corpus/*.ogg``), a hand-written
subword-nmt codes file in both versions, word, character and dict-literal vocabularies, norm files, a
segment list, an upper-cased ``corpus.txt.gz`` and a small SentencePiece model. RETURNN (``$RETURNN_PYTHON``,
with librosa and sentencepiece installed) reads every dataset case of ``CASES`` for epochs 1 and 2 and
every vocabulary case of ``VOCAB_CASES`` on ``TEXTS``; what it yields is stored in ``returnn.npz`` (arrays)
and ``returnn.json`` (tags, label sequences, versions). tests/test_datasets_oggzip.py reads them.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
import tempfile
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataset_parity import compare_epochs  # noqa: E402
from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "returnn_oggzip")
EPOCHS = (1, 2)
SAMPLE_RATE = 16000
UTTERANCES = [  # (seconds, tone Hz, text)
    (0.45, 220.0, "hello world"),
    (0.60, 330.0, "the cat sat on the mat"),
    (0.50, 440.0, "hello there cat"),
    (0.55, 550.0, "a dog and a cat"),
]
TEXTS = ["hello world", "the cat sat on the mat", "hello   there  cat", "a dog and a cat", "wörld héllo",
         "$name { the cat } hello", "tat that hat", "x", "", "hello-world zz"]
BPE_CODES_02 = ["#version: 0.2", "h e", "l l", "he ll", "hell o</w>", "t h", "th e</w>", "c a", "ca t</w>",
                "w o", "wo r", "wor l", "worl d</w>", "a t</w>", "s at</w>", "o n</w>", "m at</w>",
                "th at</w>"]
BPE_VOCAB_02 = ["<unk>", "hello", "the", "cat", "wor@@", "d", "sat", "on", "mat", "a", "d@@", "o@@", "g",
                "t@@", "h@@", "e@@", "r@@", "e", "n@@", "at", "th@@", "ca@@", "t", "he@@", "l@@"]
BPE_CODES_01 = ["h e", "l l", "he ll", "hell o", "hello </w>", "c a", "ca t", "cat </w>", "a t", "t h",
                "th e", "the </w>", "h e"]
BPE_VOCAB_01 = ["<unk>", "</s>", "hello", "cat", "the", "a@@", "t", "h@@", "e@@", "l@@", "o", "w@@", "r@@",
                "d", "at", "he@@", "ca@@", "th@@", "s@@", "n", "o@@", "m@@"]
WORDS = ["<unk>", "</s>", "hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog", "and", "there",
         "the cat"]
CHARS = ["@", " "] + list("abcdefghijklmnopqrstuvwxyz")


def add_noise(audio, sample_rate, random_state):
    """A ``pre_process`` both sides use: noise from the dataset's generator."""
    return audio + random_state.normal(0.0, 0.01, size=audio.shape)


def lower(text):
    """A ``targets_post_process`` both sides use."""
    return text.lower()


FUNCTIONS = {"@add_noise": add_noise, "@lower": lower}
_BPE = {"bpe_file": "{dir}/bpe02.codes", "vocab_file": "{dir}/bpe02.vocab", "unknown_label": "<unk>"}
CASES = {  # name -> OggZipDataset options; "{dir}": the fixture folder, "@name": a function of FUNCTIONS
    "mfcc_bpe": {"path": "{dir}/corpus.zip", "audio": {}, "targets": _BPE,
                 "partition_epoch": 2, "seq_ordering": "random"},
    "logmel_chars": {"path": "{dir}/corpus.zip",
                     "audio": {"features": "log_mel_filterbank", "num_feature_filters": 20,
                               "with_delta": True,
                               "norm_mean": "{dir}/norm_mean.txt", "norm_std_dev": "{dir}/norm_std.txt"},
                     "targets": {"class": "CharacterTargets", "vocab_file": "{dir}/chars.vocab"},
                     "partition_epoch": 2, "seq_ordering": "random"},
    "random_audio": {"path": "{dir}/corpus.zip",
                     "audio": {"num_feature_filters": 13, "preemphasis": 0.97, "pre_process": "@add_noise",
                               "random_permute": {"rnd_zoom_switch": 0.6, "rnd_stretch_switch": 0.6,
                                                  "rnd_pitch_switch": 0.6},
                               "feature_options": {"n_mels": 40, "fmax": 7000}},
                     "targets": None, "partition_epoch": 2, "seq_ordering": "laplace:2",
                     "random_seed_offset": 3},
    "dbmel_join": {"path": "{dir}/corpus.zip",
                   "audio": {"features": "db_mel_filterbank", "num_feature_filters": 10, "join_frames": 3,
                             "norm_mean": "per_seq", "norm_std_dev": "per_seq", "peak_normalization": False,
                             "step_len": 0.0125, "window_len": 0.02},
                   "targets": {"class": "Utf8ByteTargets", "seq_postfix": [0]}, "seq_ordering": "sorted"},
    "loglog_delta2": {"path": "{dir}/corpus.zip",
                      "audio": {"features": "log_log_mel_filterbank", "num_feature_filters": 6,
                                "with_delta": 2,
                                "norm_mean": 1.5, "norm_std_dev": 2},
                      "targets": None, "seq_ordering": "sorted_reverse"},
    "linear": {"path": "{dir}/corpus.zip",
               "audio": {"features": "linear_spectrogram", "window_len": 0.005, "num_feature_filters": 40,
                         "feature_options": {"center": False}},
               "targets": None, "fixed_random_seed": 7, "seq_ordering": "random"},
    "text_spm": {"path": "{dir}/corpus.zip", "audio": None,
                 "targets": {"class": "SentencePieces", "model_file": "{dir}/spm.model"},
                 "seq_ordering": "sorted", "epoch_wise_filter": {(1, 1): {"max_mean_len": 49}}},
    "text_words": {"path": ["{dir}/corpus.zip", "{dir}/corpus.txt.gz"], "audio": None,
                   "targets": {"vocab_file": "{dir}/words.vocab", "unknown_label": "<unk>",
                               "seq_postfix": [1]},
                   "targets_post_process": "@lower", "segment_file": "{dir}/segments.txt",
                   "fixed_random_subset": 0.7, "fixed_random_subset_seed": 3,
                   "seq_ordering": "sorted_reverse"},
}
VOCAB_CASES = {
    "bpe02": _BPE,
    "bpe01_dict_postfix": {"bpe_file": "{dir}/bpe01.codes", "vocab_file": "{dir}/bpe01.vocab",
                           "unknown_label": "<unk>", "seq_postfix": [1]},
    "words": {"vocab_file": "{dir}/words.vocab", "unknown_label": "<unk>"},
    "words_single_ws": {"vocab_file": "{dir}/words.vocab", "unknown_label": "<unk>",
                        "single_whitespace_split": True},
    "chars": {"class": "CharacterTargets", "vocab_file": "{dir}/chars.vocab"},
    "words_repeated_line": {"vocab_file": "{dir}/words_repeated.vocab", "unknown_label": 0},
    "words_special_file": {"vocab_file": "{dir}/words.vocab", "special_symbols_via_file": "{dir}/special.txt",
                           "bos_label": 1, "control_symbols": {"end": "</s>"}},
    "utf8": {"class": "Utf8ByteTargets"},
    "spm": {"class": "SentencePieces", "model_file": "{dir}/spm.model"},
    "spm_bos_eos": {"class": "SentencePieces", "model_file": "{dir}/spm.model", "add_bos": True,
                    "add_eos": True},
}


def resolve(value, folder):
    """The options with ``{dir}`` and ``@function`` filled in."""
    if isinstance(value, dict):
        return {k: resolve(v, folder) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, folder) for v in value]
    if isinstance(value, str):
        return FUNCTIONS.get(value) or value.replace("{dir}", folder)
    return value


# ----- the inputs -----
def make_inputs(folder: str) -> None:
    import sentencepiece
    import soundfile

    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(0)
    entries = []
    with zipfile.ZipFile(os.path.join(folder, "corpus.zip"), "w") as archive:
        for i, (seconds, tone, text) in enumerate(UTTERANCES):
            t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
            samples = 0.4 * np.sin(2 * np.pi * tone * t) * np.hanning(len(t)) + 0.02 * rng.randn(len(t))
            buffer = io.BytesIO()
            soundfile.write(buffer, samples, SAMPLE_RATE, format="OGG", subtype="VORBIS")
            archive.writestr(f"corpus/utt{i}.ogg", buffer.getvalue())
            entries.append({"file": f"utt{i}.ogg", "seq_name": f"corpus/utt{i}", "text": text,
                            "duration": seconds})
        archive.writestr("corpus.txt", repr(entries))
    upper = [dict(e, text=e["text"].upper() + " ZEBRA") for e in entries]
    with gzip.open(os.path.join(folder, "corpus.txt.gz"), "wt") as f:
        f.write(repr(upper))
    files = {"bpe02.codes": BPE_CODES_02, "bpe02.vocab": BPE_VOCAB_02, "bpe01.codes": BPE_CODES_01,
             "words.vocab": WORDS, "chars.vocab": CHARS,
             "segments.txt": ["corpus/utt0", "corpus/utt2", "corpus/utt3"]}
    for name, lines in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write("\n".join(lines) + "\n")
    with open(os.path.join(folder, "words_repeated.vocab"), "w") as f:
        f.write("\n".join(WORDS + ["cat", "zebra"]) + "\n")
    with open(os.path.join(folder, "special.txt"), "w") as f:
        special = {"unknown_label": "<unk>", "eos_label": "</s>", "control_symbols": {"greeting": "hello"}}
        f.write(repr(special))
    with open(os.path.join(folder, "bpe01.vocab"), "w") as f:
        f.write(repr({label: i for i, label in enumerate(BPE_VOCAB_01)}))
    np.savetxt(os.path.join(folder, "norm_mean.txt"), np.linspace(-8, 2, 40))
    np.savetxt(os.path.join(folder, "norm_std.txt"), np.linspace(1, 3, 40))
    with tempfile.TemporaryDirectory() as tmp:
        text_file = os.path.join(tmp, "text.txt")
        with open(text_file, "w") as f:
            f.write("\n".join(u[2] for u in UTTERANCES for _ in range(20)) + "\n")
        sentencepiece.SentencePieceTrainer.train(
            input=text_file, model_prefix=os.path.join(folder, "spm"), vocab_size=30, model_type="bpe",
            normalization_rule_name="identity", character_coverage=1.0, minloglevel=2)
    os.remove(os.path.join(folder, "spm.vocab"))


# ----- the RETURNN side: runs under RETURNN's Python (``--returnn-side JOBS.json``) -----
def returnn_side(jobs_path: str) -> None:
    from returnn.datasets import init_dataset
    from returnn.datasets.util.vocabulary import Vocabulary
    from returnn.log import log

    log.initialize(verbosity=[0])
    with open(jobs_path) as f:
        job = json.load(f)
    folder, arrays, record = job["folder"], {}, {"cases": {}, "vocabs": {}}
    for name in job["cases"]:
        dataset = init_dataset(dict(resolve(CASES[name], folder), **{"class": "OggZipDataset"}))
        record["cases"][name] = {}
        for epoch in EPOCHS:
            dataset.init_seq_order(epoch=epoch)
            tags, i = [], 0
            while dataset.is_less_than_num_seqs(i):
                dataset.load_seqs(i, i + 1)
                tags.append(dataset.get_tag(i))
                for key in dataset.get_data_keys():
                    if key != "raw":
                        arrays[f"{name}/{epoch}/{i}/{key}"] = dataset.get_data(i, key)
                i += 1
            record["cases"][name][str(epoch)] = tags
        record["cases"][name]["dims"] = {k: dataset.get_data_dim(k) for k in dataset.get_data_keys()
                                         if k != "raw"}
    for name, opts in VOCAB_CASES.items():
        vocab = Vocabulary.create_vocab(**resolve(opts, folder))
        record["vocabs"][name] = {"seqs": [list(map(int, vocab.get_seq(t))) for t in TEXTS],
                                  "labels": list(vocab.labels), "num_labels": vocab.num_labels,
                                  "ids": [vocab.unknown_label_id, vocab.bos_label_id, vocab.eos_label_id,
                                          vocab.pad_label_id, vocab.control_symbol_ids]}
    np.savez_compressed(job["out"] + ".npz", **arrays)
    with open(job["out"] + ".json", "w") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)


# ----- this engine's side -----
def compare(folder: str) -> list[str]:
    """Differences between the engine and the stored RETURNN output (empty: none)."""
    sys.path.insert(0, ROOT)
    from engine.datasets.factory import create_dataset
    from engine.datasets.vocabulary import create_vocabulary

    with open(os.path.join(folder, "returnn.json")) as f:
        record = json.load(f)
    arrays = np.load(os.path.join(folder, "returnn.npz"))
    problems = []
    for name, expected in record["cases"].items():
        dataset = create_dataset(dict(resolve(CASES[name], folder), **{"class": "OggZipDataset"}))
        before = list(problems)
        worst = compare_epochs(dataset, name, expected, arrays, EPOCHS, problems)
        if worst > 1e-5:
            problems.append(f"{name}: features differ by {worst:.2e} (relative to the largest value)")
        verdict = "tags, labels and orth equal" if problems == before else "DIFFERENT"
        print(f"{name:<14} epochs {EPOCHS}: {sum(len(expected[str(e)]) for e in EPOCHS)} seqs, {verdict}; "
              f"features within {worst:.1e}")
    for name, expected in record["vocabs"].items():
        vocab = create_vocabulary(resolve(VOCAB_CASES[name], folder))
        seqs = [vocab.get_seq(t) for t in TEXTS]
        ids = [vocab.unknown_label_id, vocab.bos_label_id, vocab.eos_label_id, vocab.pad_label_id,
               vocab.control_symbol_ids]
        same = (seqs, list(vocab.labels), ids) == (expected["seqs"], expected["labels"], expected["ids"])
        if not same:
            problems.append(f"vocab {name}: {seqs} != RETURNN's {expected['seqs']}")
        print(f"vocab {name:<19} {len(TEXTS)} texts: {'equal' if same else 'DIFFERENT'}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare with the stored fixtures")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    if not args.check:
        python = returnn_python()
        if python is None:
            return no_returnn("returnn_oggzip_fixtures", "no fixtures are made")
        make_inputs(FIXTURES)
        with tempfile.TemporaryDirectory() as tmp:
            jobs = os.path.join(tmp, "jobs.json")
            with open(jobs, "w") as f:
                json.dump({"folder": FIXTURES, "cases": list(CASES),
                           "out": os.path.join(FIXTURES, "returnn")}, f)
            run_returnn_side(python, __file__, jobs)
        with open(os.path.join(FIXTURES, "returnn.json")) as f:
            record = json.load(f)
        record["versions"] = returnn_versions(python)
        with open(os.path.join(FIXTURES, "returnn.json"), "w") as f:
            json.dump(record, f, indent=1, ensure_ascii=False)
    problems = compare(FIXTURES)
    for problem in problems:
        print("DIFFERENT:", problem)
    size = sum(os.path.getsize(os.path.join(FIXTURES, n)) for n in os.listdir(FIXTURES))
    print(f"{'all equal' if not problems else f'{len(problems)} differences'}; fixtures {size // 1024} KB")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
