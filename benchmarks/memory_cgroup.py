"""A corpus larger than the memory a job may use, made literal: the job runs in a memory cgroup whose limit
(processes and page cache together) is below the corpus's size, and the page cache is dropped first, so
every sequence is read from disk at least once and none stays cached for long. Needs root and the cgroup
memory controller (v1 or v2); ``MemoryLimit`` says by name what is missing otherwise.

    with MemoryLimit(2560) as limit:
        subprocess.run(cmd, preexec_fn=limit.enter)
    limit.report()  # peak use, times the limit was hit
"""
from __future__ import annotations

import os
import time

V1_ROOT, V2_ROOT = "/sys/fs/cgroup/memory", "/sys/fs/cgroup"


class MemoryLimit:
    """A fresh memory cgroup of ``megabytes``; ``enter`` (a ``preexec_fn``) moves the child into it."""

    def __init__(self, megabytes: int) -> None:
        self.limit = megabytes * 2**20
        v2 = os.path.exists(os.path.join(V2_ROOT, "cgroup.controllers")) and "memory" in open(
            os.path.join(V2_ROOT, "cgroup.controllers")).read().split()
        self.v2 = v2
        root = V2_ROOT if v2 else V1_ROOT
        if os.geteuid() != 0 or not os.access(root, os.W_OK):
            raise SystemExit(f"--larger-than-memory needs root and a writable memory cgroup at {root} "
                             f"(euid {os.geteuid()}).")
        self.path = os.path.join(root, f"bench-memory-{os.getpid()}")

    def __enter__(self) -> "MemoryLimit":
        os.mkdir(self.path)
        self._write("memory.max" if self.v2 else "memory.limit_in_bytes", str(self.limit))
        return self

    def __exit__(self, *exc) -> None:
        for _ in range(50):  # the last processes of the job may still be leaving
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)

    def enter(self) -> None:
        self._write("cgroup.procs", str(os.getpid()))

    def usage(self) -> dict[str, int]:
        """Peak bytes (v1: ``max_usage_in_bytes``; v2: ``memory.peak`` where the kernel has it) and the
        number of times the limit made the kernel reclaim (v1 ``failcnt``, v2 ``events`` max)."""
        if self.v2:
            events = dict(line.split() for line in open(os.path.join(self.path, "memory.events")))
            peak_file = os.path.join(self.path, "memory.peak")
            peak = int(open(peak_file).read()) if os.path.exists(peak_file) else -1
            return {"peak": peak, "limit_hits": int(events.get("max", 0))}
        return {"peak": int(open(os.path.join(self.path, "memory.max_usage_in_bytes")).read()),
                "limit_hits": int(open(os.path.join(self.path, "memory.failcnt")).read())}

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)


def drop_page_cache() -> None:
    """Written files stay cached (and charged to whoever wrote them): without this the job would read the
    corpus from memory."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")
