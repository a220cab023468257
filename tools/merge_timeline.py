#!/usr/bin/env python3
"""Merge a step timeline's per-rank part files; see engine/tools/merge_timeline.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.tools.merge_timeline import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
