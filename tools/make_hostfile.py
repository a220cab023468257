#!/usr/bin/env python3
"""``make-hostfile``: see engine/tools/make_hostfile.py."""
import sys

from engine.tools.make_hostfile import main

if __name__ == "__main__":
    sys.exit(main())
