"""The programs the docs run, run: every Python program a doc command names (rnn.py, a script of tools/,
benchmarks/ or demos/, a console command as its tools/ script) starts with ``--help``, and its help lists
every ``--option`` a doc command passes it. The commands are found as test_docs_commands.py finds them."""
from __future__ import annotations

import itertools
import json
import re
import sys

import pytest

from helpers import ROOT, run
from test_docs_commands import (DOCS, all_code, commands, console_scripts, is_repo_script, program_of, report,
                                words_of)


# Programs that run the command after their own options (mpirun-guard runs mpirun with the rest).
WRAPPERS = {"tools/mpirun_guard.py"}


def documented_programs() -> dict[str, dict[str, str]]:
    """Every Python program a doc command runs (a repository script after .venv/bin/python, or a console
    command of setup.cfg, as its tools/ script) -> the --options the docs pass it -> where."""
    found: dict[str, dict[str, str]] = {}
    for doc in DOCS:
        for code in all_code(doc):
            for command in commands(code):
                words = words_of(command)
                program = program_of(words)
                rest = words[words.index(program) + 1:] if program in words else []
                if program.endswith(".venv/bin/python") and rest and is_repo_script(rest[0]) \
                        or program.endswith(".venv/bin/python") and rest and rest[0] == "rnn.py":
                    script, arguments = rest[0], rest[1:]
                elif program.startswith(".venv/bin/") and program[len(".venv/bin/"):] in console_scripts():
                    script, arguments = f"tools/{program[len('.venv/bin/'):].replace('-', '_')}.py", rest
                else:
                    continue
                if not script.endswith(".py"):
                    continue
                options = found.setdefault(script, {})
                if "--" in arguments:  # supervise -- COMMAND: the rest is the command it runs
                    arguments = arguments[:arguments.index("--")]
                if script in WRAPPERS:  # mpirun-guard [options] MPIRUN ...: the rest is mpirun's
                    arguments = list(itertools.takewhile(lambda word: word.startswith("-"), arguments))
                for word in arguments:
                    if re.fullmatch(r"--[a-z][\w-]*(=.*)?", word):
                        options.setdefault(word.split("=")[0], code.where())
    return found


# Runs each script as ``python SCRIPT --help`` would (as __main__, from the repository root), in one
# process for all (a Python start per script would cost a second each); prints {script: [status, help]}.
HELP_RUNNER = """
import contextlib, io, json, os, runpy, sys
results = {}
for script in sys.argv[1:]:
    out, status = io.StringIO(), 0
    sys.argv, saved_path = [script, "--help"], list(sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:
        status, _ = 1, out.write(f"{type(exc).__name__}: {exc}")
    sys.path[:] = saved_path
    results[script] = [status, out.getvalue()]
print(json.dumps(results))
"""


@pytest.mark.slow
def test_documented_programs_start_and_take_the_documented_options():
    """Runs each program the docs run, with --help: it must start (its imports, its argument parser)
    and list every option a doc command passes it."""
    programs = documented_programs()
    assert {"rnn.py", "tools/make_hostfile.py", "benchmarks/bench_multihost.py"} <= set(programs), programs
    done = run([sys.executable, "-c", HELP_RUNNER, *sorted(programs)], timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    problems = []
    for script, (status, text) in json.loads(done.stdout.splitlines()[-1]).items():
        if status != 0:
            problems.append(f"{script} --help: exit {status}: {text[-600:]}")
            continue
        problems += [f"{where}: {script} {option}: not an option of {script} (its --help lists none)"
                     for option, where in programs[script].items()
                     if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text)]
    assert not problems, report(problems)
