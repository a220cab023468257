"""Where the dev scripts find RETURNN, and how they run their own code under RETURNN's Python.

RETURNN is not part of this project: it lives in a Python of its own, ``$RETURNN_PYTHON`` or else
``/tmp/returnn-venv/bin/python`` (``pip install returnn tensorflow-cpu==2.15.1 dm-tree h5py``). A script
runs its RETURNN half as ``<script> --returnn-side JOBS.json`` under that Python. Only the standard
library is imported here, since that Python has neither this engine nor its benchmarks' dependencies.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

DEFAULT_RETURNN_PYTHON = "/tmp/returnn-venv/bin/python"


def returnn_python() -> str | None:
    path = os.environ.get("RETURNN_PYTHON") or DEFAULT_RETURNN_PYTHON
    return path if os.access(path, os.X_OK) else None


def no_returnn(script: str, what: str) -> int:
    """Say on stderr that there is no RETURNN and how to make one; the exit status (2) for ``main``."""
    where = (f"RETURNN_PYTHON={os.environ['RETURNN_PYTHON']} is" if os.environ.get("RETURNN_PYTHON")
             else f"RETURNN_PYTHON is unset and {DEFAULT_RETURNN_PYTHON} is")
    print(f"{script}: no RETURNN found ({where} no executable), so {what}. This dev script needs a Python "
          "with returnn and tensorflow-cpu 2.15: python3 -m venv /tmp/returnn-venv && "
          "/tmp/returnn-venv/bin/pip install tensorflow-cpu==2.15.1 returnn dm-tree h5py", file=sys.stderr)
    return 2


def returnn_versions(python: str) -> dict:
    """The RETURNN and TensorFlow versions of RETURNN's ``python``, for the fixtures' records."""
    code = "import json, returnn, tensorflow as tf; print(json.dumps([returnn.__version__, tf.__version__]))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    returnn_version, tf_version = json.loads(done.stdout.strip().splitlines()[-1])
    return {"returnn": returnn_version, "tensorflow": tf_version}


def run_returnn_side(python: str, script: str, jobs_path: str) -> None:
    """``script --returnn-side jobs_path`` under RETURNN's ``python``; exits naming the script on failure.
    ``DISABLE_CUDA``: without it, a CUDA toolkit on a machine without GPU makes RETURNN compile its native
    ops with CUDA headers that tensorflow-cpu lacks."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(DISABLE_CUDA="1", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([python, os.path.abspath(script), "--returnn-side", jobs_path], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        name = os.path.splitext(os.path.basename(script))[0]
        sys.exit(f"{name}: RETURNN failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
