#!/usr/bin/env python3
"""``python benchmarks/peak_memory.py CONFIG [++key value ...]``: ``rnn.py`` in this process, then one line
``peak memory rank R: N MiB`` with the process's peak resident memory (the kernel's high-water mark, which
counts every thread and every library MPI and TensorFlow loaded)."""
import os
import resource
import sys

from engine.main import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0"))
    print(f"peak memory rank {rank}: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB",
          flush=True)
    sys.exit(code)
