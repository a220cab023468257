"""This engine's ``hdf-dump`` against RETURNN's ``HDFDatasetWriter.dump_from_dataset`` on the train dataset
of ``configs/speech_ctc_oggzip.py`` (an OggZipDataset: MFCCs, BPE targets), value by value.

Used by ``returnn_librispeech_fixtures.py``: ``make_inputs`` makes a three-utterance version of the demo's
corpus with ``demos/make_oggzip_corpus.py`` (espeak-ng) under ``FIXTURES/oggzip``; ``returnn_dump`` runs
under RETURNN's Python and writes ``returnn_dump.hdf`` there; ``compare`` dumps the same dataset dict with
this engine and lists every difference of the two files (datasets, their dtypes and values, attributes,
features within 1e-5, all else exactly), each either equal or one of ``DIFFERENCES``, which say why
(none is left). tests/test_datasets_librispeech.py replays it.
Only numpy and h5py are imported at the top: RETURNN's Python runs this module too.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "speech_ctc_oggzip.py")
CORPUS = "data/speech_oggzip"  # the config's folder, replaced by the fixture's
EPOCH = 1
RETURNN_FILE = "returnn_dump.hdf"

# Each difference between RETURNN's file and this engine's, and why it is kept. Anything else that
# differs is a failure. (Chunked, resizable storage is layout, not a value, and is not compared.) None is
# left: hdf-dump writes dump_from_dataset's layout (HDFWriter's returnn_dump).
DIFFERENCES: dict[str, str] = {}


def dataset_spec(folder: str) -> dict:
    """The config's train dataset dict, its corpus folder replaced by ``folder/oggzip``."""
    sys.path.insert(0, ROOT)
    from engine.config.loader import Config

    spec = Config.from_sources([CONFIG], []).typed("train")
    return _replace(spec, CORPUS, os.path.join(folder, "oggzip"))


def _replace(value, old: str, new: str):
    if isinstance(value, dict):
        return {k: _replace(v, old, new) for k, v in value.items()}
    if isinstance(value, str):
        return value.replace(old, new)
    return value


def make_inputs(folder: str) -> None:
    """A three-utterance corpus as the demo makes it (needs espeak-ng)."""
    sys.path.insert(0, os.path.join(ROOT, "demos"))
    import make_oggzip_corpus

    out = os.path.join(folder, "oggzip")
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        if make_oggzip_corpus.main(["--out", tmp, "--num_train", "3", "--num_dev", "1"]):
            sys.exit("hdf_dump_parity: the corpus could not be made (is espeak-ng installed?)")
        os.makedirs(out)
        for name in ("train.zip", "bpe.codes", "bpe.vocab", "stats.mean.txt", "stats.std_dev.txt"):
            shutil.copy(os.path.join(tmp, name), out)


def returnn_dump(spec: dict, folder: str, engine_file: str) -> dict:
    """Under RETURNN's Python: its own dump of ``spec``, epoch ``EPOCH``; then its HDFDataset reads that file
    and ``engine_file`` (this engine's dump of the same): what differs between the two readings."""
    from returnn.datasets import init_dataset
    from returnn.datasets.hdf import HDFDataset, HDFDatasetWriter

    dataset = init_dataset(dict(spec))
    returnn_file = os.path.join(folder, "oggzip", RETURNN_FILE)
    writer = HDFDatasetWriter(returnn_file)
    writer.dump_from_dataset(dataset, epoch=EPOCH, use_progress_bar=False)
    writer.close()
    readings = []
    for path in (returnn_file, engine_file):
        hdf = HDFDataset(files=[path])
        hdf.init_seq_order(epoch=1)
        seqs, i = [], 0
        while hdf.is_less_than_num_seqs(i):
            hdf.load_seqs(i, i + 1)
            seqs.append((hdf.get_tag(i), {k: hdf.get_data(i, k) for k in hdf.get_data_keys()}))
            i += 1
        readings.append((seqs, {k: hdf.get_data_dim(k) for k in hdf.get_data_keys()},
                         {k: list(v) for k, v in hdf.labels.items()}))
    (theirs, dims_t, labels_t), (ours, dims_o, labels_o) = readings
    problems = []
    if [tag for tag, _ in theirs] != [tag for tag, _ in ours]:
        problems.append("tags differ")
    for (tag, data_t), (_, data_o) in zip(theirs, ours):
        for key, value in data_t.items():
            ours = data_o.get(key)
            if ours is None or ours.dtype != value.dtype or not np.array_equal(ours, value):
                problems.append(f"{tag} {key} differs")
    problems += [f"dim of {k} differs" for k in dims_t if dims_o.get(k) != dims_t[k]]
    problems += [f"labels of {k} differ" for k in labels_t if labels_t[k] and labels_o.get(k) != labels_t[k]]
    return {"returnn_file_keys": sorted(dims_t), "engine_file_keys": sorted(dims_o), "seqs": len(theirs),
            "problems": problems}


def engine_dump(spec: dict, out: str) -> None:
    sys.path.insert(0, ROOT)
    from engine.tools.hdf_dump import main as hdf_dump

    if hdf_dump([repr(spec), out, "--epoch", str(EPOCH), "--overwrite"]) != 0:
        raise RuntimeError("hdf-dump failed")


def _entries(h5: h5py.File) -> dict[str, tuple]:
    """name -> (dtype text, value) of every dataset and attribute (``group@attr``; root: ``@attr``)."""
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = (_dtype(obj.dtype), obj[()])
        for attr, value in obj.attrs.items():
            value = np.asarray(value)
            out[f"{name}@{attr}"] = (_dtype(value.dtype), value)

    for attr, value in h5.attrs.items():
        value = np.asarray(value)
        out[f"@{attr}"] = (_dtype(value.dtype), value)
    h5.visititems(visit)
    return out


def _dtype(dtype: np.dtype) -> str:
    info = h5py.check_string_dtype(dtype)
    if info is not None:
        return f"str({info.encoding}, {'variable' if info.length is None else info.length})"
    return dtype.str


def _text(value):
    """Strings of either kind as Python str, for comparing values."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "OS":
        return [v.decode("utf8") if isinstance(v, bytes) else v for v in value.ravel().tolist()]
    return value


def differences(returnn_file: str, engine_file: str) -> list[tuple[str, str]]:
    """``(name, what differs)`` for every dataset or attribute that is not equal in dtype and value."""
    with h5py.File(returnn_file, "r") as theirs_h5, h5py.File(engine_file, "r") as ours_h5:
        theirs, ours = _entries(theirs_h5), _entries(ours_h5)
        groups = sorted(set(theirs_h5) | set(ours_h5))
    out = []
    for name in sorted(set(theirs) | set(ours)):
        if name not in theirs or name not in ours:
            out.append((name, f"only in {'the engine' if name in ours else 'RETURNN'}'s file"))
            continue
        (dtype_t, value_t), (dtype_o, value_o) = theirs[name], ours[name]
        if dtype_t != dtype_o:
            out.append((f"dtype:{name}", f"{dtype_o} (engine) against {dtype_t} (RETURNN)"))
        if name == "seqLengths" and value_o.shape[1] == value_t.shape[1] + 1:
            same = np.array_equal(value_o[:, :-1], value_t)  # without the engine's last column, orth
            out.append((name, f"one more column (orth); the others {'equal' if same else 'DIFFERENT'}"))
            if not same:
                out.append((f"values:{name}", "the shared columns differ"))
            continue
        a, b = _text(value_o), _text(value_t)
        if isinstance(a, list) or isinstance(b, list):
            equal = a == b
        else:  # features within 1e-5: librosa's FFTs may differ in the last bit on another CPU or version
            scale = max(1.0, float(np.abs(b).max(initial=0))) if b.dtype.kind == "f" else 1.0
            equal = a.shape == b.shape and (np.allclose(a, b, rtol=1e-5, atol=1e-5 * scale)
                                            if a.dtype.kind == "f" else np.array_equal(a, b))
        if not equal:
            out.append((f"values:{name}", f"{_short(value_o)} (engine) against {_short(value_t)} (RETURNN)"))
    out += [(f"group:{g}", "group in one file only") for g in groups if g not in theirs and g not in ours
            and not any(n.startswith(g + "/") for n in set(theirs) & set(ours))]
    return out


def _short(value) -> str:
    text = repr(np.asarray(value).tolist()) if np.asarray(value).size <= 8 else f"array{np.shape(value)}"
    return text if len(text) < 120 else text[:120] + "..."


def compare(folder: str, spec: dict | None = None) -> list[str]:
    """Dump with this engine and list the differences to RETURNN's file; returns the unexplained ones."""
    spec = spec or dataset_spec(folder)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "engine.hdf")
        engine_dump(spec, out)
        found = differences(os.path.join(folder, "oggzip", RETURNN_FILE), out)
    for name, what in found:
        why = DIFFERENCES.get(name)
        print(f"hdf-dump {name}: {what}; " + (f"kept: {why}" if why else "NOT EXPLAINED"))
        if why is None:
            problems.append(f"hdf-dump {name}: {what}")
    stale = sorted(set(DIFFERENCES) - {name for name, _ in found})
    problems += [f"hdf-dump {name}: listed as a difference, but equal now (update DIFFERENCES)"
                 for name in stale]
    print(f"hdf-dump against RETURNN's dump_from_dataset: {len(found)} differences, "
          f"{len(found) - len(problems) + len(stale)} explained, {len(stale)} listed but equal now")
    return problems
