#!/usr/bin/env python3
"""Merge a step timeline's per-rank part files; see engine/tools/merge_timeline.py."""
import sys

from engine.tools.merge_timeline import main

if __name__ == "__main__":
    sys.exit(main())
