#!/usr/bin/env python3
"""Train, evaluate or forward a model: ``python rnn.py CONFIG [CONFIG ...] [++key value ...]``.

Data-parallel: ``mpirun -np N python rnn.py CONFIG ++use_horovod 1``. The program is engine/main.py
(also installed as the console command ``rnn-engine``).
"""
import sys

from engine.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
