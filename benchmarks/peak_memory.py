#!/usr/bin/env python3
"""``python benchmarks/peak_memory.py CONFIG [++key value ...]``: ``rnn.py`` in this process, then one line

    peak memory rank R: P MiB peak, A MiB anonymous, F MiB file-backed at the end

P is the process's peak resident memory (the kernel's high-water mark ``VmHWM``). At the end, A is the
memory the rank holds privately (heap, tensors, buffers: ``RssAnon``) and F the pages of files it maps
(mostly library code, which ranks on one host share physically: ``RssFile``). Where the rank computed
on a GPU, one more line: ``peak GPU memory rank R: G MiB`` (TensorFlow's allocator's high-water mark).
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
    tf = sys.modules.get("tensorflow")
    if tf is not None and tf.config.list_logical_devices("GPU"):
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
        print(f"peak GPU memory rank {rank}: {peak:.1f} MiB", flush=True)
    sys.exit(code)
