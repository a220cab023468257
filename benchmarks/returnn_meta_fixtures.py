#!/usr/bin/env python3
"""RETURNN's ``MetaDataset`` against the engine's: the sequences of each epoch, and hdf_dump's file.

    .venv/bin/python benchmarks/returnn_meta_fixtures.py [--update-fixtures]

A dev script (RETURNN is found as ``returnn_side.py`` says). ``make_inputs`` writes small corpora in
RETURNN's HDF layout with h5py (features with a repeated tag and one the alignments lack; alignments in
another order; a subsampled alignment as a target; alignments under other tags) and tag lists (text, gzip,
pickled dict, a file per sub-dataset). Every ``CASES`` dict runs through RETURNN's ``MetaDataset`` and the
engine's, epoch by epoch (per sequence its tag and every key's array, in order; per key dim, ndim, dtype,
labels); ``ERROR_CASES`` must fail in both. ``DUMPS``: epoch 1 written as RETURNN's ``tools/hdf_dump.py``
writes it (the tool is ``HDFDatasetWriter(out).dump_from_dataset(dataset, epoch)``, called here: the pip
package lacks the tool's file) and by ``engine/tools/hdf_dump.py``, compared value by value, and the
engine's file read back by RETURNN's ``HDFDataset``. One PASS/MISS line each; ``--update-fixtures`` (only
when all pass) writes the inputs, ``cases.json``, RETURNN's ``sequences.npz`` and dumps to
``tests/fixtures/returnn_meta`` for tests/test_datasets_meta.py.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import sys
import tempfile

import h5py
import numpy as np

from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side
from returnn_verdicts import summary, update_fixtures

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures",
                        "returnn_meta")
INPUTS = ["features.hdf", "alignments.hdf", "alignments_sub.hdf", "renamed.hdf", "seq_list.txt",
          "seq_list.txt.gz", "seq_lists.pkl", "seq_list_features.txt", "seq_list_renamed.txt",
          "seq_lists_full.pkl", "seq_lens.json"]
FEAT, ALIGN, SUB, RENAMED = ({"class": "HDFDataset", "files": [f"{{dir}}/{name}.hdf"]}
                             for name in ("features", "alignments", "alignments_sub", "renamed"))
HYBRID_MAP = {"data": ("features", "data"), "classes": ("alignments", "data")}
SUB_MAP = {"data": ("features", "data"), "classes": ("sub", "classes")}
RENAMED_MAP = {"data": ("features", "data"), "classes": ("renamed", "data")}


def _meta(datasets: dict, data_map: dict, **options) -> dict:
    return {"class": "MetaDataset", "datasets": datasets, "data_map": data_map, **options}


CASES: dict[str, dict] = {  # name -> the MetaDataset dict ("{dir}": the inputs' folder) and its epochs
    "hybrid": {"epochs": [1, 2, 3], "dataset": _meta(
        {"features": FEAT, "alignments": {**ALIGN, "seq_ordering": "random", "partition_epoch": 2}},
        HYBRID_MAP, seq_order_control_dataset="alignments")},
    "hybrid_own_options_unused": {"epochs": [1, 2], "dataset": _meta(
        {"features": FEAT, "alignments": {**ALIGN, "partition_epoch": 2}, "unused": {"class": "Nothing"}},
        HYBRID_MAP, seq_order_control_dataset="alignments", partition_epoch=3, seq_ordering="random")},
    "hybrid_seed_offset": {"epochs": [1], "dataset": _meta(
        {"features": FEAT, "alignments": {**ALIGN, "seq_ordering": "random"}}, HYBRID_MAP,
        seq_order_control_dataset="alignments", random_seed_offset=5)},
    "subsampled_random": {"epochs": [1, 2, 3], "dataset": _meta(
        {"features": FEAT, "sub": SUB}, SUB_MAP, seq_ordering="random", partition_epoch=2)},
    "subsampled_laplace": {"epochs": [1, 2], "dataset": _meta(
        {"features": FEAT, "sub": SUB}, SUB_MAP, seq_ordering="laplace:.3", partition_epoch=2)},
    "subsampled_control_sorted": {"epochs": [1, 2], "dataset": _meta(
        {"features": FEAT, "sub": {**SUB, "seq_ordering": "sorted", "partition_epoch": 2}}, SUB_MAP,
        seq_order_control_dataset="sub")},
    "list_txt": {"epochs": [1, 2], "dataset": _meta(
        {"features": FEAT, "alignments": ALIGN}, HYBRID_MAP, seq_list_file="{dir}/seq_list.txt",
        partition_epoch=2)},
    "list_gz_sorted": {"epochs": [1], "dataset": _meta(
        {"features": FEAT, "alignments": ALIGN}, HYBRID_MAP, seq_list_file="{dir}/seq_list.txt.gz",
        seq_ordering="sorted")},
    "list_pkl_dict": {"epochs": [1, 2], "dataset": _meta(
        {"features": FEAT, "renamed": RENAMED}, RENAMED_MAP, seq_list_file="{dir}/seq_lists.pkl",
        seq_ordering="random", partition_epoch=2)},
    "list_file_per_dataset": {"epochs": [1], "dataset": _meta(
        {"features": FEAT, "renamed": RENAMED}, RENAMED_MAP,
        seq_list_file={"features": "{dir}/seq_list_features.txt", "renamed": "{dir}/seq_list_renamed.txt"})},
    "list_with_control": {"epochs": [1, 2], "dataset": _meta(
        {"features": FEAT, "renamed": {**RENAMED, "seq_ordering": "random", "partition_epoch": 2}},
        RENAMED_MAP, seq_list_file="{dir}/seq_lists_full.pkl", seq_order_control_dataset="renamed")},
    "seq_lens_file": {"epochs": [1], "dataset": _meta(
        {"features": FEAT, "sub": SUB}, SUB_MAP, seq_lens_file="{dir}/seq_lens.json",
        seq_ordering="sorted_reverse")},
}
DUMPS = ["hybrid", "subsampled_random"]  # epoch 1 of these through both hdf_dump tools
ERROR_CASES: dict[str, dict] = {  # dicts both refuse: a tag of the order missing from a sub-dataset
    "missing_tag_count": {"epochs": [1], "dataset": _meta(  # features' extra tag: RETURNN counts first
        {"features": FEAT, "alignments": ALIGN}, HYBRID_MAP)},
    "missing_tag_lookup": {"epochs": [1], "dataset": _meta(  # 'align/<i>' are not features' tags
        {"features": FEAT, "renamed": RENAMED}, RENAMED_MAP, seq_order_control_dataset="renamed")},
}
LABELS = [f"state-{i}" for i in range(5)]


def _write_hdf(path: str, tags: list[str], inputs: list[np.ndarray] | None, input_dim: int,
               targets: dict[str, tuple[list[np.ndarray], int, list[str]]],
               input_labels: list[str] | None) -> None:
    """RETURNN's layout (docs/hdf-format.md): ``inputs``, ``seqTags`` (fixed-size bytes), ``seqLengths``
    (inputs, then the targets sorted; a dummy column when there are no targets), ``targets/*``."""
    with h5py.File(path, "w") as f:
        columns = ([[len(x) for x in inputs]] if inputs is not None else []) + \
            [[len(x) for x in targets[key][0]] for key in sorted(targets)]
        if not targets:
            columns.append(columns[0])
        f.create_dataset("seqLengths", data=np.array(columns, np.int32).T)
        width = max(len(t) for t in tags) + 1
        f.create_dataset("seqTags", data=np.array([t.encode() for t in tags], f"S{width}"))
        if inputs is not None:
            f.create_dataset("inputs", data=np.concatenate(inputs))
        if input_labels is not None:
            f.create_dataset("labels", data=np.array([x.encode() for x in input_labels], "S16"))
        for key, (arrays, dim, labels) in sorted(targets.items()):
            f.create_dataset(f"targets/data/{key}", data=np.concatenate(arrays))
            f.require_group("targets/size").attrs[key] = np.array([dim, arrays[0].ndim], np.int32)
            f.require_group("targets/labels").create_dataset(
                key, data=np.array([x.encode() for x in labels], "S16"))
        f.attrs["inputPattSize"] = input_dim
        f.attrs["numSeqs"] = len(tags)


def make_inputs(folder: str) -> None:
    """The corpora and lists of ``INPUTS``, the same on every run."""
    rng = np.random.RandomState(20261130)
    tags = [f"corpus/rec{i:02d}/1" for i in range(9)]
    lengths = rng.randint(3, 13, size=9)
    lengths[5] = lengths[1]  # a tie, which sorted orders keep stable
    feats = [rng.standard_normal((n, 3)).astype(np.float32) for n in lengths]
    align = [rng.randint(0, 5, size=n).astype(np.int32) for n in lengths]
    # features: the corpus in order, a tag the alignments lack, and rec02 again (the later one counts)
    extra, again = (rng.standard_normal((n, 3)).astype(np.float32) for n in (4, 6))
    feat_tags = tags[:4] + ["corpus/extra/1"] + tags[4:] + [tags[2]]
    _write_hdf(os.path.join(folder, "features.hdf"), feat_tags, feats[:4] + [extra] + feats[4:] + [again], 3,
               {}, None)
    perm = rng.permutation(9)
    _write_hdf(os.path.join(folder, "alignments.hdf"), [tags[i] for i in perm], [align[i] for i in perm], 5,
               {}, LABELS)
    unique = tags[:4] + ["corpus/extra/1"] + tags[4:]
    sub_lengths = {t: (len(again) if t == tags[2] else len(x) if t != "corpus/extra/1" else 4) for t, x in
                   zip(unique, feats[:4] + [extra] + feats[4:])}
    sub = {t: rng.randint(0, 5, size=(n + 1) // 2).astype(np.int32) for t, n in sub_lengths.items()}
    # reversed, and rec05 again (read by tag: the later one; as the control: each in its place), so that it
    # has as many sequences as the features' tag list has entries (11), which RETURNN requires of a
    # sub-dataset where no seq_list_file is given
    sub_tags = unique[::-1] + [tags[5]]
    _write_hdf(os.path.join(folder, "alignments_sub.hdf"), sub_tags, None, 0,
               {"classes": ([sub[t] for t in unique[::-1]] + [np.full(2, 4, np.int32)], 5, LABELS)}, None)
    _write_hdf(os.path.join(folder, "renamed.hdf"), [f"align/{i}" for i in range(9)], align, 5, {}, LABELS)
    chosen = [int(i) for i in rng.permutation(9)[:7]]
    listed = [tags[i] for i in chosen]
    for name, text in (("seq_list.txt", listed), ("seq_list_features.txt", listed),
                       ("seq_list_renamed.txt", [f"align/{i}" for i in chosen]), ("seq_list.txt.gz", listed)):
        with (gzip.open if name.endswith(".gz") else open)(os.path.join(folder, name), "wt") as f:
            f.write("".join(f"{t}\n" for t in text))
    for name, features, order in (("seq_lists.pkl", listed, chosen), ("seq_lists_full.pkl", tags, range(9))):
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump({"features": features, "renamed": [f"align/{i}" for i in order]}, f)
    with open(os.path.join(folder, "seq_lens.json"), "w") as f:
        json.dump({t: {"data": int(n), "classes": 2 if t == tags[5] else len(sub[t])}
                   for t, n in sub_lengths.items()}, f)


def resolve(value, folder: str):
    """``value`` with ``{dir}`` in every string replaced by ``folder``."""
    if isinstance(value, (dict, list, tuple)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        done = {k: resolve(v, folder) for k, v in items}
        return done if isinstance(value, dict) else type(value)(done.values())
    return value.replace("{dir}", folder) if isinstance(value, str) else value


def dataset_of(case: str, folder: str, cases: dict | None = None) -> dict:
    return resolve((cases or CASES)[case]["dataset"], folder)


def record(result: dict, case: str, epoch: int, tags: list[str], seqs: list[dict[str, np.ndarray]]) -> None:
    """One epoch into ``result``: tags, and per key the arrays concatenated with their lengths."""
    result[f"{case}|{epoch}|tags"] = np.array(tags, dtype=str)
    for key in sorted(seqs[0]) if seqs else []:
        result[f"{case}|{epoch}|{key}"] = np.concatenate([s[key] for s in seqs])
        result[f"{case}|{epoch}|{key}|lengths"] = np.array([len(s[key]) for s in seqs], np.int64)


# ----- the RETURNN side: runs under RETURNN's Python (``--returnn-side JOBS.json``) -----
def returnn_side(jobs_path: str) -> None:
    from returnn.datasets.basic import init_dataset
    from returnn.datasets.hdf import HDFDatasetWriter
    from returnn.log import log

    log.initialize(verbosity=[0])
    with open(jobs_path) as f:
        job = json.load(f)
    result, keys = {}, {}

    def read_epoch(dataset, case: str, epoch: int) -> None:
        dataset.init_seq_order(epoch=epoch)
        tags, seqs, i = [], [], 0
        while dataset.is_less_than_num_seqs(i):
            dataset.load_seqs(i, i + 1)
            tags.append(dataset.get_tag(i))
            seqs.append({k: dataset.get_data(i, k) for k in dataset.get_data_keys()})
            i += 1
        record(result, case, epoch, tags, seqs)

    for case, spec in job["cases"].items():
        dataset = init_dataset(dict(spec))
        for epoch in CASES[case]["epochs"]:
            read_epoch(dataset, case, epoch)
        keys[case] = {k: {"dim": dataset.num_outputs[k][0], "ndim": dataset.num_outputs[k][1],
                          "dtype": dataset.get_data_dtype(k), "sparse": dataset.is_data_sparse(k),
                          "labels": list(dataset.labels.get(k, []))} for k in dataset.get_data_keys()}
    errors = {}
    for case, spec in job["errors"].items():
        try:
            dataset = init_dataset(dict(spec))
            dataset.init_seq_order(epoch=1)
            dataset.load_seqs(0, dataset.num_seqs)
        except Exception as exc:  # what RETURNN raises, recorded for the test of the engine's error
            errors[case] = f"{type(exc).__name__}: {exc}"
    for case in job["dumps"]:
        writer = HDFDatasetWriter(os.path.join(job["out"], f"returnn_dump_{case}.hdf"))
        writer.dump_from_dataset(init_dataset(dict(job["cases"][case])), epoch=1, use_progress_bar=False)
        writer.close()
        read_epoch(init_dataset({"class": "HDFDataset", "files": [job["engine_dumps"][case]]}),
                   f"read_back_{case}", 1)
    np.savez(os.path.join(job["out"], "sequences.npz"), **result)
    with open(os.path.join(job["out"], "keys.json"), "w") as f:
        json.dump({"keys": keys, "errors": errors}, f)


# ----- the engine side, and the judging (tests/test_datasets_meta.py uses these too) -----
def engine_sequences(case: str, folder: str, cases: dict | None = None) -> tuple[dict, dict]:
    """The engine's epochs of ``case`` keyed as ``record`` keys them, and its keys' dims."""
    from engine.datasets import create_dataset

    result = {}
    dataset = create_dataset(dataset_of(case, folder, cases))
    try:
        for epoch in (cases or CASES)[case]["epochs"]:
            dataset.init_seq_order(epoch)
            record(result, case, epoch, [dataset.get_seq_tag(i) for i in range(dataset.num_seqs)],
                   [{k: dataset.get_data(i, k) for k in dataset.data_keys} for i in range(dataset.num_seqs)])
        keys = {k: {"dim": dataset.get_data_dim(k), "ndim": dataset.key_info(k).ndim,
                    "dtype": dataset.get_data_dtype(k), "sparse": dataset.is_sparse(k),
                    "labels": list(dataset.labels.get(k, []))} for k in dataset.data_keys}
    finally:
        dataset.close()
    return result, keys


def sequence_differences(expected, got: dict, prefix: str) -> list[str]:
    """Where the arrays under ``prefix`` (``case|``) differ: names, values or dtypes."""
    want = {k for k in expected.files if k.startswith(prefix)}
    have = {k for k in got if k.startswith(prefix)}
    misses = [f"only RETURNN has {sorted(want - have)}"] * bool(want - have) + \
        [f"only the engine has {sorted(have - want)}"] * bool(have - want)
    for name in sorted(want & have):
        a, b = np.asarray(expected[name]), np.asarray(got[name])
        if a.dtype != b.dtype and not (a.dtype.kind == b.dtype.kind == "U"):
            misses.append(f"{name}: dtype {b.dtype}, RETURNN's {a.dtype}")
        elif a.shape != b.shape or not np.array_equal(a, b):
            misses.append(f"{name}: differs ({b.shape} vs RETURNN's {a.shape})")
    return misses


def dump_differences(returnn_path: str, engine_path: str) -> tuple[list[str], list[str]]:
    """(misses, known differences) of two hdf_dump files: seqTags, seqLengths, inputs and every target's data,
    size and labels must be equal in value and dtype; notes: the root attributes or the root label list where
    they differ, and the ``<key>-class-<i>`` names RETURNN invents for a key without labels where the other
    file has none (hdf-dump writes RETURNN's layout: no notes)."""
    misses, notes = [], []
    with h5py.File(returnn_path, "r") as theirs, h5py.File(engine_path, "r") as ours:
        def strings(file, name: str) -> list[str]:
            return [x.decode() if isinstance(x, bytes) else str(x) for x in file[name][...].tolist()]

        if strings(theirs, "seqTags") != strings(ours, "seqTags"):
            misses.append("seqTags differ")
        targets = sorted(set(theirs.get("targets/data", {})) | set(ours.get("targets/data", {})))
        names = ["seqLengths", "inputs"] + [f"targets/data/{k}" for k in targets]
        for name in names:
            if (name in theirs) != (name in ours):
                misses.append(f"{name}: only in {'RETURNN' if name in theirs else 'the engine'}'s file")
            elif name in theirs:
                a, b = theirs[name][...], ours[name][...]
                if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
                    misses.append(f"{name}: {b.dtype} {b.shape}, RETURNN's {a.dtype} {a.shape}")
        for key in targets:
            a, b = (np.asarray(f["targets/size"].attrs.get(key)).tolist() for f in (theirs, ours))
            misses += [f"targets/size '{key}': {b}, RETURNN's {a}"] * (a != b)
            names_a, names_b = (strings(f, f"targets/labels/{key}") for f in (theirs, ours))
            invented = names_a == [f"{key}-class-{i}" for i in range(len(names_a))]
            if names_a != names_b:
                (notes if invented and not names_b else misses).append(
                    f"targets/labels '{key}': {len(names_b)} names, RETURNN's {len(names_a)}")
        attrs = [{k: np.asarray(v).tolist() for k, v in sorted(f.attrs.items())} for f in (theirs, ours)]
        if attrs[0] != {k: v for k, v in attrs[1].items() if k in attrs[0]}:
            notes.append(f"root attributes: {attrs[1]}, RETURNN's {attrs[0]}")
        if ("labels" in theirs) != ("labels" in ours):
            notes.append(f"root 'labels' only in {'RETURNN' if 'labels' in theirs else 'the engine'}'s file")
    return misses, notes


def engine_error_misses(case: str, folder: str, returnn_error: str | None) -> list[str]:
    """Empty when RETURNN failed on ``ERROR_CASES[case]`` and the engine refuses it with a DataError naming
    the missing tag where RETURNN's KeyError names one (its count check names none)."""
    from engine.datasets import create_dataset
    from engine.runtime.errors import DataError

    if returnn_error is None:
        return ["RETURNN read it without an error"]
    try:
        create_dataset(dataset_of(case, folder, ERROR_CASES)).close()
    except DataError as exc:
        named = returnn_error.split("KeyError: ")[-1] if returnn_error.startswith("KeyError") else ""
        return [f"the engine's error does not name {named}: {exc}"] * (named not in str(exc))
    return ["the engine accepts it"]


def engine_dump(case: str, folder: str, out: str, cases: dict | None = None) -> None:
    from engine.tools.hdf_dump import main as hdf_dump

    if hdf_dump([repr(dataset_of(case, folder, cases)), out, "--epoch", "1", "--overwrite"]):
        raise RuntimeError(f"the engine's hdf_dump of {case} failed")


def verdicts(folder: str, expected, returnn_keys: dict, returnn_errors: dict,
             engine_dumps: dict[str, str]) -> list[str]:
    """Print a PASS or MISS line per comparison; the names of those that missed."""
    missed = []

    def verdict(name: str, misses: list[str], extra: str = "") -> None:
        print(f"{name:<50} {'PASS' if not misses else 'MISS: ' + '; '.join(misses)}{extra}")
        missed.extend([name] if misses else [])

    for case, spec in CASES.items():
        got, keys = engine_sequences(case, folder)
        misses = sequence_differences(expected, got, f"{case}|")
        misses += [f"keys: {keys}, RETURNN's {returnn_keys[case]}"] * (keys != returnn_keys[case])
        seqs = sum(len(expected[f"{case}|{e}|tags"]) for e in spec["epochs"])
        verdict(f"{case} (epochs {spec['epochs']}, {seqs} seqs)", misses)
    for case in DUMPS:
        misses, notes = dump_differences(os.path.join(folder, f"returnn_dump_{case}.hdf"), engine_dumps[case])
        back = {k.replace("read_back_", ""): v for k, v in expected.items() if k.startswith("read_back_")}
        misses += [f"RETURNN reading the engine's file back: {m}"
                   for m in sequence_differences(expected, back, f"{case}|1|")]
        verdict(f"hdf_dump {case}", misses, f" (known differences: {'; '.join(notes)})" * bool(notes))
    for case in ERROR_CASES:
        verdict(f"error {case}", engine_error_misses(case, folder, returnn_errors.get(case)),
                f" (RETURNN: {returnn_errors.get(case)})")
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--update-fixtures", action="store_true",
                        help=f"write the inputs and RETURNN's side to {FIXTURES} when every case passed")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    python = returnn_python()
    if python is None:
        return no_returnn("returnn_meta_fixtures", "nothing is compared")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from engine.runtime import log

    log.init(verbosity=log.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        make_inputs(tmp)
        engine_dumps = {case: os.path.join(tmp, f"engine_dump_{case}.hdf") for case in DUMPS}
        for case, path in engine_dumps.items():
            engine_dump(case, tmp, path)
        path = os.path.join(tmp, "jobs.json")
        with open(path, "w") as f:
            json.dump({"cases": {c: dataset_of(c, tmp) for c in CASES}, "dumps": DUMPS, "out": tmp,
                       "engine_dumps": engine_dumps,
                       "errors": {c: dataset_of(c, tmp, ERROR_CASES) for c in ERROR_CASES}}, f)
        run_returnn_side(python, __file__, path)
        with open(os.path.join(tmp, "keys.json")) as f:
            returnn_keys, returnn_errors = json.load(f).values()
        print(f"RETURNN: {python} {returnn_versions(python)}; MetaDataset's sequences (tags, arrays, order) "
              "per epoch, hdf_dump's file, errors")
        missed = verdicts(tmp, np.load(os.path.join(tmp, "sequences.npz")), returnn_keys, returnn_errors,
                          engine_dumps)
        names = list(CASES) + [f"hdf_dump {c}" for c in DUMPS] + [f"error {c}" for c in ERROR_CASES]
        line, status = summary(names, missed, "exact equality")
        print(line)
        with open(os.path.join(tmp, "cases.json"), "w") as f:
            json.dump({"made_by": "benchmarks/returnn_meta_fixtures.py --update-fixtures",
                       **returnn_versions(python), "dumps": DUMPS, "returnn_keys": returnn_keys,
                       "error_cases": ERROR_CASES, "returnn_errors": returnn_errors, "cases": CASES},
                      f, indent=1)
        if args.update_fixtures:
            outputs = ["sequences.npz"] + [f"returnn_dump_{c}.hdf" for c in DUMPS]
            print(update_fixtures(status, tmp, INPUTS + outputs, FIXTURES))
    return status


if __name__ == "__main__":
    sys.exit(main())
