#!/usr/bin/env python3
"""``audio-to-hdf``: see engine/tools/audio_to_hdf.py."""
import sys

from engine.tools.audio_to_hdf import main

if __name__ == "__main__":
    sys.exit(main())
