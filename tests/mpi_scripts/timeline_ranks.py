"""Run under ``mpirun -np N``: every rank records a span of each timeline category (with sizes), stops,
the ranks meet, and rank 0 merges the part files into the run's one trace.

    python timeline_ranks.py TIMELINE_FILE
"""
from __future__ import annotations

import sys
import time

from mpi4py import MPI

from engine.report import timeline


def main() -> None:
    path = sys.argv[1]
    comm = MPI.COMM_WORLD
    timeline.start(path, comm.rank, comm.size)
    for step in range(3):
        with timeline.span("wait for batch", timeline.DATA_WAIT, step=step):
            time.sleep(0.001)
        with timeline.span("step", timeline.STEP, step=step):
            t0 = timeline.now()
            grads = comm.allreduce(comm.rank + step)
            timeline.record("gradient allreduce", timeline.ALLREDUCE, t0, timeline.now(), bytes=8,
                            result=grads)
        with timeline.span("step signal", timeline.STEP_SIGNAL, bytes=4):
            comm.allreduce(1)
    with timeline.span("parameter average", timeline.PARAM_AVERAGE, bytes=1024):
        comm.Barrier()
    with timeline.span("save checkpoint", timeline.CHECKPOINT, path="model.001"):
        time.sleep(0.001)
    with timeline.span("eval dev", timeline.EVAL, seqs=10):
        time.sleep(0.001)
    timeline.stop()
    comm.Barrier()
    if comm.rank == 0:
        result = timeline.merge(path, comm.size)
        print(f"merged ranks {result.ranks}, {result.events} spans, missing {result.missing_ranks}",
              flush=True)


if __name__ == "__main__":
    main()
