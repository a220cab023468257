#!/usr/bin/env bash
# Check a cluster for data-parallel training: every rank prints its process, versions and scheduler
# environment, then the collectives of each backend (mpi, and horovod when it imports) are checked.
# Ends with one verdict line; exits non-zero when a check fails.
#
#   demos/demo-horovod-mpi.sh [NUM_RANKS]        (default 2; extra mpirun flags in $MPIRUN_ARGS,
#                                                 the interpreter in $PYTHON)
#
# SGE (Open MPI reads the granted hosts from $PE_HOSTFILE; the parallel environment may be named
# differently at your site, see `qconf -spl`):
#   qsub -pe mpi 4 -cwd -j y -b y -V demos/demo-horovod-mpi.sh 4
# SLURM (mpirun reads the allocation; or let srun start the ranks, with its PMIx plugin):
#   sbatch --ntasks=4 --wrap "demos/demo-horovod-mpi.sh 4"
#   srun --mpi=pmix -n 4 python demos/demo-horovod-mpi.py --expect-size 4
set -euo pipefail

num_ranks=${1:-2}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

# One TensorFlow thread per rank: several ranks share a machine's cores.
set -x
mpirun -np "$num_ranks" --bind-to none --map-by slot ${MPIRUN_ARGS:-} \
  -x TF_NUM_INTRAOP_THREADS=1 -x TF_NUM_INTEROP_THREADS=1 -x TF_CPP_MIN_LOG_LEVEL=2 \
  "$python" "$here/demo-horovod-mpi.py" --expect-size "$num_ranks"
