# What tools/qsub_train.sh and tools/sbatch_train.sh share: checking their arguments, and what runs
# inside the allocation (the user's prologue, the interpreter, the mpirun line). Sourced, not run.
#
# Settings read here (environment, all optional):
#   ENGINE_PROLOGUE  a bash file sourced in the job before anything else (module load, venv activate,
#                    exports); this is where the job gets its environment on the first host
#   PYTHON           the interpreter with TensorFlow, mpi4py (and Horovod)
#                    [$ENGINE_ROOT/.venv/bin/python if it exists, else python3 on PATH]
#   MPIRUN           [the mpirun next to $PYTHON if there is one (the MPI that mpi4py was built for),
#                    else mpirun on PATH]
#   MPIRUN_ARGS      extra mpirun options, e.g. "--mca btl_tcp_if_include 10.1.0.0/16"
#   RANK_ENV         more variable names to pass to every rank with mpirun -x (when set)

# Passed to the ranks when set: mpirun starts remote ranks with a bare environment.
DEFAULT_RANK_ENV="PATH LD_LIBRARY_PATH PYTHONPATH TF_NUM_INTRAOP_THREADS TF_NUM_INTEROP_THREADS \
OMP_NUM_THREADS TF_CPP_MIN_LOG_LEVEL NCCL_SOCKET_IFNAME NCCL_DEBUG HOROVOD_STALL_CHECK_TIME_SECONDS"

die() {
  echo "$(basename "$0"): error: $*" >&2
  exit 2
}

# check_train_args CONFIG NUM_RANKS
check_train_args() {
  [ -n "${1:-}" ] && [ -n "${2:-}" ] || die "expected CONFIG NUM_RANKS [rnn.py args ...] (see $0)"
  [ -f "$1" ] || die "config file '$1' not found (relative paths are taken from $(pwd))"
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "NUM_RANKS is '$2'; expected a positive integer"
}

# prepare_submission CONFIG NUM_RANKS ...: checks them; sets config, num_ranks, log_dir (created), name.
prepare_submission() {
  check_train_args "$@"
  config=$1 num_ranks=$2
  log_dir=${LOG_DIR:-log}
  mkdir -p "$log_dir"
  name=${JOB_NAME:-train-$(basename "$config" .py)}
}

# Sets PYTHON and MPIRUN, after sourcing ENGINE_PROLOGUE.
job_setup() {
  if [ -n "${ENGINE_PROLOGUE:-}" ]; then
    [ -f "$ENGINE_PROLOGUE" ] || die "ENGINE_PROLOGUE='$ENGINE_PROLOGUE' is not a file"
    # shellcheck disable=SC1090
    source "$ENGINE_PROLOGUE"
  fi
  if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ENGINE_ROOT/.venv/bin/python" ]; then
      PYTHON=$ENGINE_ROOT/.venv/bin/python
    else
      PYTHON=$(command -v python3) || die "no python3 on PATH; set PYTHON or activate it in ENGINE_PROLOGUE"
    fi
  fi
  if [ -z "${MPIRUN:-}" ]; then
    if [ -x "$(dirname "$PYTHON")/mpirun" ]; then
      MPIRUN=$(dirname "$PYTHON")/mpirun
    else
      MPIRUN=$(command -v mpirun) || die "no mpirun next to $PYTHON nor on PATH; set MPIRUN"
    fi
  fi
}

# job_mpirun HOSTFILE NUM_RANKS CONFIG [rnn.py args ...]: run the training; returns mpirun's status.
job_mpirun() {
  local hostfile=$1 num_ranks=$2 config=$3 name
  shift 3
  local cmd=("$MPIRUN" --hostfile "$hostfile" -np "$num_ranks" --bind-to none --map-by slot)
  for name in $DEFAULT_RANK_ENV ${RANK_ENV:-}; do
    if printenv "$name" >/dev/null; then cmd+=(-x "$name"); fi  # exported ones: mpirun's environment
  done
  # shellcheck disable=SC2206  # MPIRUN_ARGS is a list of options, split on purpose
  cmd+=(${MPIRUN_ARGS:-} "$PYTHON" "$ENGINE_ROOT/rnn.py" "$config" ++use_horovod 1 "$@")
  echo "+ ${cmd[*]}" >&2
  "${cmd[@]}"
}
