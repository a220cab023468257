#!/usr/bin/env python3
"""Rerun a command after an abnormal end: see engine/tools/supervise.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from engine.tools.supervise import main  # noqa: E402

sys.exit(main())
