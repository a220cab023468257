#!/usr/bin/env python3
"""``gen-returnn-keys``: see engine/tools/gen_returnn_keys.py."""
import sys

from engine.tools.gen_returnn_keys import main

if __name__ == "__main__":
    sys.exit(main())
