#!/usr/bin/env python3
"""``python benchmarks/peak_memory.py CONFIG [++key value ...]``: ``rnn.py`` in this process, then one line

    peak memory rank R: P MiB peak, A MiB anonymous, F MiB file-backed at the end

P is the process's peak resident memory (the kernel's high-water mark ``VmHWM``). At the end, A is the
memory the rank holds privately (heap, tensors, buffers: ``RssAnon``) and F the pages of files it maps
(mostly library code, which ranks on one host share physically: ``RssFile``).
"""
import os
import sys

from engine.main import main


def status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    code = main(sys.argv[1:])
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0"))
    print(f"peak memory rank {rank}: {status_mib('VmHWM'):.1f} MiB peak, {status_mib('RssAnon'):.1f} MiB "
          f"anonymous, {status_mib('RssFile'):.1f} MiB file-backed at the end", flush=True)
    sys.exit(code)
