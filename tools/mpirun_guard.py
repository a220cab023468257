#!/usr/bin/env python3
"""``mpirun-guard``: see engine/tools/mpirun_guard.py."""
import sys

from engine.tools.mpirun_guard import main

if __name__ == "__main__":
    sys.exit(main())
