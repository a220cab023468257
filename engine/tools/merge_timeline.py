"""Merge the per-rank part files of a step timeline into the run's one trace, by hand.

    merge-timeline TIMELINE_FILE [--ranks N] [--keep-parts]

A run merges its parts itself at its end; after a crash the parts ``<stem>.rank<R><ext>`` stay (each
loads alone in Perfetto). This merges them: all parts found, or those of ranks 0..N-1 with ``--ranks``.
"""
from __future__ import annotations

import argparse
import sys

from engine.report import timeline
from engine.runtime.errors import EngineError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="merge-timeline", description=__doc__.splitlines()[0])
    parser.add_argument("path", metavar="TIMELINE_FILE", help="the run's timeline file (timeline_file)")
    parser.add_argument("--ranks", type=int, help="merge ranks 0..N-1 (default: every part found)")
    parser.add_argument("--keep-parts", action="store_true", help="keep the part files")
    args = parser.parse_args(argv)
    try:
        result = timeline.merge(args.path, args.ranks, keep_parts=args.keep_parts)
    except EngineError as exc:
        print(f"merge-timeline: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"merge-timeline: cannot write '{args.path}': {exc.strerror}.", file=sys.stderr)
        return 1
    notes = [f"missing ranks {', '.join(map(str, result.missing_ranks))}"] if result.missing_ranks else []
    if result.torn_lines:
        notes.append(f"{result.torn_lines} torn line(s) skipped")
    print(f"merge-timeline: wrote {result.path}: {result.events} spans from ranks "
          f"{', '.join(map(str, result.ranks))}" + "".join(f"; {note}" for note in notes))
    return 0
