#!/usr/bin/env python3
"""Sum a TensorFlow profile by op type; see engine/tools/profile_ops.py."""
import sys

from engine.tools.profile_ops import main

if __name__ == "__main__":
    sys.exit(main())
