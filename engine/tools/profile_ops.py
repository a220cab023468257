"""Sum a TensorFlow profile by op type; with two profiles, side by side.

    profile-ops PROFILE [OTHER] [--top N] [--names | --layers]

PROFILE: a directory searched for ``*.xplane.pb`` (what ``store_tf_profile`` writes, in this engine or
in RETURNN; every file found is summed) or one such file. Per op type: the time TensorFlow's executor
spent in its kernels (summed over threads, so on 2 cores up to twice the wall time) and its share; the
span from the first kernel to the last is the wall time. With OTHER, both columns and their ratio, for
comparing two programs on one network. ``--names``: per op name instead of type; ``--layers``: per
layer, forward and backward together (this engine names each op after the layer that made it, RETURNN
after its layer too; ops outside a layer, such as the losses, go by their own name).
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
from dataclasses import dataclass


@dataclass
class OpTimes:
    """Milliseconds per op type (or name) and the wall span of a profile."""

    by_key: collections.Counter
    span_ms: float
    files: int

    @property
    def total_ms(self) -> float:
        return sum(self.by_key.values())


def profile_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    files = sorted(glob.glob(os.path.join(path, "**", "*.xplane.pb"), recursive=True))
    if not files:
        raise FileNotFoundError(f"no *.xplane.pb under '{path}' (store_tf_profile writes them)")
    return files


def _layer(op_name: str) -> str:
    parts = op_name.split(":")[0].split("/")
    while len(parts) > 1 and parts[0] in ("gradient_tape", "optimize", "gradients"):
        parts = parts[1:]
    return parts[0]


def op_times(path: str, by: str = "type") -> OpTimes:
    """The kernels' times of every profile file under ``path`` by op ``type``, ``name`` or ``layer``:
    TensorFlow's op events carry the op's type as their display name (events without one are the
    executor's own)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # TensorFlow 2.15 and the newest alike

    times: collections.Counter = collections.Counter()
    span_ms = 0.0
    files = profile_files(path)
    for file in files:
        space = xplane_pb2.XSpace()
        with open(file, "rb") as f:
            space.ParseFromString(f.read())
        first, last = None, 0
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    meta = plane.event_metadata[event.metadata_id]
                    if not meta.display_name:
                        continue
                    key = {"type": meta.display_name, "name": meta.name.split(":")[0],
                           "layer": _layer(meta.name)}[by]
                    times[key] += event.duration_ps / 1e9
                    start = line.timestamp_ns * 1000 + event.offset_ps
                    first = start if first is None else min(first, start)
                    last = max(last, start + event.duration_ps)
        span_ms += (last - first) / 1e9 if first is not None else 0.0
    return OpTimes(times, span_ms, len(files))


def table(profiles: list[OpTimes], names: list[str], top: int) -> str:
    keys = sorted(set().union(*(p.by_key for p in profiles)), key=lambda k: -profiles[0].by_key.get(k, 0.0))
    head = "".join(f"{name[:14]:>16} {'%':>5}" for name in names)
    lines = [f"{'op':<44}{head}" + (f" {'ratio':>7}" if len(profiles) == 2 else "")]
    for key in keys[:top]:
        row = "".join(f"{p.by_key.get(key, 0.0):16.0f} {100 * p.by_key.get(key, 0.0) / p.total_ms:5.1f}"
                      for p in profiles)
        if len(profiles) == 2:
            theirs = profiles[1].by_key.get(key, 0.0)
            row += f" {profiles[0].by_key.get(key, 0.0) / theirs:7.2f}" if theirs else f" {'-':>7}"
        lines.append(f"{key[:43]:<44}{row}")
    for label, value in (("all ops (ms)", lambda p: p.total_ms), ("wall span (ms)", lambda p: p.span_ms)):
        row = "".join(f"{value(p):16.0f} {'':>5}" for p in profiles)
        if len(profiles) == 2:
            row += f" {value(profiles[0]) / max(value(profiles[1]), 1e-9):7.2f}"
        lines.append(f"{label:<44}{row}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="profile-ops", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="PROFILE", help="one or two profiles (dir or file)")
    parser.add_argument("--top", type=int, default=30, help="rows shown (default 30)")
    grouping = parser.add_mutually_exclusive_group()
    grouping.add_argument("--names", action="store_true", help="per op name instead of op type")
    grouping.add_argument("--layers", action="store_true", help="per layer (forward and backward)")
    args = parser.parse_args(argv)
    if len(args.paths) > 2:
        parser.error("give one profile, or two to compare")
    try:
        by = "name" if args.names else "layer" if args.layers else "type"
        profiles = [op_times(path, by) for path in args.paths]
    except (FileNotFoundError, OSError) as exc:
        print(f"profile-ops: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a protobuf DecodeError: not a profile
        print(f"profile-ops: cannot read a TensorFlow profile from {args.paths}: {exc}", file=sys.stderr)
        return 1
    for path, profile in zip(args.paths, profiles):
        print(f"{path}: {profile.files} profile file(s)")
    print(table(profiles, [os.path.basename(os.path.normpath(p)) or p for p in args.paths], args.top))
    return 0
