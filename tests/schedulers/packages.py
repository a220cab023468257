"""Debian packages for the scheduler tests: installed with apt-get when a daemon is missing and this
process may (root, apt-get present); otherwise the caller skips with the reason this returns."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Callable


def ensure(commands: list[str], packages: list[str], env: dict | None = None) -> str | None:
    """Make ``commands`` available by installing ``packages``; None when they are there, else why not."""
    if all(shutil.which(c) or os.path.exists(c) for c in commands):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"{', '.join(packages)} not installed and cannot be (needs root and apt-get)"
    apt_env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", **(env or {}))
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=apt_env, timeout=900)
        if r.returncode != 0:
            last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["no output"]
            return f"`{' '.join(cmd)}` failed: {last[0]}"
    missing = [c for c in commands if not (shutil.which(c) or os.path.exists(c))]
    return f"installed {', '.join(packages)} but {', '.join(missing)} still missing" if missing else None


def wait_until(ready: Callable[[], bool], timeout: float) -> bool:
    """Poll ``ready`` every half second; whether it became true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(0.5)
    return False
