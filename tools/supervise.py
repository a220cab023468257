#!/usr/bin/env python3
"""``supervise``: see engine/tools/supervise.py."""
import sys

from engine.tools.supervise import main

if __name__ == "__main__":
    sys.exit(main())
