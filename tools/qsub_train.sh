#!/usr/bin/env bash
#$ -S /bin/bash
#$ -cwd
#$ -j y
# Data-parallel training on SGE (Grid Engine): one job in the parallel environment `mpi` with one slot
# per rank, ranks started by mpirun on the hosts SGE grants.
#
#   tools/qsub_train.sh CONFIG NUM_RANKS [rnn.py args ...]         submit (from the login node)
#   tools/qsub_train.sh --run CONFIG NUM_RANKS [rnn.py args ...]   the job itself (what qsub runs)
#
#   e.g. QSUB_ARGS="-l h_rt=48:00:00 -l gpu=1" tools/qsub_train.sh configs/12ax.py 4 ++num_epochs 20
#
# The job gets the environment you submit from (qsub -V) and runs in the current directory (-cwd).
# Settings (environment, all optional):
#   SGE_PE           the parallel environment [mpi] (`qconf -spl` lists your site's)
#   QSUB_ARGS        more qsub options: run time, memory, GPUs (`-l gpu=1` is per slot at most sites)
#   JOB_NAME         [train-<config file name>]
#   LOG_DIR          where SGE writes the job's output, <JOB_NAME>.o<JOB_ID> [log]
#   SGE_NOTIFY       1: submit with -notify, so that SGE warns the job with SIGUSR1 before suspending it
#                    and SIGUSR2 before killing it (how long before: the queue's `notify` time, see
#                    `qconf -sq QUEUE`); the ranks then save a checkpoint and stop; 0: no warning [1]
#   and ENGINE_PROLOGUE, PYTHON, MPIRUN, MPIRUN_ARGS, RANK_ENV, MAX_RESTARTS, RESTART_BACKOFF, see
#   tools/job_common.sh.
# Inside the job, $PE_HOSTFILE becomes an Open MPI hostfile (tools/make_hostfile.py) in a private
# directory, and runs
#   mpirun --hostfile FILE -np NUM_RANKS --bind-to none --map-by slot -x ... \
#     python rnn.py CONFIG ++use_horovod 1 ...
# passing SIGUSR1/SIGUSR2/SIGTERM on to mpirun. When the training stops on such a signal after saving a
# checkpoint (exit status 99), the job exits 99 too: SGE reschedules it, and it resumes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
export ENGINE_ROOT=${ENGINE_ROOT:-$(dirname "$here")}  # the job runs a copy of this script: pass the root
if [ ! -f "$ENGINE_ROOT/tools/job_common.sh" ]; then
  echo "$0: error: cannot find the engine at ENGINE_ROOT=$ENGINE_ROOT; submit with tools/qsub_train.sh" \
    "CONFIG NUM_RANKS (it passes the root to the job), or set ENGINE_ROOT" >&2
  exit 2
fi
# shellcheck source=tools/job_common.sh
source "$ENGINE_ROOT/tools/job_common.sh"

if [ "${1:-}" != "--run" ]; then
  prepare_submission "$@"  # sets config, num_ranks, log_dir, name
  shift 2
  case ${SGE_NOTIFY:-1} in
    1) notify=(-notify) ;;
    0) notify=() ;;
    *) die "SGE_NOTIFY is '$SGE_NOTIFY'; expected 1 or 0" ;;
  esac
  # shellcheck disable=SC2086  # QSUB_ARGS is a list of options
  exec qsub -N "$name" -pe "${SGE_PE:-mpi}" "$num_ranks" -S /bin/bash -cwd -j y -o "$log_dir" -V \
    "${notify[@]}" ${QSUB_ARGS:-} "$here/qsub_train.sh" --run "$config" "$num_ranks" "$@"
fi

shift
check_train_args "$@"
config=$1 num_ranks=$2
shift 2
[ -n "${PE_HOSTFILE:-}" ] || die "\$PE_HOSTFILE is not set: --run is the job body that SGE runs in a" \
  "parallel environment; submit with: tools/qsub_train.sh CONFIG NUM_RANKS"
job_setup
make_hostfile_dir  # sets hostfile_dir
hostfile=$hostfile_dir/hostfile
"$PYTHON" "$ENGINE_ROOT/tools/make_hostfile.py" --sge "$PE_HOSTFILE" --ranks "$num_ranks" -o "$hostfile"
# RESTARTED: 1 when SGE runs the job again (rescheduled after exit status 99); it then resumes
echo "job ${JOB_ID:-?} on $(hostname): $num_ranks ranks on $(cut -d' ' -f1 "$hostfile" | paste -sd' ')" \
  "(restarted ${RESTARTED:-0})" >&2
status=0
job_mpirun "$hostfile" "$num_ranks" "$config" "$@" || status=$?
if [ "$status" = 99 ]; then
  echo "job ${JOB_ID:-?}: the training stopped on request after saving a checkpoint; exit status 99 makes" \
    "SGE reschedule the job, and it resumes" >&2
fi
exit "$status"
