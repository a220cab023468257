"""``gen-returnn-keys``: write ``engine/config/returnn_names_table.py``, the names RETURNN defines, from
RETURNN's source.

    gen-returnn-keys [--git RETURNN_GIT_DIR --commit REV ...] [--dir INSTALLED_RETURNN_PACKAGE ...]
                     [--out engine/config/returnn_names_table.py]

Reads the given commits of a RETURNN git repository (a bare mirror is enough) and installed copies of
the ``returnn`` package, and collects:

- config keys: the first argument of every config read (``config.value/typed_value/opt_typed_value/int/
  float/bool/bool_or_other/list/int_list/float_list/has/is_true/is_typed/get_of_type``, ``typed_dict``
  look-ups) with a string literal, a loop variable over a literal list, or the parameter of a helper
  that is called with literals; the ``dest`` of the old command-line options; the keys documented in
  ``docs/configuration_reference``;
- layer classes (``layer_class = "..."``) with their options: the ``__init__`` parameters of the class
  and its bases, and the keys ``transform_config_dict`` reads from the layer dict;
- dataset classes (subclasses of ``Dataset``) with their ``__init__`` parameters, bases included.

Files under tests/, tools/ and demos/ are skipped. The output is data, sorted, and is committed: the
engine never reads RETURNN's source at run time. Several eras are read, so that the names of old
recipes are known too; the committed file was made with

    gen-returnn-keys --git <rwth-i6/returnn clone> --commit e45647921^ --commit ec2ecda83 \
        --commit ac3a9e2b0^ --commit 23cc84aa2 --commit b46ff5f0f --dir <site-packages>/returnn

that is: the last commit that read ``update_on_device`` (2015), the end of 2017 (the time of the 12AX
demos and of the 2016 papers' recipes), the last commit with the neural transducer layer (2021), the
last commit with the Theano backend (2022), the newest commit and the newest release (1.20261022).
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Collection, Iterable, Iterator

from engine.runtime.atomic_file import write_text_atomically

READ_METHODS = ("value", "typed_value", "opt_typed_value", "int", "float", "bool", "bool_or_other", "list",
                "int_list", "float_list", "int_pair", "has", "is_true", "is_typed", "get_of_type")
# ``config.value("key"``, ``self.config.int('key'``, ``get_global_config().typed_value("key"`` ...
_LITERAL_READ = re.compile(r"\w*config\w*(?:\(\))?\s*\.\s*(?:%s)\(\s*[rbu]?(['\"])([A-Za-z_]\w*)\1"
                           % "|".join(READ_METHODS))
_TYPED_DICT = re.compile(r"\w*config\w*(?:\(\))?\.typed_dict(?:\.get\(|\[)\s*(['\"])([A-Za-z_]\w*)\1")
_OPTION_DEST = re.compile(r"add_option\([^)]*?dest\s*=\s*(['\"])(\w+)\1", re.S)
_DOC_TERM = re.compile(r"^([a-z_][A-Za-z0-9_]*)\s*\n(?=[ \t]+\S)", re.M)
_RECEIVER = re.compile(r"\w*config\w*(\(\))?$")
_SKIPPED_DIRS = ("tests/", "tools/", "demos/", "docs/")
_SET_BY_THE_NETWORK = {"name", "network", "output", "sources", "rec_previous_layer"}  # not layer dict options
_NOT_CONFIG_KEYS = {"load_config", "version"}  # command-line actions, not keys


@dataclass
class ClassInfo:
    bases: list[str]
    params: set[str] = field(default_factory=set)
    dict_keys: set[str] = field(default_factory=set)  # read from the layer dict in transform_config_dict
    layer_class: str | None = None


@dataclass
class Snapshot:
    config_keys: set[str] = field(default_factory=set)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    unparsed: list[str] = field(default_factory=list)


def _dir_version(root: str) -> str:
    """The version an installed package's ``_setup_info_generated.py`` names, if any."""
    try:
        with open(os.path.join(root, "_setup_info_generated.py"), encoding="utf-8") as f:
            match = re.search(r"version\s*=\s*['\"]([^'\"]+)", f.read())
    except OSError:
        return "(installed copy)"
    return f"{match.group(1)} (installed copy)" if match else "(installed copy)"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def git_files(git_dir: str, commit: str) -> Iterator[tuple[str, str]]:
    """(path, text) of the files of ``commit`` that are read."""
    for path in git(git_dir, "ls-tree", "-r", "--name-only", commit).splitlines():
        if _wanted(path):
            yield path, git(git_dir, "show", f"{commit}:{path}")


def dir_files(root: str) -> Iterator[tuple[str, str]]:
    """(path relative to ``root``, text) of the files under ``root`` that are read (an installed package)."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.relpath(os.path.join(dirpath, name), root)
            if _wanted(path):
                with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                    yield path, f.read()


def _wanted(path: str) -> bool:
    if path.startswith("docs/configuration_reference/") and path.endswith(".rst"):
        return True
    return path.endswith(".py") and not path.startswith(_SKIPPED_DIRS) and "/test_" not in f"/{path}"


def _theano_module(path: str) -> bool:
    """``returnn/theano/...`` (2018-2022) or a top-level ``Network*.py`` (before 2018)."""
    return "theano" in path.lower() or ("/" not in path and path.startswith("Network"))


def read_snapshot(files: Iterable[tuple[str, str]]) -> Snapshot:
    snap = Snapshot()
    for path, text in files:
        if path.endswith(".rst"):
            snap.config_keys |= set(_DOC_TERM.findall(text))
            continue
        snap.config_keys |= {m.group(2) for m in _LITERAL_READ.finditer(text)}
        snap.config_keys |= {m.group(2) for m in _TYPED_DICT.finditer(text)}
        if path.endswith(("config.py", "Config.py")):
            snap.config_keys |= {m.group(2) for m in _OPTION_DEST.finditer(text)} - _NOT_CONFIG_KEYS
        try:
            tree = ast.parse(text)
        except SyntaxError:  # Python 2 era files: their literal reads are found above
            snap.unparsed.append(path)
            continue
        snap.config_keys |= _indirect_reads(tree)
        if not _theano_module(path):  # its layer classes share names with the TF ones but not options
            _collect_classes(tree, snap.classes)
    return snap


def _is_config_read(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in READ_METHODS and bool(node.args)
            and bool(_RECEIVER.search(ast.unparse(node.func.value))))


def _str_items(node: ast.AST | None) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return None


def _possible_strings(node: ast.AST) -> list[str]:
    """The values an expression made of literals can have: ``f"batch_size_{'train' if t else 'dev'}"``
    -> both names; an expression with anything else in it -> none."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.IfExp):
        return _possible_strings(node.body) + _possible_strings(node.orelse)
    if isinstance(node, ast.FormattedValue) and node.format_spec is None:
        return _possible_strings(node.value)
    if isinstance(node, ast.JoinedStr):
        results = [""]
        for part in node.values:
            options = _possible_strings(part)
            if not options:
                return []
            results = [r + o for r in results for o in options]
        return results
    return []


def _indirect_reads(tree: ast.Module) -> set[str]:
    """Keys read through a variable: ``for key in [...]: config.value(key)``, a module-level list of names,
    or a helper ``def f(key): config.value(key)`` called as ``f("name")``."""
    literal_lists = {t.id: _str_items(node.value) for node in tree.body if isinstance(node, ast.Assign)
                     for t in node.targets if isinstance(t, ast.Name) and _str_items(node.value)}
    found: set[str] = set()
    helpers: dict[str, int] = {}  # helper function name -> position of its key parameter

    def visit(node: ast.AST, loops: dict[str, list[str]], params: dict[str, tuple[str, int]]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [a.arg for a in node.args.posonlyargs + node.args.args]
            offset = 1 if args[:1] in (["self"], ["cls"]) else 0
            params = {a: (node.name, i - offset) for i, a in enumerate(args)}
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            items = _str_items(node.iter)
            if items is None and isinstance(node.iter, ast.Name):
                items = literal_lists.get(node.iter.id)
            if items is not None:
                loops = dict(loops, **{node.target.id: items})
        if _is_config_read(node):
            found.update(_possible_strings(node.args[0]))
        if _is_config_read(node) and isinstance(node.args[0], ast.Name):
            var = node.args[0].id
            if var in loops:
                found.update(loops[var])
            elif var in params and params[var][1] >= 0:
                helpers[params[var][0]] = params[var][1]
        for child in ast.iter_child_nodes(node):
            visit(child, loops, params)

    visit(tree, {}, {})
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            pos = helpers.get(name)
            if pos is not None and len(node.args) > pos and isinstance(node.args[pos], ast.Constant) \
                    and isinstance(node.args[pos].value, str):
                found.add(node.args[pos].value)
    return found


def _collect_classes(tree: ast.Module, classes: dict[str, ClassInfo]) -> None:
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        info = classes.setdefault(node.name, ClassInfo(bases=[]))
        info.bases += [ast.unparse(b).split(".")[-1] for b in node.bases]
        for item in node.body:
            if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "layer_class"
                                                    for t in item.targets):
                if isinstance(item.value, ast.Constant) and isinstance(item.value.value, str):
                    info.layer_class = item.value.value
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                a = item.args
                info.params |= {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
            if isinstance(item, ast.FunctionDef) and item.name == "transform_config_dict" \
                    and item.args.args[1:]:
                info.dict_keys |= _dict_keys(item, item.args.args[1].arg)


def _dict_keys(func: ast.FunctionDef, dict_name: str) -> set[str]:
    """String keys of ``d.get("k")``, ``d.pop("k")``, ``d["k"]`` and ``"k" in d`` in ``func``."""
    keys = set()
    for node in ast.walk(func):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "get", "pop", "setdefault") and ast.unparse(node.func.value) == dict_name and node.args:
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == dict_name:
            key = node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and len(node.ops) == 1 and ast.unparse(node.comparators[0]) == dict_name:
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.add(key.value)
    return keys


def _options(name: str, classes: dict[str, ClassInfo], not_options: Collection[str] = (),
             seen: set[str] | None = None) -> set[str]:
    """The options of class ``name``: its own and its bases', without ``not_options``."""
    seen = set() if seen is None else seen
    if name in seen or name not in classes:
        return set()
    seen.add(name)
    info = classes[name]
    options = {p for p in info.params | info.dict_keys if not p.startswith("_")} - {"self", *not_options}
    for base in info.bases:
        options |= _options(base, classes, not_options, seen)
    return options


def _derives_from(name: str, root: str, classes: dict[str, ClassInfo], seen: set[str] | None = None) -> bool:
    seen = set() if seen is None else seen
    if name == root:
        return True
    if name in seen or name not in classes:
        return False
    seen.add(name)
    return any(_derives_from(b, root, classes, seen) for b in classes[name].bases)


def layer_options(classes: dict[str, ClassInfo]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for name, info in classes.items():
        internal = not info.layer_class or info.layer_class.startswith(":")  # ":i": the rec loop's step
        if not internal and _derives_from(name, "LayerBase", classes):
            result.setdefault(info.layer_class, set()).update(_options(name, classes, _SET_BY_THE_NETWORK))
    return result


def dataset_options(classes: dict[str, ClassInfo]) -> dict[str, set[str]]:
    return {name: _options(name, classes) for name in classes
            if _derives_from(name, "Dataset", classes) and not name.startswith("_")}


def render(sources: list[str], config_keys: set[str], layers: dict[str, set[str]], layer_common: set[str],
           datasets: dict[str, set[str]], dataset_common: set[str]) -> str:
    def names(values: set[str], indent: str) -> str:
        text = " ".join(sorted(values))
        return "\n".join(textwrap.wrap(text, 110, initial_indent=indent, subsequent_indent=indent,
                                       break_on_hyphens=False))

    def table(title: str, common_name: str, common: set[str], per_class: dict[str, set[str]]) -> list[str]:
        out = [f"{common_name} = _names(\"\"\"", names(common, "    "), "\"\"\")",
               f"{title}: dict[str, frozenset[str]] = {{  # class -> its options beyond {common_name}"]
        for cls in sorted(per_class):
            extra = per_class[cls] - common
            one_line = f"    {cls!r}: _names(\"{' '.join(sorted(extra))}\"),"
            out.append(one_line if len(one_line) <= 110 else
                       f"    {cls!r}: _names(\"\"\"\n{names(extra, '        ')}\n    \"\"\"),")
        return out + ["}", ""]

    lines = [
        '"""What RETURNN defines: its config keys, its layer classes and their options, its dataset classes',
        "and their options. Generated by ``gen-returnn-keys`` (engine/tools/gen_returnn_keys.py, which says",
        "what is collected and how) from rwth-i6/returnn; do not edit by hand. Sources read:",
        *[f"    {s}" for s in sources],
        '"""',
        "from __future__ import annotations",
        "",
        "",
        "def _names(text: str) -> frozenset[str]:",
        "    return frozenset(text.split())",
        "",
        "",
        "CONFIG_KEYS = _names(\"\"\"",
        *sorted(config_keys),
        "\"\"\")",
        "",
        *table("LAYER_OPTIONS", "LAYER_COMMON_OPTIONS", layer_common, layers),
        *table("DATASET_OPTIONS", "DATASET_COMMON_OPTIONS", dataset_common, datasets),
    ]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git", help="RETURNN git directory (a bare mirror is enough)")
    parser.add_argument("--commit", action="append", help="a commit to read (repeat)")
    parser.add_argument("--dir", action="append", help="an installed returnn package directory (repeat)")
    parser.add_argument("--out", default="engine/config/returnn_names_table.py")
    args = parser.parse_args(argv)
    if args.commit and not args.git:
        parser.error("--commit needs --git")
    config_keys: set[str] = set()
    layers: dict[str, set[str]] = {}
    datasets: dict[str, set[str]] = {}
    layer_common: set[str] = set()
    dataset_common: set[str] = set()
    sources = []
    snapshots = []
    for commit in args.commit or []:
        full, date = git(args.git, "log", "-1", "--format=%H %cs", commit).split()
        snapshots.append((f"rwth-i6/returnn {full} ({date})", git_files(args.git, full)))
    for root in args.dir or []:
        label = f"{os.path.basename(os.path.normpath(root))} {_dir_version(root)}"
        snapshots.append((label, dir_files(root)))
    for label, files in snapshots:
        sources.append(label)
        snap = read_snapshot(files)
        if snap.unparsed:
            print(f"{label}: {len(snap.unparsed)} files not Python 3 (literal reads only)", file=sys.stderr)
        config_keys |= snap.config_keys
        for cls, opts in layer_options(snap.classes).items():
            layers.setdefault(cls, set()).update(opts)
        for cls, opts in dataset_options(snap.classes).items():
            datasets.setdefault(cls, set()).update(opts)
        if "LayerBase" in snap.classes:
            layer_common |= _options("LayerBase", snap.classes, _SET_BY_THE_NETWORK) | {"class", "from"}
        dataset_common |= _options("Dataset", snap.classes)
    datasets.pop("Dataset", None)
    config_keys = {key for key in config_keys if not key.startswith("_")}  # config code's own, by convention
    text = render(sources, config_keys, layers, layer_common, datasets, dataset_common)
    write_text_atomically(args.out, text)
    print(f"{args.out}: {len(config_keys)} config keys, {len(layers)} layer classes, {len(datasets)} dataset "
          f"classes", file=sys.stderr)
    return 0
