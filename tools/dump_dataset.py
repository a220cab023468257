#!/usr/bin/env python3
"""``dump-dataset``: see engine/tools/dump_dataset.py."""
import sys

from engine.tools.dump_dataset import main

if __name__ == "__main__":
    sys.exit(main())
