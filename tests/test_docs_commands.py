"""README.md and docs/*.md are the contract, and what they show must run as written on the fresh machine the
README describes: after `make install` the engine's Python, mpirun and console commands live in .venv/bin,
and none of them is on PATH. This test reads the markdown as text (no TensorFlow, no command is run) and
fails where a doc names something that is not there:

- `make TARGET`: a target of the Makefile;
- a repository path (tools/..., configs/..., demos/..., benchmarks/..., docs/..., tests/..., engine/...,
  any *.md name): it exists;
- `.venv/bin/NAME`: a console command of setup.cfg, or a program the install puts there;
- a command (a line of a ```bash block, a `$ ` line of a ```console block, inline `code` that starts with
  a program): it names the environment's programs by path (.venv/bin/python, .venv/bin/mpirun), runs the
  repository's Python scripts with .venv/bin/python, and runs its shell scripts only if they are executable;
- a markdown link to a local file: the file exists, and its #anchor is one of the file's headings;
- a ```python block headed `# configs/NAME.py`: it assigns every key of that file, with the file's values.

test_docs_programs.py runs the programs these commands name.
"""
from __future__ import annotations

import ast
import configparser
import os
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf_latest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# What tools/install_env.sh puts into .venv/bin besides setup.cfg's console commands.
INSTALLED_PROGRAMS = {"python", "python3", "pip", "mpirun", "mpiexec", "pytest", "flake8", "tensorboard",
                      "horovodrun"}
# Files of the virtual environment itself that a doc may name (`source .venv/bin/activate`).
VENV_FILES = {"activate"}
SHELL_LANGUAGES = {"bash", "sh", "shell"}
REPO_DIRS = ("tools", "configs", "demos", "benchmarks", "docs", "tests", "engine", ".ci")
# Repository scripts that take mpirun and python from PATH: a command must put .venv/bin first on PATH.
NEEDS_ENVIRONMENT_ON_PATH = {"demos/demo-horovod-mpi.sh"}

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`]+)`")
URL = re.compile(r"[a-z]+://\S+")
# a path under one of REPO_DIRS, not inside a longer path ($ENGINE_ROOT/tools/... is not the repository's)
REPO_PATH = re.compile(r"(?<![\w./$-])((?:%s)/[\w./*-]*)" % "|".join(re.escape(d) for d in REPO_DIRS))
MD_NAME = re.compile(r"(?<![\w./$-])([\w./-]*[\w-]\.md)\b")
# a script in a folder: `config/cli.py` in the README is engine/config/cli.py
SCRIPT_PATH = re.compile(r"(?<![\w./$-])((?:[\w-]+/)+[\w-]+\.(?:py|sh))\b")
VENV_PROGRAM = re.compile(r"\.venv[\w-]*/bin/([\w.+-]+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")
ASSIGNMENT_WORD = re.compile(r"^[A-Za-z_]\w*=")


@dataclass(frozen=True)
class Code:
    """A piece of code in a doc: a fenced block (``language`` is the fence's, "" for none) or an inline
    span (``language`` "inline", its whitespace collapsed to single spaces)."""

    doc: Path
    line: int
    language: str
    text: str

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


# ----- reading the markdown -----
@lru_cache(maxsize=None)
def fenced_blocks_and_prose(doc: Path) -> tuple[tuple[Code, ...], str]:
    """The fenced blocks of ``doc``, and its text with the blocks blanked out (line numbers kept)."""
    text = doc.read_text()
    blocks = []

    def blank(match: re.Match) -> str:
        first_line = text.count("\n", 0, match.start()) + 2  # the line after the opening fence
        blocks.append(Code(doc, first_line, match.group(1), match.group(2)))
        return "\n" * match.group(0).count("\n")

    prose = FENCE.sub(blank, text)
    return tuple(blocks), prose


def inline_code(doc: Path) -> list[Code]:
    _, prose = fenced_blocks_and_prose(doc)
    return [Code(doc, prose.count("\n", 0, m.start()) + 1, "inline", " ".join(m.group(1).split()))
            for m in INLINE_CODE.finditer(prose)]


def all_code(doc: Path) -> list[Code]:
    blocks, _ = fenced_blocks_and_prose(doc)
    return [*blocks, *inline_code(doc)]


def line_of(doc: Path, offset: int) -> int:
    return doc.read_text().count("\n", 0, offset) + 1


# ----- what the repository provides -----
@lru_cache(maxsize=None)
def makefile_targets() -> frozenset[str]:
    return frozenset(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M))


@lru_cache(maxsize=None)
def console_scripts() -> frozenset[str]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].splitlines()
    return frozenset(line.split("=")[0].strip() for line in lines if line.strip())


def environment_programs() -> frozenset[str]:
    """Programs that exist only in .venv/bin: a command must name them by that path."""
    return INSTALLED_PROGRAMS | console_scripts()


def repo_path_exists(path: str, doc: Path) -> bool:
    """``path`` relative to the repository, the doc's folder, docs/ (`performance.md` is a name of
    docs/performance.md in any doc) or engine/ (`config/cli.py`); a * matches as in the shell."""
    path = path.rstrip(".,:;")
    bases = (ROOT, doc.parent, ROOT / "docs", ROOT / "engine")
    return any(list(base.glob(path)) if "*" in path else (base / path).exists() for base in bases)


# ----- commands -----
def strip_comment(line: str) -> str:
    return re.sub(r"(^|\s)#.*", "", line).strip()


def words_of(command: str) -> list[str]:
    """The command's words; quotes are dropped, so that `--wrap "make sanity"` shows its words too."""
    return command.replace('"', " ").replace("'", " ").split()


def program_of(words: list[str]) -> str:
    """The program a command runs: its first word after `NAME=value` settings, `sudo` and a `$ ` prompt."""
    for word in words:
        if not (ASSIGNMENT_WORD.match(word) or word in ("sudo", "$")):
            return word
    return ""


def is_repo_script(word: str) -> bool:
    return word.startswith(tuple(d + "/" for d in REPO_DIRS)) and word.endswith((".py", ".sh"))


def starts_with_a_program(words: list[str]) -> bool:
    program = program_of(words)
    return (program == "make" or program in environment_programs() or is_repo_script(program)
            or ".venv" in program)


def commands(code: Code) -> list[str]:
    """The shell commands in ``code``: each line of a shell block (continuation lines joined, comments
    dropped), the `$ ` lines of a console block, and an inline span that starts with a program and has
    arguments (a program's name alone is a mention, not a command)."""
    if code.language in SHELL_LANGUAGES:
        lines = [strip_comment(line) for line in code.text.replace("\\\n", " ").splitlines()]
        return [line for line in lines if line]
    if code.language == "console":
        return [line[2:] for line in code.text.splitlines() if line.startswith("$ ")]
    if code.language == "inline":
        words = words_of(code.text)
        if len(words) > 1 and starts_with_a_program(words):
            return [code.text]
    return []


def command_problems(command: str) -> list[str]:
    words = words_of(command)
    problems = [f"`{word}` is on PATH only in an activated environment: write .venv/bin/{word}"
                for word in words if word in environment_programs()]
    program = program_of(words)
    script = ROOT / program
    if is_repo_script(program) and program.endswith(".py"):
        problems.append(f"run {program} with .venv/bin/python (the system Python lacks the engine's "
                        "packages)")
    elif is_repo_script(program) and script.exists() and not os.access(script, os.X_OK):
        problems.append(f"{program} is not executable: run it with bash")
    if program in NEEDS_ENVIRONMENT_ON_PATH and not any(word.startswith("PATH=") for word in words):
        problems.append(f"{program} takes mpirun and python from PATH: put .venv/bin first on PATH")
    return problems


def make_targets(command: str) -> list[str]:
    """The target of each `make` in ``command`` (its first word that is no option and no setting)."""
    words = words_of(command)
    targets = []
    for i, word in enumerate(words):
        if word == "make":
            rest = [w for w in words[i + 1:] if not (w.startswith("-") or ASSIGNMENT_WORD.match(w))]
            if rest:
                targets.append(rest[0])
    return targets


def code_with_commands(doc: Path) -> list[tuple[Code, str]]:
    """(code, command) for every command of the doc; inline spans count whole, also when they do not
    start with a program (`sbatch --wrap "make sanity"` runs make too)."""
    found = []
    for code in all_code(doc):
        texts = [code.text] if code.language == "inline" else commands(code)
        found += [(code, text) for text in texts]
    return found


# ----- links -----
def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lower case, only letters, digits, `_`,
    `-` and spaces, the spaces turned into hyphens."""
    text = re.sub(r"[`*]", "", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@lru_cache(maxsize=None)
def heading_anchors(doc: Path) -> frozenset[str]:
    _, prose = fenced_blocks_and_prose(doc)
    anchors, seen = set(), Counter()
    for line in prose.splitlines():
        match = HEADING.match(line)
        if match:
            anchor = github_anchor(match.group(1))
            anchors.add(anchor if not seen[anchor] else f"{anchor}-{seen[anchor]}")
            seen[anchor] += 1
    return frozenset(anchors)


# ----- config excerpts -----
def top_level_assignments(source: str) -> dict[str, ast.expr]:
    return {target.id: node.value for node in ast.parse(source).body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}


def config_excerpts(doc: Path) -> list[tuple[Code, str]]:
    """(block, config path) for each ```python block whose first line is a comment naming configs/NAME.py."""
    blocks, _ = fenced_blocks_and_prose(doc)
    excerpts = []
    for block in blocks:
        match = re.match(r"#\s*(configs/[\w.-]+\.py)\b", block.text)
        if block.language == "python" and match:
            excerpts.append((block, match.group(1)))
    return excerpts


# ----- the tests -----
def doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def report(problems: list[str]) -> str:
    return "the docs name what is not there:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_make_targets_exist(doc):
    problems = [f"{code.where()}: `{command}`: no target '{target}' in the Makefile"
                for code, command in code_with_commands(doc) for target in make_targets(command)
                if target not in makefile_targets()]
    assert not problems, report(problems)


def repo_paths(doc: Path) -> dict[str, int]:
    """The repository paths the doc names, in its text and its code (not in URLs), each with the line
    where it first appears."""
    text = URL.sub("", doc.read_text())
    found: dict[str, int] = {}
    for pattern in (REPO_PATH, MD_NAME, SCRIPT_PATH):
        for match in pattern.finditer(text):
            found.setdefault(match.group(1), line_of(doc, match.start()))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_repository_paths_exist(doc):
    problems = [f"{doc_id(doc)}:{line}: no such file: {path}"
                for path, line in sorted(repo_paths(doc).items(), key=lambda item: item[1])
                if not repo_path_exists(path, doc)]
    assert not problems, report(problems)


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_environment_programs_are_installed(doc):
    known = ", ".join(sorted(INSTALLED_PROGRAMS))
    problems = [f"{doc_id(doc)}:{line_of(doc, m.start())}: {m.group(0)}: the install puts no "
                f"'{m.group(1)}' there (setup.cfg's console commands, or {known})"
                for m in VENV_PROGRAM.finditer(doc.read_text())
                if m.group(1) not in environment_programs() | VENV_FILES]
    assert not problems, report(problems)


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_commands_name_their_programs_by_path(doc):
    problems = [f"{code.where()}: `{command}`: {problem}" for code in all_code(doc)
                for command in commands(code) for problem in command_problems(command)]
    assert not problems, report(problems)


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_local_links_resolve(doc):
    _, prose = fenced_blocks_and_prose(doc)
    problems = []
    for match in LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        where = f"{doc_id(doc)}:{prose.count(chr(10), 0, match.start()) + 1}: ({target})"
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
            problems.append(f"{where}: no heading with the anchor #{anchor} in {linked.relative_to(ROOT)}")
    assert not problems, report(problems)


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_config_excerpts_match_their_files(doc):
    problems = []
    for block, config in config_excerpts(doc):
        shown = top_level_assignments(block.text)
        real = top_level_assignments((ROOT / config).read_text())
        for key in sorted(real.keys() - shown.keys()):
            problems.append(f"{block.where()}: the excerpt of {config} leaves out "
                            f"{key} = {ast.unparse(real[key])}")
        for key in sorted(shown.keys() - real.keys()):
            problems.append(f"{block.where()}: the excerpt of {config} sets {key}, which the file does not")
        for key in sorted(shown.keys() & real.keys()):
            if ast.dump(shown[key]) != ast.dump(real[key]):
                problems.append(f"{block.where()}: the excerpt of {config} shows {key} = "
                                f"{ast.unparse(shown[key])}; the file has {ast.unparse(real[key])}")
    assert not problems, report(problems)


def test_the_readme_names_every_console_command():
    """A console command added to setup.cfg, or renamed there, must be named in the README."""
    named = {code.text for code in inline_code(ROOT / "README.md")}
    missing = sorted(console_scripts() - named)
    assert not missing, f"setup.cfg's console commands that the README does not name: {missing}"


def test_the_readme_shows_the_12ax_config():
    assert [config for _, config in config_excerpts(ROOT / "README.md")] == ["configs/12ax.py"]


def test_the_parsers_see_the_readme_commands():
    """Guards the checks above against a parser that finds nothing (and so passes everything)."""
    readme = ROOT / "README.md"
    found = [command for _, command in code_with_commands(readme)]
    assert "make demo" in found and "make test" in found
    assert any(command.startswith(".venv/bin/mpirun") for command in found)
    assert {"demo", "test", "sanity", "bench"} <= {t for c in found for t in make_targets(c)}
    assert {"docs/hdf-format.md", "configs/12ax.py", "config/cli.py"} <= repo_paths(readme).keys()
    monitoring = (ROOT / "docs" / "monitoring.md").read_text()
    assert "images/learning_curve_12ax.png" in {m.group(1) for m in LINK.finditer(monitoring)}
    assert github_anchor("Overlap (`distributed_bucket_mb`)") == "overlap-distributed_bucket_mb"
    assert command_problems("mpirun -np 2 python rnn.py x") and command_problems("tools/hdf_dump.py a b")
