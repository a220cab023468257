#!/usr/bin/env python3
"""How much of RETURNN's published setups this engine builds: ``rnn.py --check`` over their networks, and
one training step for every network it accepts.

    .venv/bin/python benchmarks/bench_returnn_coverage.py CHECKOUT [--years 2018,...,2022] [--no-train]
        [--jobs 2] [--top 30] [--folder DIR] [--show-accepted]

CHECKOUT is a checkout of ``rwth-i6/returnn-experiments`` (the project holds none of its files). Each
``*.config`` of the folders of ``--years`` is read as ``returnn_setups.py`` says (its top-level code run
with RETURNN's modules and ``config`` stood in for). A config whose code leaves a dict ``network`` counts;
its check config is that network, the config's ``extern_data`` / ``num_inputs`` / ``num_outputs`` and
``target`` as written, and a small HDF corpus of those dims as ``train`` and ``dev`` (its own datasets
read the authors' corpora). The check is ``engine.tasks.check.collect``, what ``rnn.py CONFIG --check``
prints. Each network it accepts then trains one epoch of 4 sequences (2 steps) with ``rnn.py`` on its
corpus, unless ``--no-train``; ``--jobs`` of those runs at a time (default: one per core: building a
network's graph is one Python thread, so a run mostly keeps one core busy), each reported on stderr as it
ends.

Prints: the counts (configs, networks read, accepted by the check, trained a step), the refusals by the
number of networks they stop (each network's every refusal counted once; a layer class that the check
refuses hides the refusals of the layers after it), the layer classes this engine does not implement by
the number of networks that use them anywhere (subnetworks included), and the networks that the check
accepted but that did not train, with the last line of their error. A rec unit's subnetwork that loads
its parameters from the authors' checkpoint (``load_on_init``, not published) loads a stand-in written from
the engine's initial values of it (``stand_in_checkpoints``).
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import collections
import concurrent.futures
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Collection, Iterator

import numpy as np

from returnn_setups import SETUP_YEARS, Setup, read_setup, setup_paths
from timing import ROOT, child_env
from engine.config.dim_tags import DimensionTag
from engine.config.loader import Config
from engine.config.returnn_imports import OLD_NAMES
from engine.datasets import DataKeyInfo, HDFWriter
from engine.model.rec.unit import UNIT_CLASS_OPTIONS
from engine.model.spec import IMPLEMENTED_CLASSES
from engine.runtime import log
from engine.runtime.errors import EngineError
from engine.tasks.check import collect, stop_reason

# a class counts as built where the network or a rec unit builds it (the layer dicts are walked without
# telling a unit's layers from the network's)
# a subnetwork is built inside rec units (its layers join the unit: rec/unit_subnetwork.py), refused elsewhere
BUILT_CLASSES = IMPLEMENTED_CLASSES | set(UNIT_CLASS_OPTIONS) | {"subnetwork"}
DIM_KEYS = ("extern_data", "num_inputs", "num_outputs", "target")
TRAIN_SECONDS = 600


def streams(namespace: dict[str, Any]) -> dict[str, tuple[int, bool]] | None:
    """(dim, sparse) per stream as the config declares them, or None where it does not say."""
    declared: dict[str, Any] = {}
    if isinstance(namespace.get("extern_data"), dict):
        declared = dict(namespace["extern_data"])
    elif "num_outputs" in namespace:
        outputs = namespace["num_outputs"]
        declared = dict(outputs) if isinstance(outputs, dict) else {"classes": (outputs, 1)}
        if "data" not in declared and "num_inputs" in namespace:
            declared["data"] = (namespace["num_inputs"], 2)
    result = {}
    for key, value in declared.items():
        if isinstance(value, dict) and isinstance(value.get("dim"), int):
            result[key] = (value["dim"], bool(value.get("sparse", False)))
        elif isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
            result[key] = (value[0], value[1] == 1)
        elif isinstance(value, int) and not isinstance(value, bool):
            result[key] = (value, key != "data")
        else:
            return None
    if any(dim < 1 for dim, _ in result.values()):
        return None
    return result if "data" in result else None


def described_streams(namespace: dict[str, Any]) -> dict[str, tuple[int, bool]] | None:
    """The ``extern_data`` entries with a literal dim, where ``streams`` found others it cannot read (dim
    tags, dim None, streams without a time axis): a corpus of these lets the check name the others."""
    declared = namespace.get("extern_data")
    if not isinstance(declared, dict):
        return None
    result = {key: (value["dim"], bool(value.get("sparse", False))) for key, value in declared.items()
              if isinstance(value, dict) and isinstance(value.get("dim"), int) and value["dim"] > 0}
    return result if "data" in result else None


def layer_dicts(network: dict) -> Iterator[dict]:
    """Every layer dict, those of ``subnetwork`` and ``rec`` units included."""
    for name, layer in network.items():
        if isinstance(layer, dict) and not str(name).startswith("#"):  # RETURNN skips '#' entries
            yield layer
            for key in ("subnetwork", "unit"):
                if isinstance(layer.get(key), dict):
                    yield from layer_dicts(layer[key])


def uses_ctc(network: dict) -> bool:
    return any(layer.get("loss") == "ctc" for layer in layer_dicts(network))


def time_tags(namespace: dict[str, Any]) -> dict[str, int]:
    """Stream -> the number of its ``same_dim_tags_as`` time tag (in the config, a DimensionTag object
    shared by the streams of one time axis; in this reading, the stand-in for it)."""
    extern = namespace.get("extern_data")
    numbers: dict[int, int] = {}
    found = {}
    for key, entry in (extern.items() if isinstance(extern, dict) else ()):
        tags = entry.get("same_dim_tags_as") if isinstance(entry, dict) else None
        if isinstance(tags, dict) and len(tags) == 1 and str(next(iter(tags))) in ("t", "T"):
            found[key] = numbers.setdefault(id(next(iter(tags.values()))), len(numbers))
    return found


def with_engine_tags(extern: dict, tags: dict[str, int]) -> dict:
    """``extern_data`` with this engine's DimensionTag objects in place of the stand-ins (one per tag)."""
    made = {number: DimensionTag(kind=DimensionTag.Types.Spatial, description=f"time{number}")
            for number in set(tags.values())}
    return {key: {**entry, "same_dim_tags_as": {"t": made[tags[key]]}} if key in tags else entry
            for key, entry in extern.items()}


def one_frame_streams(network: dict) -> tuple[str, ...]:
    """The streams a ``squeeze`` of the time axis reads: one frame per sequence (a speaker label)."""
    return tuple(sorted({src[len("data:"):] for layer in layer_dicts(network)
                         if layer.get("class") == "squeeze" and str(layer.get("axis")).upper() == "T"
                         for src in ([layer.get("from")] if isinstance(layer.get("from"), str)
                                     else layer.get("from") or []) if src.startswith("data:")}))


def make_corpus(path: str, dims: dict[str, tuple[int, bool]], ctc: bool, tied: Collection[str] = (),
                single: Collection[str] = ()) -> None:
    """Four sequences; with a CTC loss its sparse streams are shorter, except those ``tied`` to the data's
    time axis (``same_dim_tags_as``); ``single`` streams have one frame."""
    rng = np.random.RandomState(0)
    with HDFWriter(path, {k: DataKeyInfo(dim=d, sparse=s) for k, (d, s) in dims.items()}) as writer:
        for i in range(4):
            frames = rng.randint(40, 61)
            values = {}
            for key, (dim, sparse) in dims.items():
                length = 1 if key in single else max(1, frames // 8) if sparse and ctc and key not in tied \
                    else frames
                values[key] = (rng.randint(0, dim, length).astype(np.int32) if sparse
                               else rng.standard_normal((length, dim)).astype(np.float32))
            writer.insert(f"seq-{i}", values)


def refusals(findings: list, problems: list[str]) -> list[str]:
    """One short label per refusal: ``config key 'target'``, ``layer class 'decide'``, ..."""
    labels = []
    for f in findings:
        if f.fatal:
            labels.append(f"config key {f.name!r}" if f.kind == "config"
                          else f"{f.kind} option {f.cls}:{f.name}")
    for problem in problems:
        match = re.search(r"class '(\w+)' is a RETURNN layer class", problem)
        unit = re.search(r"unit (.+?) is not supported", problem)
        unit_class = re.search(r"unit layer '.+?': class '(\w+)' is not implemented inside", problem)
        if unit_class:
            labels.append(f"unit layer class {unit_class.group(1)!r}")
        else:
            labels.append(f"layer class {match.group(1)!r}" if match else
                          f"rec unit {unit.group(1)}" if unit else problem.split(";")[0][:90])
    return labels


def check(setup: Setup, corpus: str) -> list[str]:
    values = {key: setup.namespace[key] for key in DIM_KEYS if key in setup.namespace}
    if isinstance(values.get("extern_data"), dict):
        values["extern_data"] = with_engine_tags(values["extern_data"], time_tags(setup.namespace))
    values.update(network=setup.network, train={"class": "HDFDataset", "files": [corpus]},
                  dev={"class": "HDFDataset", "files": [corpus]})
    try:
        findings, problems = collect(Config(values))
    except EngineError as exc:
        return refusals([], [str(exc)])
    return refusals(findings, problems) if stop_reason(findings, problems) else []


def config_functions(root: str, path: str, namespace: dict[str, Any] | None = None) -> list[str]:
    """The source of the config's top-level functions and imports, which its ``eval`` layers may call (as
    ``self.network.get_config().typed_value('transform')``), and the top-level constants those functions
    read (``num_inputs = 40`` of a SpecAugment function) or eval strings name by ``typed_value('...')``
    (``bias_weight_threshold``); whether they import is the engine's to say. A constant computed by code
    (``ext_lm_scale = config.float("ext_lm_scale", 0.36)``) is written with its value in ``namespace``
    (the config's, as ``read_setup`` ran it) where that is a literal."""
    full = os.path.join(root, path)
    with open(full, encoding="utf8", errors="replace") as f:
        source = f.read()
    kinds = (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    body = ast.parse(source).body
    read = {node.id for top in body if isinstance(top, (ast.FunctionDef, ast.ClassDef))
            for node in ast.walk(top) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    read |= set(re.findall(r"typed_value\(\s*['\"](\w+)['\"]", source))
    kept = []
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name not in read:
                continue
            if _literal(ast.get_source_segment(source, node.value)):
                kept.append(ast.get_source_segment(source, node))
            elif namespace is not None and name in namespace and _literal(repr(namespace[name])):
                kept.append(f"{name} = {namespace[name]!r}")
        elif isinstance(node, kinds) and not _cluster_import(node):
            kept.append(ast.get_source_segment(source, node))
    return kept


def _cluster_import(node: ast.AST) -> bool:
    """An import of a module that is neither installed nor RETURNN's (i6's ``cachemanager``, which the
    authors' cluster had on a path the config appends): it fails with RETURNN too, anywhere else."""
    if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        modules = [node.module]
    else:
        return False
    tops = {module.split(".")[0] for module in modules}
    return any(top != "returnn" and top not in OLD_NAMES and importlib.util.find_spec(top) is None
               for top in tops)


def _literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return False
    return True


def stand_in_checkpoints(network: dict, extern: dict, target: Any, folder: str, name: str) -> dict:
    """The network with each rec unit subnetwork's ``load_on_init`` (the authors' LM checkpoint, which is
    not published) replaced by a RETURNN checkpoint written here from this engine's initial values of that
    subnetwork, under the names inside it: so the training step loads one as the setup would."""
    loads = [(rec, sub) for rec, layer in network.items() if isinstance(layer, dict)
             and isinstance(layer.get("unit"), dict)
             for sub, opts in layer["unit"].items() if isinstance(opts, dict) and opts.get("load_on_init")]
    if not loads:
        return network
    from engine.tools.export_returnn_checkpoint import build
    from engine.training.checkpoints.returnn_files import write_checkpoint
    from engine.training.checkpoints.returnn_format import ReturnnView

    network = copy.deepcopy(network)
    config = {"network": network, "extern_data": extern, **({"target": target} if target else {})}
    values = ReturnnView(build(Config(config))).values()
    for rec, sub in loads:
        prefix = f"{rec}/rec/{sub}/"
        path = os.path.join(folder, f"{name}.{rec}.{sub}.lm")
        write_checkpoint(path, {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)})
        network[rec]["unit"][sub]["load_on_init"] = path
    return network


def train_step(setup: Setup, corpus: str, folder: str, dims: dict[str, tuple[int, bool]],
               root: str) -> str:
    """'' when ``rnn.py`` trained the network one epoch; else the last line of its error."""
    prepared = prepare_training(setup, corpus, folder, dims, root)
    return prepared if isinstance(prepared, str) else run_training(*prepared)


def prepare_training(setup: Setup, corpus: str, folder: str, dims: dict[str, tuple[int, bool]],
                     root: str) -> tuple[str, str] | str:
    """The training config of the network, written into a new folder under ``folder`` (with the stand-ins
    of its ``load_on_init`` checkpoints): (that folder, the config), or why there is none. It builds
    TensorFlow objects in this process, so it runs in the main thread (TensorFlow's imports and graph
    building are not for two threads at once); ``run_training`` may run in another."""
    name = re.sub(r"[^\w.-]", "_", setup.path)
    work = tempfile.mkdtemp(prefix=f"{name}.", dir=folder)
    try:
        problem = _write_training_config(setup, corpus, work, dims, root, name)
    except BaseException:
        _clean(work)
        raise
    if problem:
        _clean(work)
        return problem
    return work, os.path.join(work, f"{name}.py")


def run_training(work: str, config: str) -> str:
    """'' when ``rnn.py`` trained ``config`` one epoch; else the last line of its error. The run's
    checkpoints (a published LM's stand-in and the model: up to gigabytes each) are removed afterwards;
    the training config stays in ``work``."""
    try:
        done = subprocess.run([sys.executable, os.path.join(ROOT, "rnn.py"), config], env=child_env(),
                              capture_output=True, text=True, timeout=TRAIN_SECONDS)
    except subprocess.TimeoutExpired:
        return f"no epoch within {TRAIN_SECONDS} s"
    finally:
        _clean(work)
    if done.returncode == 0 and "finished after" in done.stdout + done.stderr:
        return ""
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return f"exit {done.returncode}: {lines[-1][:200] if lines else ''}"


def _clean(work: str) -> None:
    for entry in os.listdir(work):
        path = os.path.join(work, entry)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif not entry.endswith(".py"):
            os.remove(path)


def _write_training_config(setup: Setup, corpus: str, folder: str, dims: dict[str, tuple[int, bool]],
                           root: str, name: str) -> str:
    """Writes ``<folder>/<name>.py``; '' or why it could not."""
    text = repr(setup.network)
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return "the network holds values that are not literals (functions, objects): not written to a file"
    extern = {k: {"dim": d, "sparse": s} for k, (d, s) in dims.items()}
    tags = time_tags(setup.namespace)
    tag_lines = [f"_time_tag{n} = DimensionTag(kind=DimensionTag.Types.Spatial, description='time{n}')"
                 for n in sorted(set(tags.values()))]
    extern_text = "{" + ", ".join(
        f"{key!r}: {{'dim': {dim}, 'sparse': {sparse}"
        + (f", 'same_dim_tags_as': {{'t': _time_tag{tags[key]}}}}}" if key in tags else "}")
        for key, (dim, sparse) in dims.items()) + "}"
    try:
        network = stand_in_checkpoints(setup.network, extern, setup.namespace.get("target"), folder, name)
    except EngineError as exc:
        return f"the stand-in for its load_on_init checkpoint: {str(exc)[:200]}"
    lines = config_functions(root, setup.path, setup.namespace) + [
        *(["from TFUtil import DimensionTag"] + tag_lines if tag_lines else []),
        f"network = {network!r}", f"extern_data = {extern_text}",
        f"train = {{'class': 'HDFDataset', 'files': [{corpus!r}]}}", "dev = train",
        "num_epochs = 1", "batch_size = 100000", "max_seqs = 2", f"model = {os.path.join(folder, name)!r}"]
    if "target" in setup.namespace:
        lines.append(f"target = {setup.namespace['target']!r}")
    with open(os.path.join(folder, f"{name}.py"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--years", default=",".join(SETUP_YEARS))
    parser.add_argument("--no-train", action="store_true", help="only the check, no training step")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="training runs at a time (default: one per core)")
    parser.add_argument("--top", type=int, default=30, help="rows of each table")
    parser.add_argument("--folder", help="corpora and training runs here (default: a temporary folder)")
    parser.add_argument("--show-accepted", action="store_true", help="list the accepted networks")
    args = parser.parse_args()
    log.init(verbosity=log.WARNING)  # the tables, not the check's notes on each network
    folder = args.folder or tempfile.mkdtemp(prefix="bench-returnn-coverage-")
    os.makedirs(folder, exist_ok=True)
    paths = setup_paths(args.checkout, tuple(args.years.split(",")))
    refused_by: collections.Counter = collections.Counter()
    missing_classes: collections.Counter = collections.Counter()
    networks, accepted, runs = 0, [], {}
    corpora: dict[tuple, str] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max(args.jobs, 1))
    for path in paths:
        setup = read_setup(args.checkout, path)
        if setup.network is None:
            continue
        networks += 1
        classes = {layer.get("class") for layer in layer_dicts(setup.network)}
        # a dict without 'class' (a network nested in an option) is no layer class to count
        missing_classes.update(str(c) for c in classes if c is not None and c not in BUILT_CLASSES)
        dims = streams(setup.namespace) or described_streams(setup.namespace)
        if dims is None:
            refused_by["dims: extern_data / num_outputs missing or not literal"] += 1
            continue
        tags = time_tags(setup.namespace)
        tied = tuple(sorted(k for k in tags if "data" in tags and tags[k] == tags["data"]))
        signature = (tuple(sorted(dims.items())), uses_ctc(setup.network), tied,
                     one_frame_streams(setup.network))
        if signature not in corpora:
            corpora[signature] = os.path.join(folder, f"corpus-{len(corpora)}.hdf")
            make_corpus(corpora[signature], dims, *signature[1:])
        labels = check(setup, corpora[signature])
        refused_by.update(set(labels))
        if labels:
            continue
        accepted.append(path)
        if not args.no_train:
            prepared = prepare_training(setup, corpora[signature], folder, dims, args.checkout)
            runs[path] = pool.submit(lambda p=prepared: p if isinstance(p, str) else run_training(*p))
            runs[path].add_done_callback(lambda run, path=path: print(
                f"trained {path}: {run.result() or 'OK'}", file=sys.stderr, flush=True))
    pool.shutdown()
    failed_steps = [(path, run.result()) for path, run in runs.items() if run.result()]
    trained = len(runs) - len(failed_steps)
    print(f"{len(paths)} configs under {args.checkout} ({args.years}); {networks} leave a network dict")
    print(f"  --check accepts {len(accepted)} of {networks} ({100 * len(accepted) / max(networks, 1):.0f} %)")
    if not args.no_train:
        print(f"  trained one epoch (2 steps): {trained} of the {len(accepted)} accepted")
    print(f"\nrefusals, by the number of networks they stop (of {networks}):")
    for label, count in refused_by.most_common(args.top):
        print(f"  {count:5d}  {label}")
    print(f"\nlayer classes this engine lacks, by the number of networks that use them (of {networks}):")
    for cls, count in missing_classes.most_common(args.top):
        print(f"  {count:5d}  {cls}")
    if failed_steps:
        print("\naccepted by the check, but did not train:")
        for path, problem in failed_steps:
            print(f"  {path}: {problem}")
    if args.show_accepted:
        print("\naccepted:\n" + "\n".join(f"  {p}" for p in accepted))
    print(f"\nfolder: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
