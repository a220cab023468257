#!/usr/bin/env python3
"""RETURNN's LSTM attention system or its Transformer ASR system (reduced), trained by RETURNN for some epochs
on a synthetic corpus, then searched with beam 12 by RETURNN's ``task = "search"`` and by this engine from
the same checkpoint: the hypotheses, their label error rates and their scores compared.

    RETURNN_PYTHON=/tmp/returnn-venv/bin/python \\
        .venv/bin/python benchmarks/bench_returnn_search.py CHECKOUT [--network attention|trafo]
        [--config CONFIG] [--epochs E] [--train-seqs 400] [--dev-seqs 200] [--classes 20]
        [--learning-rate LR] [--batch-size 1000] [--keep DIR]
        [--scale 0.0625] [--score-combine]  (attention)
        [--blocks 2] [--dim 32] [--heads 4] [--ff-dim 64] [--lstm-dim 32]  (trafo)

CHECKOUT is a checkout of ``rwth-i6/returnn-experiments``. ``--network attention`` (the default): the config
(default ``2019-librispeech-system/attention/base2.config``) has its network reduced as
``bench_returnn_attention.py`` reduces it (every width times ``--scale``); 20 epochs at learning rate 0.002.
``--network trafo``: the config (default ``bench_returnn_trafo.DEFAULT_CONFIG``,
``2019-asr-e2e-trafo-vs-lstm/librispeech/trafo.12l.ffdim4.pretrain3.config``) has its network built by its
own ``TransformerNetwork`` with ``bench_returnn_trafo.py``'s reduced sizes (``--blocks`` encoder and
decoder blocks, model dim ``--dim``, ``--heads``, feed-forward ``--ff-dim``, front-end LSTMs
``--lstm-dim``); 40 epochs (20 leave a WER near 20 %, 40 near 11 %) at learning rate 0.001 (the config's
warm-up to 0.0008 is not used: the rate is constant).
``--score-combine`` (attention): the search's choice also scores the attention's coverage through a
``custom_score_combine`` with ``explicit_search_sources`` (``returnn_coverage_combine.py``), in both configs.
Both have ``--classes`` labels, a ``decision`` layer deciding the rec layer ``output`` whose ``choice``
is also named ``output``, the front end's time reduction 6 (max pooling 3 * 2) and 40 input dims
(``num_inputs``); their ``pretrain`` is not run, their dropout and label smoothing are kept as written.

The corpus (``make_corpus``, HDF files written by the engine's ``HDFWriter``, read by both programs) says
a short label sequence in its features: each label (ids 1..C-1, no two equal neighbours) is a random 40-dim
prototype held for 12 or 18 frames, with Gaussian noise; the labels end with EOS 0 (as the BPE
vocabulary's ``seq_postfix [0]``). Every length is a multiple of 6 (the encoder's pooling 3 * 2). The label
names (``w1``.., ``</s>`` for 0) go into the files, so both programs write hypotheses as text, one word a
label: the WER is the label error rate without the EOS.

RETURNN trains ``--epochs`` epochs (its ``python -m returnn``, adam, constant learning rate) and searches the
dev corpus with its last checkpoint: ``search_output_layer`` ["decision", "output"] in the ``py`` format
gives per sequence the decided hypothesis and the rec layer's whole beam with RETURNN's beam scores. The
engine's own ``task = "search"`` (``rnn.py``) runs the same search config with that checkpoint loaded
(``load`` reads RETURNN's checkpoints), writing its file in the same format. Compared, file against file:
the share of sequences with the identical decided hypothesis (target ``TARGET_SAME``), both WERs against
the references, each equal decision's beam score (relative ``SCORE_TOLERANCE``), the final beams (the same
hypotheses in the same order, their scores within ``SCORE_TOLERANCE``), how many lines of the two files
are identical, and the search's closing lines (``Search done. ... Final: score S error E`` of both logs:
the same layers, each value within relative ``LINE_TOLERANCE``), and the rec layer's three lists in search
as both logs print them (the same layers in each; their order is reported: RETURNN's follows its Python's
hash seed). Differences are listed.
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from bench_returnn_ctc_demo import RETURNN_HEAD
from bench_returnn_trafo import DEFAULT_CONFIG as TRAFO_CONFIG, add_size_arguments, trafo_network
from returnn_attention_side import reduced
from returnn_coverage_combine import with_coverage_combine, with_functions_defined
from returnn_side import no_returnn, returnn_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = "2019-librispeech-system/attention/base2.config"
TARGET_SAME = 0.99
SCORE_TOLERANCE = 1e-4
LINE_TOLERANCE = 1e-4  # the closing line's losses: float32 sums, added up in another order
BEAM = 12
HOLD = (12, 18)  # frames a label is held: multiples of the encoder's time reduction 6
SEARCH_BATCH = {"batch_size": 4000, "max_seqs": 20}
OPTIMIZER = {"adam": True, "optimizer_epsilon": 1e-8, "gradient_clip": 0}
# per --network: its default config, epochs and (constant) learning rate
NETWORKS = {"attention": {"config": DEFAULT_CONFIG, "epochs": 20, "learning_rate": 0.002},
            "trafo": {"config": TRAFO_CONFIG, "epochs": 40, "learning_rate": 0.001}}


def label_names(classes: int) -> list[str]:
    return ["</s>"] + [f"w{i}" for i in range(1, classes)]


def synthetic_sequence(rng: np.random.RandomState, prototypes: np.ndarray, noise: float = 0.5,
                       labels: tuple[int, int] = (3, 8)) -> tuple[np.ndarray, np.ndarray]:
    """(features (T, D), labels ending in EOS 0): ``labels`` (min, max) non-EOS labels, each label's
    prototype held 12 or 18 frames plus Gaussian noise."""
    classes, dim = prototypes.shape
    ids: list[int] = []
    for _ in range(rng.randint(labels[0], labels[1] + 1)):
        label = rng.randint(1, classes)
        while ids and label == ids[-1]:
            label = rng.randint(1, classes)
        ids.append(label)
    frames = np.concatenate([np.repeat(prototypes[i][None], HOLD[rng.randint(len(HOLD))], axis=0)
                             for i in ids])
    frames = frames + noise * rng.standard_normal(frames.shape)
    return frames.astype(np.float32), np.array(ids + [0], np.int32)


def make_corpus(path: str, num_seqs: int, seed: int, classes: int,
                dim: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """An HDF corpus of ``synthetic_sequence``s (the prototypes drawn with seed 0, alike in every corpus);
    returns its (tag, features, labels)."""
    from engine.datasets import DataKeyInfo, HDFWriter

    prototypes = np.random.RandomState(0).standard_normal((classes, dim))
    rng = np.random.RandomState(seed)
    keys = {"data": DataKeyInfo(dim=dim), "classes": DataKeyInfo(dim=classes, sparse=True)}
    seqs = []
    with HDFWriter(path, keys, labels={"classes": label_names(classes)}) as writer:
        for i in range(num_seqs):
            features, labels = synthetic_sequence(rng, prototypes)
            writer.insert(f"seq-{i}", {"data": features, "classes": labels})
            seqs.append((f"seq-{i}", features, labels))
    return seqs


def edit_distance(a: list, b: list) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def error_rate(hyps: list[list], refs: list[list]) -> float:
    """Summed edit distances over summed reference lengths."""
    return sum(edit_distance(h, r) for h, r in zip(hyps, refs)) / max(sum(len(r) for r in refs), 1)


def parse_search_output(text: str) -> dict[str, dict]:
    """RETURNN's ``py`` search output of several layers: seq tag -> {layer: hypothesis text, or its beam as
    [(score, text)]}. Its scores may be written as numpy scalars (``np.float32(-1.5)``)."""
    return ast.literal_eval(re.sub(r"(?:np|numpy)\.float\d+\(([^()]*)\)", r"\1", text))


def compare(ours: dict[str, dict], theirs: dict[str, dict], refs: dict[str, str]) -> dict:
    """Both programs' search files (``parse_search_output``: per tag the decided hypothesis and the final
    beam): the share of equal decisions, both WERs, the largest relative difference of an equal decision's
    beam score; the sequences whose beams hold the same hypotheses in the same order and the largest
    relative difference of their scores; the differing tags."""
    tags = sorted(theirs)
    same = [t for t in tags if t in ours and ours[t]["decision"] == theirs[t]["decision"]]
    score_diffs = []
    for tag in same:
        mine = {text: score for score, text in ours[tag]["output"]}
        other = {text: score for score, text in theirs[tag]["output"]}
        decided = theirs[tag]["decision"]
        if decided in mine and decided in other:
            score_diffs.append(abs(mine[decided] - other[decided]) / max(abs(other[decided]), 1e-12))
    beams_same = [t for t in tags if t in ours
                  and [h for _, h in ours[t]["output"]] == [h for _, h in theirs[t]["output"]]]
    beam_diffs = [abs(a - b) / max(abs(b), 1e-12) for t in beams_same
                  for (a, _), (b, _) in zip(ours[t]["output"], theirs[t]["output"])]
    ref_words = [refs[t].split() for t in tags]
    return {"seqs": len(tags), "same": len(same), "share": len(same) / max(len(tags), 1),
            "wer engine": error_rate([ours[t]["decision"].split() if t in ours else [] for t in tags],
                                     ref_words),
            "wer returnn": error_rate([theirs[t]["decision"].split() for t in tags], ref_words),
            "score diff": max(score_diffs, default=float("nan")), "scored": len(score_diffs),
            "beams same": len(beams_same), "beam score diff": max(beam_diffs, default=float("nan")),
            "differing": [t for t in tags if t not in same]}


def training_lines(network: dict, extern_data: dict, train_hdf: str, model: str, epochs: int,
                   learning_rate: float, batch_size: int = 1000) -> list[str]:
    """The config lines both programs train with (RETURNN's head apart)."""
    dataset = {"class": "HDFDataset", "files": [train_hdf], "seq_ordering": "random"}
    keys = {**OPTIMIZER, "learning_rate": learning_rate, "learning_rate_control": "constant",
            "batch_size": batch_size, "max_seqs": 40, "batching": "random", "num_epochs": epochs,
            "target": "classes", "log_verbosity": 3, "model": model}
    return [f"network = {network!r}", f"extern_data = {extern_data!r}", f"train = {dataset!r}",
            "cache_size = '0'", *(f"{k} = {v!r}" for k, v in keys.items())]


def search_lines(network: dict, extern_data: dict, dev_hdf: str, load: str, output_file: str,
                 layers: list[str] | str, do_eval: bool = True) -> list[str]:
    keys = {"task": "search", "load": load, "search_output_layer": layers, "search_output_file": output_file,
            "search_output_file_format": "py", "search_do_eval": do_eval, "max_seq_length": 0,
            "target": "classes", "log_verbosity": 3, **SEARCH_BATCH}
    dataset = {"class": "HDFDataset", "files": [dev_hdf]}
    return [f"network = {network!r}", f"extern_data = {extern_data!r}", f"search_data = {dataset!r}",
            *(f"{k} = {v!r}" for k, v in keys.items())]


def write_config(path: str, lines: list[str], head: str = "") -> str:
    text = with_functions_defined("\n".join(lines) + "\n")
    with open(path, "w") as f:
        f.write(head + text)
    return path


def returnn_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(DISABLE_CUDA="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return env


def run_returnn(python: str, config: str, log_path: str) -> None:
    with open(log_path, "w") as log_file:
        done = subprocess.run([python, "-m", "returnn", config], stdout=log_file, stderr=subprocess.STDOUT,
                              env=returnn_env())
    if done.returncode:
        with open(log_path) as f:
            sys.exit(f"bench_returnn_search: RETURNN failed (exit {done.returncode}):\n{f.read()[-4000:]}")


def closing_scores(line: str) -> tuple[dict[str, float], dict[str, float]]:
    """The scores and errors of a search's closing line in RETURNN's format (one value alone: key "")."""
    found = re.search(r"Final: score (.*?) error (.*)$", line.strip())
    if not found:
        raise ValueError(f"not a search's closing line: {line!r}")

    def values(text: str) -> dict[str, float]:
        parts = text.split()
        if parts == ["None"]:
            return {}
        if len(parts) == 1:
            return {"": float(parts[0])}
        return {parts[i]: float(parts[i + 1]) for i in range(0, len(parts), 2)}

    return values(found[1]), values(found[2])


def compare_closing_lines(ours: str, theirs: str) -> float:
    """The largest relative difference of the two lines' values (inf when they name different layers)."""
    diffs = []
    for mine, other in zip(closing_scores(ours), closing_scores(theirs)):
        if set(mine) != set(other):
            return float("inf")
        diffs += [abs(mine[k] - other[k]) / max(abs(other[k]), 1e-12) for k in mine]
    return max(diffs, default=0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--network", choices=tuple(NETWORKS), default="attention",
                        help="the LSTM attention system (base2) or the Transformer (bench_returnn_trafo.py)")
    parser.add_argument("--config", help="the setup's config, under the checkout (default: the network's)")
    parser.add_argument("--epochs", type=int, help="default: 20 (attention), 40 (trafo)")
    parser.add_argument("--train-seqs", type=int, default=400)
    parser.add_argument("--dev-seqs", type=int, default=200)
    parser.add_argument("--classes", type=int, default=20, help="labels, EOS 0 included")
    parser.add_argument("--scale", type=float, default=0.0625, help="attention: factor of every width")
    add_size_arguments(parser)
    parser.add_argument("--score-combine", action="store_true",
                        help="attention: the choice scores the coverage too (custom_score_combine)")
    parser.add_argument("--learning-rate", type=float, help="default: 0.002 (attention), 0.001 (trafo)")
    parser.add_argument("--batch-size", type=int, default=1000, help="training batch size (frames)")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep its files (default: a temp dir)")
    args = parser.parse_args()
    if args.score_combine and args.network != "attention":
        parser.error("--score-combine scores the attention's coverage: it takes --network attention")
    for key, value in NETWORKS[args.network].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    python = returnn_python()
    if python is None:
        return no_returnn("bench_returnn_search", "nothing is compared")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from engine.runtime import log
    from returnn_setups import read_setup

    log.init(verbosity=log.WARNING)
    setup = read_setup(args.checkout, args.config)
    dim = int(setup.namespace.get("num_inputs", 40))
    if args.network == "trafo":
        network = trafo_network(setup.namespace, args)
        sizes = (f"{args.blocks} + {args.blocks} blocks, dim {args.dim}, {args.heads} heads, "
                 f"ff {args.ff_dim}, LSTMs {args.lstm_dim}")
    else:
        network, sizes = reduced(setup.network, args.scale), f"at scale {args.scale:g}"
        if args.score_combine:
            network, sizes = with_coverage_combine(network), sizes + ", coverage in the search's scores"
    extern_data = {"data": {"dim": dim}, "classes": {"dim": args.classes, "sparse": True}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        train_hdf, dev_hdf = os.path.join(folder, "train.hdf"), os.path.join(folder, "dev.hdf")
        frames = sum(len(f) for _, f, _ in make_corpus(train_hdf, args.train_seqs, 1, args.classes, dim))
        dev = make_corpus(dev_hdf, args.dev_seqs, 2, args.classes, dim)
        model_path = os.path.join(folder, "returnn", "epoch")
        print(f"{args.config} {sizes}, {args.classes} classes, dropout as written; corpus "
              f"{args.train_seqs} seqs ({frames} frames), dev {args.dev_seqs} seqs; RETURNN trains "
              f"{args.epochs} epochs at lr {args.learning_rate:g}", flush=True)
        run_returnn(python, write_config(os.path.join(folder, "train.config"), training_lines(
            network, extern_data, train_hdf, model_path, args.epochs, args.learning_rate, args.batch_size),
            RETURNN_HEAD),
            os.path.join(folder, "returnn-train.log"))
        checkpoint = f"{model_path}.{args.epochs:03d}"
        output = os.path.join(folder, "returnn-search.py")
        if os.path.exists(output):
            os.remove(output)
        run_returnn(python, write_config(os.path.join(folder, "search.config"), search_lines(
            network, extern_data, dev_hdf, checkpoint, output, ["decision", "output"]), RETURNN_HEAD),
            os.path.join(folder, "returnn-search.log"))
        # the engine's task = "search" on the same config, RETURNN's checkpoint loaded
        ours_path = os.path.join(folder, "engine-search.py")
        if os.path.exists(ours_path):
            os.remove(ours_path)
        engine_log = os.path.join(folder, "engine-search.log")
        run_engine(write_config(os.path.join(folder, "engine-search.config"), search_lines(
            network, extern_data, dev_hdf, checkpoint, ours_path, ["decision", "output"])), engine_log)
        with open(ours_path) as f:
            ours_text = f.read()
        with open(output) as f:
            theirs_text = f.read()
        names = label_names(args.classes)
        refs = {tag: " ".join(names[k] for k in labels if k != 0) for tag, _, labels in dev}
        result = compare(parse_search_output(ours_text), parse_search_output(theirs_text), refs)
        result["lines same"], result["lines"] = same_lines(ours_text, theirs_text), theirs_text.count("\n")
        logs = (engine_log, os.path.join(folder, "returnn-search.log"))
        lines = [closing_line(path) for path in logs]
        result["plan"] = [search_plan(path) for path in logs]
    return report(result, parse_search_output(ours_text), parse_search_output(theirs_text), refs, *lines)


def run_engine(config: str, log_path: str) -> None:
    with open(log_path, "w") as log_file:
        done = subprocess.run([sys.executable, os.path.join(ROOT, "rnn.py"), config], stdout=log_file,
                              stderr=subprocess.STDOUT)
    if done.returncode:
        with open(log_path) as f:
            sys.exit(f"bench_returnn_search: the engine failed (exit {done.returncode}):\n{f.read()[-4000:]}")


def closing_line(log_path: str) -> str:
    with open(log_path) as f:
        return next(line for line in f if line.startswith("Search done."))


def search_plan(log_path: str) -> list[str]:
    """The rec layer's three lists in search, as the log prints them (RETURNN's and the engine's alike)."""
    with open(log_path) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"Rec layer 'output' \(search True", line))
    end = next(i for i in range(start + 1, len(lines)) if "Unused layers" in lines[i])
    return [line.strip() for line in lines[start:end]]


def plan_lists(plan: list[str]) -> list[set[str]]:
    """The three lists of ``search_plan``'s lines, each as a set: RETURNN walks its loop's layers from a
    Python set of the needed outputs ('output', 'end'), so their order follows the process' hash seed."""
    lists: list[set[str]] = []
    for line in plan[1:]:
        if line.endswith(")") and "(#:" in line:
            lists.append(set())
        elif line != "None":
            lists[-1].add(line)
    return lists


def same_lines(ours: str, theirs: str) -> int:
    """How many lines of the two files are identical, position by position."""
    return sum(a == b for a, b in zip(ours.splitlines(), theirs.splitlines()))


def report(result: dict, ours: dict, theirs: dict, refs: dict, our_line: str, their_line: str) -> int:
    print(f"beam {BEAM}, {result['seqs']} dev sequences: identical hypotheses {result['same']} "
          f"({100 * result['share']:.1f} %, target >= {100 * TARGET_SAME:g} %)")
    print(f"WER (= label error rate, EOS excluded): RETURNN {100 * result['wer returnn']:.2f} %, engine "
          f"{100 * result['wer engine']:.2f} %")
    print(f"scores of the {result['scored']} equal hypotheses: largest relative difference "
          f"{result['score diff']:.2e} (at most {SCORE_TOLERANCE:g})")
    for tag in result["differing"][:20]:
        beam = {text: score for score, text in theirs[tag]["output"]}
        mine = ours[tag]["decision"] if tag in ours else "(none)"
        score = {text: score for score, text in ours.get(tag, {}).get("output", [])}.get(mine, float("nan"))
        print(f"  {tag}: ref '{refs[tag]}'\n    RETURNN '{theirs[tag]['decision']}' "
              f"{beam.get(theirs[tag]['decision'], float('nan')):.5f}\n    engine  '{mine}' {score:.5f} "
              f"(RETURNN's beam: {beam.get(mine, 'not in it')})")
    print(f"final beams ({BEAM} entries, best first): identical in {result['beams same']} of "
          f"{result['seqs']} sequences, their scores within {result['beam score diff']:.2e}; the files' "
          f"lines identical: {result['lines same']} of {result['lines']} (the rest: scores' last digits)")
    line_diff = compare_closing_lines(our_line, their_line)
    print(f"closing line, RETURNN: {their_line.strip()}\nclosing line, engine:  {our_line.strip()}\n"
          f"  largest relative difference {line_diff:.2e} (at most {LINE_TOLERANCE:g})")
    plans_same = plan_lists(result["plan"][0]) == plan_lists(result["plan"][1])
    in_loop = next(line for line in result["plan"][1] if line.startswith("Layers in"))
    order = "also in order" if result["plan"][0] == result["plan"][1] else "in another order"
    print(f"the search's loop lists (in front, behind, in the loop): "
          f"{f'the same layers, {order}' if plans_same else 'DIFFER'} (RETURNN's: {in_loop})")
    if not plans_same or result["plan"][0] != result["plan"][1]:
        print(f"  RETURNN: {result['plan'][1]}\n  engine:  {result['plan'][0]}")
    ok = plans_same and result["share"] >= TARGET_SAME and result["score diff"] <= SCORE_TOLERANCE \
        and result["wer engine"] == result["wer returnn"] and line_diff <= LINE_TOLERANCE \
        and result["beams same"] >= TARGET_SAME * result["seqs"] \
        and result["beam score diff"] <= SCORE_TOLERANCE
    print(f"{'PASS' if ok else 'FAIL'}: search equal to RETURNN's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
