"""What a test needs from the machine (root, network namespaces, `tc`, SLURM, Grid Engine, espeak-ng,
Horovod). Outside CI a test whose prerequisite is missing skips with a one-line reason; in CI (``CI=true``,
which CI sets) it fails with that reason, so a green CI means that every test ran."""
from __future__ import annotations

import importlib
import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(prerequisite: str, reason: str) -> NoReturn:
    """End the test because ``prerequisite`` cannot be had here: a failure in CI, a skip elsewhere."""
    message = f"needs {prerequisite}: {reason}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a test that cannot run fails instead of skipping)", pytrace=False)
    pytest.skip(message)


def require(prerequisite: str, reason: str | None) -> None:
    """``missing(prerequisite, reason)`` when ``reason`` (why it is unavailable) is set."""
    if reason:
        missing(prerequisite, reason)


def require_module(name: str, prerequisite: str):
    """The imported module ``name``, or ``missing(prerequisite, ...)`` when it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        missing(prerequisite, f"import {name} failed ({error})")
