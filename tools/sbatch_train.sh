#!/usr/bin/env bash
# Data-parallel training on SLURM: one sbatch job with one task per rank, ranks started by mpirun on
# the allocated nodes (or by srun).
#
#   tools/sbatch_train.sh CONFIG NUM_RANKS [rnn.py args ...]         submit (from the login node)
#   tools/sbatch_train.sh --run CONFIG NUM_RANKS [rnn.py args ...]   the job itself (what sbatch runs;
#                                                                    also usable inside salloc)
#
#   e.g. NODES=2 GPUS_PER_TASK=1 SBATCH_ARGS="--time=48:00:00 -p gpu" tools/sbatch_train.sh configs/12ax.py 8
#
# The job gets the environment you submit from (sbatch's default) and runs in the current directory.
# Settings (environment, all optional):
#   NODES            sbatch --nodes                TASKS_PER_NODE  sbatch --ntasks-per-node
#   GPUS_PER_TASK    sbatch --gpus-per-task        CPUS_PER_TASK   sbatch --cpus-per-task
#   SBATCH_ARGS      more sbatch options: time limit, partition, account, memory
#   LAUNCHER         mpirun (default: hostfile from $SLURM_JOB_NODELIST and $SLURM_TASKS_PER_NODE) or
#                    srun (SLURM starts the ranks; needs Open MPI's PMIx support at your site)
#   SRUN_ARGS        srun options with LAUNCHER=srun [--mpi=pmix]
#   JOB_NAME         [train-<config file name>]
#   LOG_DIR          where SLURM writes the job's output, <JOB_NAME>.<JOB_ID>.out (appended to when the
#                    job is requeued) [log]
#   SIGNAL_SECONDS   ask SLURM for SIGUSR1 this many seconds before the time limit (--signal=B:USR1@N);
#                    the ranks then save a checkpoint and stop; 0: no warning [300]
#   REQUEUE          1: submit with --requeue, and requeue the job (scontrol requeue) when the training
#                    stopped on request after saving a checkpoint (exit status 99), so that it resumes;
#                    0: the job just ends with 99 [1]
#   and ENGINE_PROLOGUE, PYTHON, MPIRUN, MPIRUN_ARGS, RANK_ENV, MAX_RESTARTS, RESTART_BACKOFF, see
#   tools/job_common.sh.
# SIGUSR1/SIGUSR2/SIGTERM that the job's shell receives are passed on to mpirun or srun.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
export ENGINE_ROOT=${ENGINE_ROOT:-$(dirname "$here")}  # the job runs a copy of this script: pass the root
if [ ! -f "$ENGINE_ROOT/tools/job_common.sh" ]; then
  echo "$0: error: cannot find the engine at ENGINE_ROOT=$ENGINE_ROOT; submit with tools/sbatch_train.sh" \
    "CONFIG NUM_RANKS (it passes the root to the job), or set ENGINE_ROOT" >&2
  exit 2
fi
# shellcheck source=tools/job_common.sh
source "$ENGINE_ROOT/tools/job_common.sh"

if [ "${1:-}" != "--run" ]; then
  prepare_submission "$@"  # sets config, num_ranks, log_dir, name
  shift 2
  [[ "${SIGNAL_SECONDS:-300}" =~ ^[0-9]+$ ]] || die "SIGNAL_SECONDS is '$SIGNAL_SECONDS'; expected seconds"
  [[ "${REQUEUE:-1}" =~ ^[01]$ ]] || die "REQUEUE is '$REQUEUE'; expected 1 or 0"
  opts=(--job-name="$name" --ntasks="$num_ranks" --output="$log_dir/%x.%j.out" --open-mode=append)
  # B: signals the job's shell only, which passes it on (SLURM would not reach ranks started by mpirun)
  [ "${SIGNAL_SECONDS:-300}" = 0 ] || opts+=(--signal="B:USR1@${SIGNAL_SECONDS:-300}")
  [ "${REQUEUE:-1}" = 0 ] || opts+=(--requeue)
  [ -z "${NODES:-}" ] || opts+=(--nodes="$NODES")
  [ -z "${TASKS_PER_NODE:-}" ] || opts+=(--ntasks-per-node="$TASKS_PER_NODE")
  [ -z "${GPUS_PER_TASK:-}" ] || opts+=(--gpus-per-task="$GPUS_PER_TASK")
  [ -z "${CPUS_PER_TASK:-}" ] || opts+=(--cpus-per-task="$CPUS_PER_TASK")
  # shellcheck disable=SC2086  # SBATCH_ARGS is a list of options
  exec sbatch "${opts[@]}" ${SBATCH_ARGS:-} "$here/sbatch_train.sh" --run "$config" "$num_ranks" "$@"
fi

shift
check_train_args "$@"
config=$1 num_ranks=$2
shift 2
[ -n "${SLURM_JOB_NODELIST:-}" ] || die "\$SLURM_JOB_NODELIST is not set: --run is the job body that" \
  "runs inside a SLURM allocation; submit with: tools/sbatch_train.sh CONFIG NUM_RANKS"
job_setup
# SLURM_RESTART_COUNT: how often SLURM requeued the job (after a stop on request it resumes)
echo "job ${SLURM_JOB_ID:-?} on $(hostname): $num_ranks ranks on $SLURM_JOB_NODELIST" \
  "(restart ${SLURM_RESTART_COUNT:-0})" >&2
status=0
case ${LAUNCHER:-mpirun} in
  srun)
    # srun gives every task the whole environment and sets the rank variables the engine reads.
    # shellcheck disable=SC2086  # SRUN_ARGS is a list of options
    run_job srun ${SRUN_ARGS:---mpi=pmix} --ntasks="$num_ranks" "$PYTHON" "$ENGINE_ROOT/rnn.py" "$config" \
      ++use_horovod 1 "$@" || status=$?
    ;;
  mpirun)
    make_hostfile_dir  # sets hostfile_dir
    hostfile=$hostfile_dir/hostfile
    "$PYTHON" "$ENGINE_ROOT/tools/make_hostfile.py" --slurm "$SLURM_JOB_NODELIST" \
      --tasks-per-node "${SLURM_TASKS_PER_NODE:-}" --ranks "$num_ranks" -o "$hostfile"
    job_mpirun "$hostfile" "$num_ranks" "$config" "$@" || status=$?
    ;;
  *) die "LAUNCHER is '$LAUNCHER'; expected mpirun or srun" ;;
esac
if [ "$status" = 99 ] && [ "${REQUEUE:-1}" = 1 ]; then
  echo "job ${SLURM_JOB_ID:-?}: the training stopped on request after saving a checkpoint; requeueing the" \
    "job, it resumes when it runs again" >&2
  scontrol requeue "$SLURM_JOB_ID" || echo "job ${SLURM_JOB_ID:-?}: scontrol requeue failed; submit the" \
    "same command again to resume" >&2
fi
exit "$status"
