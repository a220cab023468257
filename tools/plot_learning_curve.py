#!/usr/bin/env python3
"""Learning curves from learning-rate files; see engine/tools/plot_learning_curve.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.tools.plot_learning_curve import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
