"""Fixtures for LmDataset and TranslationDataset, made by RETURNN itself, and a check of this engine
against them.

    python benchmarks/returnn_text_fixtures.py           # write tests/fixtures/returnn_text/, compare
    python benchmarks/returnn_text_fixtures.py --check   # compare with the stored fixtures only

The inputs are made here (``make_inputs``): a plain-text corpus of three dozen lines with RETURNN's edge
cases (empty and blank lines, tabs, ``\\r\\n``, ``[specials]``, brackets, words outside the vocabulary, a
last line without a newline), a ``.gz`` corpus, Bliss XML corpora (plain and ``.gz``), word and character
symbol lists in every file form RETURNN reads (lines, ``symbol index`` lines, a dict literal, a pickle),
a JSON replacement map with comments, a subword-nmt BPE codes file with its vocabulary, sequence lists,
and a translation directory (``source.*`` / ``target.*``, plain and ``.gz``, pickled vocabularies with
two words sharing an index). RETURNN (``$RETURNN_PYTHON``) reads every case of ``LM_CASES`` and
``TRANSLATION_CASES`` for epochs 1 and 2 and records, per epoch, the tags and every key's labels, plus
keys, dims, dtypes and label lists, in ``returnn.json``; the ``FAILING`` cases record the exception
RETURNN raises (this engine refuses them). tests/test_datasets_text.py replays the record.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "returnn_text")
EPOCHS = (1, 2)

WORDS = ["<sb>", "<unk>", "hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog", "and", "there",
         "[NOISE]", "[LAUGH]", "café", "is", "big", "small", "ran", "s"]
OOV = ["zebra", "of", "blue", "hi", "colour"]
CHARS = [" ", "</w>", "[END]", "[UNKNOWN]", "[NOISE]", "[LAUGH]", "é", "'", "/"] + \
    list("abcdefghijklmnopqrstuvwxyz")
HAND_LINES = [b"hello world", b"the cat sat on the mat", b"", b"   ", b"a dog  and\tthe cat  ",
              b"hello [noise] there", b"(the) {big} cat", "café is small\r".encode("utf8"), b"the zebra ran",
              b"hi there world", b"colour of the dog", b"a//b the", b"[laughter] hello", b"x",
              b"dogs ran on the mat", b"[noise]"]
GZ_LINES = [b"  padded line of hello  ", b"", b"\t", b"the big dog ran", b"small cat", b"hello there",
            b"a mat on a cat", b"world"]
BLISS = [("r1", [("s1", " hello   world "), ("s2", "the cat [NOISE] sat")]),
         ("r2", [("s3", ""), ("s4", "big dog"), ("s5", "café ran and ran")])]
REPLACE_JSON = """{
  // word-level replacements, as in RETURNN's orth_replace_map_file
  "colour": "color",   /* not in the vocabulary either */
  "hi": "hello",
  "hello": "world",
  "a//b": "a b",
  "[LAUGHTER]": "[LAUGH]",
  "dogs": "dog s"
}"""
BPE_CODES = ["#version: 0.2", "h e", "l l", "he ll", "hell o</w>", "t h", "th e</w>", "c a", "ca t</w>",
             "w o", "wo r", "wor l", "worl d</w>", "a t</w>", "s at</w>", "o n</w>", "m at</w>", "d o",
             "do g</w>"]
BPE_VOCAB = ["<unk>", "</s>", "hello", "the", "cat", "world", "sat", "on", "mat", "a", "dog", "at"] + \
    [c + "@@" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz")
SOURCE_WORDS = ["hallo", "welt", "die", "katze", "sitzt", "auf", "der", "matte", "ein", "hund", "und", "da"]
TARGET_WORDS = ["hello", "world", "the", "cat", "sits", "on", "mat", "a", "dog", "and", "there", "big",
                "small", "runs"]


def lower(text):
    """An ``orth_post_process`` both sides use."""
    return text.lower()


def generated_lines(seed: int, count: int, words: list[str], oov: list[str]) -> list[bytes]:
    rng = np.random.RandomState(seed)
    pool = words + oov
    return [" ".join(pool[i] for i in rng.randint(0, len(pool), size=rng.randint(1, 10))).encode("utf8")
            for _ in range(count)]


def corpus_a_lines() -> list[bytes]:
    return HAND_LINES + generated_lines(1, 20, WORDS[2:13] + WORDS[15:20], OOV)


def _call(value):
    """A function returning ``value``: RETURNN's options may be functions (``lambda: cf(...)``)."""
    return lambda: value


_WORD_LM = {"word_based": True, "seq_end_symbol": "<sb>", "unknown_symbol": "<unk>",
            "add_delayed_seq_data": True, "delayed_seq_data_start_symbol": "<sb>"}
# name -> LmDataset options; "{dir}": the fixture folder, "@lower": lower, ("call", v): a function returning v
LM_CASES = {
    "words_random": {**_WORD_LM, "corpus_file": ("call", ["{dir}/a.txt", "{dir}/b.txt.gz"]),
                     "orth_symbols_map_file": ("call", "{dir}/words.map"),
                     "orth_replace_map_file": "{dir}/replace.json", "auto_replace_unknown_symbol": True,
                     "partition_epoch": 2, "seq_ordering": "random"},
    "words_laplace": {**_WORD_LM, "corpus_file": "{dir}/a.txt", "orth_symbols_file": "{dir}/words.syms",
                      "unknown_symbol": None, "auto_replace_unknown_symbol": True,
                      "log_auto_replace_unknown_symbols": False,
                      "parse_orth_opts": {"square_brackets_for_specials": False, "upper_case_special": False},
                      "partition_epoch": 2, "seq_ordering": "laplace:.4"},
    "words_skip_sorted": {"word_based": True, "seq_end_symbol": "<sb>", "corpus_file": ["{dir}/a.txt"],
                          "orth_symbols_map_file": "{dir}/words_dict.map", "error_on_invalid_seq": False,
                          "log_skipped_seqs": 2, "skip_empty_lines": False, "tag_prefix": "sent-",
                          "dtype": "int32", "orth_post_process": "@lower", "partition_epoch": 2,
                          "seq_ordering": "sorted"},
    "chars_word_end": {"corpus_file": "{dir}/a.txt", "orth_symbols_file": "{dir}/chars.syms",
                       "word_end_symbol": "</w>", "unknown_symbol": "[UNKNOWN]",
                       "auto_replace_unknown_symbol": True, "parse_orth_opts": {"remove_chars": "(){}"},
                       "partition_epoch": 2, "seq_ordering": "sorted"},
    "chars_pkl_laplace": {"corpus_file": ["{dir}/b.txt.gz", "{dir}/c.xml"],
                          "orth_symbols_map_file": "{dir}/chars.pkl", "seq_end_symbol": None,
                          "auto_replace_unknown_symbol": True, "unknown_symbol": "[UNKNOWN]",
                          "partition_epoch": 2, "seq_ordering": "laplace:.3"},
    "bpe_random": {"corpus_file": ["{dir}/a.txt", "{dir}/c.xml"],
                   "orth_vocab": {"bpe_file": "{dir}/bpe.codes", "vocab_file": "{dir}/bpe.vocab",
                                  "unknown_label": "<unk>", "seq_postfix": [1]},
                   "seq_list_file": ["{dir}/list_a.txt", "{dir}/list_c.pkl"],
                   "partition_epoch": 2, "seq_ordering": "random"},
    "vocab_bliss_gz_laplace": {"corpus_file": "{dir}/c.xml.gz",
                               "orth_vocab": {"vocab_file": "{dir}/words.syms", "unknown_label": "<unk>",
                                              "seq_postfix": [0]},
                               "seq_ordering": "laplace:.2", "random_seed_offset": 5},
}
_TR = {"path": "{dir}/tr", "source_postfix": " </S>", "target_postfix": " </S>"}
TRANSLATION_CASES = {
    "tr_random": {**_TR, "file_postfix": "train", "unknown_label": "<UNK>", "partition_epoch": 2,
                  "seq_ordering": "random"},
    "tr_gz_sorted": {**_TR, "file_postfix": "dev", "target_postfix": "</S>",
                     "unknown_label": {"data": "<UNK>", "classes": "<UNK>"}, "seq_ordering": "sorted"},
    "tr_source_only": {**_TR, "file_postfix": "train", "source_only": True, "unknown_label": "<UNK>",
                       "partition_epoch": 2, "seq_ordering": "laplace:.3"},
    "tr_search": {**_TR, "file_postfix": "test", "search_without_reference": True, "unknown_label": "<UNK>"},
}
FAILING = {  # RETURNN fails on these; this engine refuses them when the dataset is created
    "lm_delayed_with_vocab": ("LmDataset", {"corpus_file": "{dir}/a.txt", "add_delayed_seq_data": True,
                                            "orth_vocab": {"vocab_file": "{dir}/words.syms",
                                                           "unknown_label": "<unk>"}}),
    "tr_seq_list_file": ("TranslationDataset", {**_TR, "file_postfix": "train", "unknown_label": "<UNK>",
                                                "seq_list_file": "{dir}/tr/lines.txt"}),
}


def resolve(value, folder):
    """The options with ``{dir}``, ``@lower`` and ``("call", v)`` filled in."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "call":
        return _call(resolve(value[1], folder))
    if isinstance(value, dict):
        return {k: resolve(v, folder) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, folder) for v in value]
    if value == "@lower":
        return lower
    if isinstance(value, str):
        return value.replace("{dir}", folder)
    return value


def all_cases() -> dict[str, tuple[str, dict]]:
    return {**{name: ("LmDataset", opts) for name, opts in LM_CASES.items()},
            **{name: ("TranslationDataset", opts) for name, opts in TRANSLATION_CASES.items()}}


# ----- the inputs -----
def make_inputs(folder: str) -> None:
    os.makedirs(os.path.join(folder, "tr"), exist_ok=True)
    a_lines = corpus_a_lines()
    with open(os.path.join(folder, "a.txt"), "wb") as f:
        f.write(b"\n".join(a_lines) + b"\ndropped: no newline after the last line")
    with gzip.open(os.path.join(folder, "b.txt.gz"), "wb") as f:
        f.write(b"\n".join(GZ_LINES) + b"\nkept in gz: no newline")
    bliss = '<?xml version="1.0" encoding="UTF-8"?>\n<corpus name="c">\n' + "".join(
        f'  <recording name="{r}" audio="{r}.wav">\n' + "".join(
            f'    <segment name="{s}" start="0" end="1">\n      <orth> {orth} </orth>\n    </segment>\n'
            for s, orth in segments) + "  </recording>\n" for r, segments in BLISS) + "</corpus>\n"
    with open(os.path.join(folder, "c.xml"), "w", encoding="utf8") as f:
        f.write(bliss)
    with gzip.open(os.path.join(folder, "c.xml.gz"), "wt", encoding="utf8") as f:
        f.write(bliss.replace("big dog", "small zebra"))
    texts = {"words.syms": "\n".join(WORDS) + "\n",
             "words.map": "".join(f"{w} {i}\n" for i, w in enumerate(WORDS)),
             "words_dict.map": repr({w: i for i, w in enumerate(WORDS)}),
             "chars.syms": "\n".join(CHARS) + "\n",
             "replace.json": REPLACE_JSON,
             "bpe.codes": "\n".join(BPE_CODES) + "\n", "bpe.vocab": "\n".join(BPE_VOCAB) + "\n",
             "list_a.txt": "".join(f"a/{i}\n" for i, line in enumerate(a_lines) if line),
             "tr/lines.txt": "1\n0\n1\n"}
    for name, text in texts.items():
        with open(os.path.join(folder, name), "w", encoding="utf8") as f:
            f.write(text)
    with open(os.path.join(folder, "chars.pkl"), "wb") as f:
        pickle.dump({c: i for i, c in enumerate(CHARS)}, f)
    with open(os.path.join(folder, "list_c.pkl"), "wb") as f:
        pickle.dump([f"c/{s}" for _, segments in BLISS for s, _ in segments], f)
    make_translation_inputs(os.path.join(folder, "tr"))


def make_translation_inputs(folder: str) -> None:
    src = generated_lines(2, 18, SOURCE_WORDS, ["fremd", "wort"])
    tgt = generated_lines(3, 18, TARGET_WORDS, ["alien"])
    src[4], tgt[4] = b"", b"  "  # an empty line is an empty sentence (just the postfix)
    src[7], tgt[7] = "  die katze\t sitzt  \r".encode("utf8"), b"the cat sits"
    with open(os.path.join(folder, "source.train"), "wb") as f:
        f.write(b"\n".join(src))  # the last line without a newline counts here
    with open(os.path.join(folder, "target.train"), "wb") as f:
        f.write(b"\n".join(tgt) + b"\n")
    dev_src = generated_lines(4, 7, SOURCE_WORDS, ["fremd"])
    dev_tgt = generated_lines(5, 7, TARGET_WORDS, [])
    for name, lines in (("source.dev.gz", dev_src), ("target.dev.gz", dev_tgt)):
        with gzip.open(os.path.join(folder, name), "wb") as f:
            f.write(b"\n".join(lines) + b"\n")
    with open(os.path.join(folder, "source.test"), "wb") as f:
        f.write(b"\n".join(generated_lines(6, 5, SOURCE_WORDS, ["fremd"])) + b"\n")
    for name, words in (("source.vocab.pkl", SOURCE_WORDS), ("target.vocab.pkl", TARGET_WORDS)):
        vocab = {w: i for i, w in enumerate(words + ["<UNK>", "</S>"])}
        vocab["<S>"] = vocab["</S>"]  # two words, one index: the label list names it "<S>" (sorted, last)
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(vocab, f)


# ----- the RETURNN side: runs under RETURNN's Python (``--returnn-side JOBS.json``) -----
def returnn_side(jobs_path: str) -> None:
    from returnn.datasets import init_dataset
    from returnn.log import log

    log.initialize(verbosity=[0])
    with open(jobs_path) as f:
        job = json.load(f)
    folder, record = job["folder"], {"cases": {}, "failing": {}}
    for name, (cls, options) in all_cases().items():
        dataset = init_dataset(dict(resolve(options, folder), **{"class": cls}))
        entry = record["cases"][name] = {}
        for epoch in EPOCHS:
            dataset.init_seq_order(epoch=epoch)
            seqs, i = [], 0
            while dataset.is_less_than_num_seqs(i):
                dataset.load_seqs(i, i + 1)
                if dataset._get_seq(i) is None:  # after skipped sequences RETURNN runs out early and then
                    entry["runs_out"] = True      # fails (AttributeError) on the next read: recorded here
                    break
                seqs.append([dataset.get_tag(i), {k: dataset.get_data(i, k).tolist()
                                                  for k in dataset.get_data_keys()}])
                i += 1
            entry[str(epoch)] = seqs
        keys = dataset.get_data_keys()
        entry.update(keys=sorted(keys), dtypes={k: dataset.get_data_dtype(k) for k in keys},
                     num_outputs={k: list(v) for k, v in dataset.num_outputs.items()},
                     get_data_dim={k: dataset.get_data_dim(k) for k in keys},
                     labels={k: list(v) for k, v in dataset.labels.items()})
    for name, (cls, options) in FAILING.items():
        try:
            dataset = init_dataset(dict(resolve(options, folder), **{"class": cls}))
            dataset.init_seq_order(epoch=1)
            dataset.load_seqs(0, 1)
            record["failing"][name] = None
        except Exception as exc:  # what RETURNN does with it, recorded
            record["failing"][name] = f"{type(exc).__name__}: {exc}"
    with open(job["out"], "w") as f:
        json.dump(record, f, indent=0, ensure_ascii=False)


# ----- this engine's side -----
def engine_seqs(dataset, epoch: int) -> list:
    dataset.init_seq_order(epoch)
    return [[dataset.get_seq_tag(i), {k: dataset.get_data(i, k) for k in dataset.data_keys}]
            for i in range(dataset.num_seqs)]


def compare(folder: str) -> list[str]:
    """Differences between the engine and the stored RETURNN output (empty: none)."""
    sys.path.insert(0, ROOT)
    from engine.datasets.factory import create_dataset
    from engine.runtime.errors import DataError

    with open(os.path.join(folder, "returnn.json")) as f:
        record = json.load(f)
    problems = []
    for name, (cls, options) in all_cases().items():
        expected, before = record["cases"][name], len(problems)
        dataset = create_dataset(dict(resolve(options, folder), **{"class": cls}))
        for epoch in EPOCHS:
            ours, theirs = engine_seqs(dataset, epoch), expected[str(epoch)]
            if [t for t, _ in ours] != [t for t, _ in theirs]:
                problems.append(f"{name} epoch {epoch}: tags {[t for t, _ in ours]} != RETURNN's "
                                f"{[t for t, _ in theirs]}")
                continue
            for (tag, data), (_, their_data) in zip(ours, theirs):
                if sorted(data) != sorted(their_data):
                    problems.append(f"{name} {tag}: keys {sorted(data)} != RETURNN's {sorted(their_data)}")
                for key, arr in data.items():
                    if arr.tolist() != their_data.get(key) or arr.dtype.name != expected["dtypes"][key]:
                        problems.append(f"{name} epoch {epoch} {tag} {key}: {arr.dtype}{arr.tolist()} != "
                                        f"RETURNN's {expected['dtypes'][key]}{their_data.get(key)}")
        dims = {k: [dataset.get_data_dim(k), 1] for k in dataset.data_keys}
        if dims != {k: v for k, v in expected["num_outputs"].items() if k in expected["keys"]}:
            problems.append(f"{name}: dims {dims} != RETURNN's num_outputs {expected['num_outputs']}")
        if {k: v for k, v in dataset.labels.items()} != expected["labels"]:
            problems.append(f"{name}: labels differ from RETURNN's")
        dataset.close()
        seqs = sum(len(expected[str(e)]) for e in EPOCHS)
        print(f"{name:<24} epochs {EPOCHS}: {seqs:3} seqs, keys {expected['keys']}: "
              f"{'equal' if len(problems) == before else 'DIFFERENT'}")
    for name, (cls, options) in FAILING.items():
        try:
            create_dataset(dict(resolve(options, folder), **{"class": cls}))
            problems.append(f"{name}: RETURNN fails ({record['failing'][name]}), the engine accepts it")
        except DataError:
            print(f"{name:<24} RETURNN: {record['failing'][name][:60]}...; engine: refused")
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
            return no_returnn("returnn_text_fixtures", "no fixtures are made")
        make_inputs(FIXTURES)
        out = os.path.join(FIXTURES, "returnn.json")
        with tempfile.TemporaryDirectory() as tmp:
            jobs = os.path.join(tmp, "jobs.json")
            with open(jobs, "w") as f:
                json.dump({"folder": FIXTURES, "out": out}, f)
            run_returnn_side(python, __file__, jobs)
        with open(out) as f:
            record = json.load(f)
        record["versions"] = returnn_versions(python)
        with open(out, "w") as f:
            json.dump(record, f, indent=0, ensure_ascii=False)
    problems = compare(FIXTURES)
    for problem in problems:
        print("DIFFERENT:", problem)
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(FIXTURES) for n in names)
    print(f"{'all equal' if not problems else f'{len(problems)} differences'}; fixtures {size // 1024} KB")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
