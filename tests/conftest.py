import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tests import `helpers` and each other's scripts
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
