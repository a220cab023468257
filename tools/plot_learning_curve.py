#!/usr/bin/env python3
"""Learning curves from learning-rate files; see engine/tools/plot_learning_curve.py."""
import sys

from engine.tools.plot_learning_curve import main

if __name__ == "__main__":
    sys.exit(main())
