#!/usr/bin/env python3
"""``hdf-dump``: see engine/tools/hdf_dump.py."""
import sys

from engine.tools.hdf_dump import main

if __name__ == "__main__":
    sys.exit(main())
