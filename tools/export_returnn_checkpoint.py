#!/usr/bin/env python3
"""``export-returnn-checkpoint``: see engine/tools/export_returnn_checkpoint.py."""
import sys

from engine.tools.export_returnn_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
