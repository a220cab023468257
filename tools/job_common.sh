# What tools/qsub_train.sh and tools/sbatch_train.sh share: checking their arguments, and what runs
# inside the allocation (the user's prologue, the interpreter, the mpirun line, passing the scheduler's
# stop signals on, the private hostfile directory). Sourced, not run.
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
#   MAX_RESTARTS     run the job under tools/supervise.py, which reruns it up to this many times after
#                    an abnormal end (it resumes from the newest checkpoint) [unset: no restarts]
#   RESTART_BACKOFF  seconds before the first restart, doubled for each further one [30]

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

# make_hostfile_dir: a new directory only this user can read (mktemp -d), removed when the job ends;
# its path in $hostfile_dir. A fixed name such as /tmp/hostfile.$JOB_ID could be planted by another user.
make_hostfile_dir() {
  hostfile_dir=$(mktemp -d "${TMPDIR:-/tmp}/engine-hosts.XXXXXX") || die "cannot create a directory in" \
    "${TMPDIR:-/tmp} for the hostfile"
  # shellcheck disable=SC2064  # the path is fixed now
  trap "rm -rf '$hostfile_dir'" EXIT
}

# run_job COMMAND ...: runs COMMAND (under tools/supervise.py when MAX_RESTARTS is set) and passes the
# scheduler's stop signals on to it; returns its status.
# SIGUSR1 and SIGUSR2 (SLURM's --signal=B:..., SGE's -notify) go on as they are: mpirun and srun forward
# them to every rank, which saves a checkpoint and exits 99. Without the trap the shell would die of them
# (their default action) and leave the ranks behind. SIGTERM goes on as SIGUSR2: Open MPI 5's mpirun
# answers SIGTERM by killing the ranks within half a second (SIGCONT, SIGTERM 0.25 s later, SIGKILL
# 0.25 s after that), too soon to save anything.
run_job() {
  local cmd=("$@")
  if [ -n "${MAX_RESTARTS:-}" ]; then
    [[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS is '$MAX_RESTARTS'; expected a number"
    cmd=("$PYTHON" "$ENGINE_ROOT/tools/supervise.py" --max-restarts "$MAX_RESTARTS"
         --backoff "${RESTART_BACKOFF:-30}" -- "${cmd[@]}")
  fi
  echo "+ ${cmd[*]}" >&2
  "${cmd[@]}" &
  local pid=$! status=0
  # shellcheck disable=SC2064  # the pid is fixed now
  trap "kill -USR1 $pid 2>/dev/null || true" USR1
  # shellcheck disable=SC2064
  trap "kill -USR2 $pid 2>/dev/null || true" USR2 TERM
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid" || true  # returns early when a trapped signal arrives; the job goes on
  done
  wait "$pid" || status=$?  # bash keeps the status of the finished job
  trap - USR1 USR2 TERM
  return "$status"
}

# job_mpirun HOSTFILE NUM_RANKS CONFIG [rnn.py args ...]: run the training; returns mpirun's status.
job_mpirun() {
  local hostfile=$1 num_ranks=$2 config=$3 name
  shift 3
  # mpirun_guard.py adds this launcher's keepalive options, so that mpirun ends when a host stops answering
  # (engine/tools/mpi_launcher.py: for Open MPI 5 and 4, where the site has not set them), and turns the 0
  # that mpirun returns after losing a host's daemon into a failure
  local cmd=("$PYTHON" "$ENGINE_ROOT/tools/mpirun_guard.py" "$MPIRUN" --hostfile "$hostfile" -np "$num_ranks"
             --bind-to none --map-by slot)
  for name in $DEFAULT_RANK_ENV ${RANK_ENV:-}; do
    if printenv "$name" >/dev/null; then cmd+=(-x "$name"); fi  # exported ones: mpirun's environment
  done
  # shellcheck disable=SC2206  # MPIRUN_ARGS is a list of options, split on purpose
  cmd+=(${MPIRUN_ARGS:-} "$PYTHON" "$ENGINE_ROOT/rnn.py" "$config" ++use_horovod 1 "$@")
  run_job "${cmd[@]}"
}
