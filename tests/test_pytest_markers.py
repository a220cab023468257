"""The suites are chosen by marker (``-m tf_latest``, ``-m "not mpi"``), so a marker must be declared in
setup.cfg and a misspelt one must stop the run: setup.cfg's ``--strict-markers`` makes an undeclared
marker a collection error instead of a warning and a test that silently leaves its suite."""
from __future__ import annotations

import configparser
import re
import subprocess
import sys

from helpers import ROOT

MARK = re.compile(r"pytest\.mark\.(\w+)")
BUILTIN = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}


def declared_markers() -> set[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = parser["tool:pytest"]["markers"].splitlines()
    return {line.split(":")[0].strip() for line in lines if line and not line[0].isspace() and ":" in line}


def test_every_marker_used_in_tests_is_declared():
    used = {name for path in (ROOT / "tests").rglob("*.py") for name in MARK.findall(path.read_text())}
    assert used - BUILTIN, "no marker found: the pattern is wrong"
    assert sorted(used - BUILTIN - declared_markers()) == []


def test_an_undeclared_marker_fails_the_collection(tmp_path):
    misspelt = "tf_" + "lastest"  # not spelt out here, or the test above would find it in this file
    (tmp_path / "test_misspelt.py").write_text(
        f"import pytest\n\n\n@pytest.mark.{misspelt}\ndef test_x():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "setup.cfg"), "--rootdir",
                           str(tmp_path), "-p", "no:cacheprovider", "-p", "no:xdist", "--collect-only", "-q",
                           str(tmp_path / "test_misspelt.py")], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"'{misspelt}' not found in `markers` configuration option" in done.stdout + done.stderr
