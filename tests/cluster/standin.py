"""Local stand-ins for ``qsub``, ``sbatch``, ``srun``, ``scontrol`` and ``mpirun``, for testing the job
scripts.

    standin.py COMMAND [ARGS ...]      (the test puts wrappers named qsub, sbatch, ... first on PATH)

``qsub`` and ``sbatch`` check their options, then run the job at once the way the scheduler would: a
copy of the script in a spool directory, the allocation in the scheduler's variables (taken from
``FAKE_PE_HOSTFILE`` / ``FAKE_SLURM_NODELIST`` and ``FAKE_SLURM_TASKS_PER_NODE``), the working
directory and output file the options ask for. ``FAKE_SIGNAL_JOB`` makes the scheduler signal the
running job once its ``mpirun`` has started: ``warning`` sends what the job asked for before its end
(sbatch ``--signal=B:SIG@T``: SIG to the job's shell only; qsub ``-notify``: SIGUSR2, the warning
before SIGKILL, to every process of the job), a signal name (``SIGTERM``) sends that one to the job's
shell only. ``srun`` and ``scontrol`` only record; ``mpirun`` records, then acts out the next entry of
``FAKE_MPIRUN_OUTCOMES`` (comma-separated, one per call, the last one repeated; default ``0``): an exit
code, or ``wait-signal``: wait for SIGUSR1, SIGUSR2 or SIGTERM, as ranks that save a checkpoint on it,
record the signals received and exit 99. ``mpirun --version`` prints ``FAKE_MPIRUN_VERSION`` (default: Open
MPI 5.0.11's text) and is not recorded. Every call appends one JSON line to ``$FAKE_RECORD``: the
command, its arguments, its environment and, for ``mpirun``, the content of its ``--hostfile`` and the
permissions of the directory it lies in.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

# Options each stand-in accepts, with how many values follow them (anything else is an error, so a
# script passing an option the test does not expect fails loudly).
QSUB_OPTIONS = {"-N": 1, "-pe": 2, "-S": 1, "-o": 1, "-e": 1, "-j": 1, "-l": 1, "-q": 1, "-cwd": 0, "-V": 0,
                "-notify": 0}
SBATCH_OPTIONS = ("--job-name", "--ntasks", "--output", "--nodes", "--ntasks-per-node", "--gpus-per-task",
                  "--cpus-per-task", "--time", "--partition", "--signal", "--open-mode")
SBATCH_FLAGS = ("--requeue",)
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
QSUB_JOB_ID, SBATCH_JOB_ID = "4711", "4712"


def record(command: str, args: list[str], **extra) -> None:
    entry = {"command": command, "args": args, "cwd": os.getcwd(), "env": dict(os.environ), **extra}
    with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def spool_copy(script: str, job_id: str) -> tuple[str, str]:
    """The scheduler runs a copy of the script, not the file in the repository."""
    spool = os.path.join(os.environ["FAKE_SPOOL"], job_id)
    os.makedirs(os.path.join(spool, "tmp"), exist_ok=True)
    copy = os.path.join(spool, "job_script")
    shutil.copy(script, copy)
    return spool, copy


def run_job(cmd: list[str], env: dict, cwd: str, out, stderr, signal_job) -> int:
    """Run the job in its own process group; ``signal_job(proc)`` once its mpirun has started."""
    ready = os.path.join(os.environ["FAKE_SPOOL"], "mpirun_started")
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=stderr, start_new_session=True)
    if os.environ.get("FAKE_SIGNAL_JOB"):
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is None:
            signal_job(proc)
    return proc.wait()


def signal_shell(signame: str):
    return lambda proc: proc.send_signal(signal.Signals[signame])


def qsub(args: list[str]) -> int:
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] not in QSUB_OPTIONS:
            sys.exit(f"qsub stand-in: unexpected option {args[i]!r}")
        n = QSUB_OPTIONS[args[i]]
        opts[args[i]] = args[i + 1:i + 1 + n]
        i += 1 + n
    script, script_args = args[i], args[i + 1:]
    record("qsub", args)
    spool, copy = spool_copy(script, QSUB_JOB_ID)
    pe_hostfile = os.path.join(spool, "pe_hostfile")
    with open(pe_hostfile, "w", encoding="utf-8") as f:
        f.write(os.environ["FAKE_PE_HOSTFILE"])
    env = dict(os.environ) if "-V" in opts else {"PATH": "/usr/bin:/bin"}
    env.update(JOB_ID=QSUB_JOB_ID, JOB_NAME=opts["-N"][0], NSLOTS=opts["-pe"][1], PE=opts["-pe"][0],
               PE_HOSTFILE=pe_hostfile, TMPDIR=os.path.join(spool, "tmp"), SGE_O_WORKDIR=os.getcwd())
    out_dir = opts["-o"][0]
    out_path = os.path.join(out_dir, f"{opts['-N'][0]}.o{QSUB_JOB_ID}") if os.path.isdir(out_dir) else out_dir
    request = os.environ.get("FAKE_SIGNAL_JOB")
    if request == "warning":
        if "-notify" not in opts:
            sys.exit("qsub stand-in: FAKE_SIGNAL_JOB=warning, but the job was submitted without -notify")
        signal_job = lambda proc: os.killpg(proc.pid, signal.SIGUSR2)  # noqa: E731
    else:
        signal_job = signal_shell(request or "SIGTERM")
    with open(out_path, "a", encoding="utf-8") as out:  # SGE appends: a rescheduled job adds to it
        cwd = os.getcwd() if "-cwd" in opts else env.get("HOME", "/")
        status = run_job([opts["-S"][0], copy, *script_args], env, cwd, out,
                         subprocess.STDOUT if opts.get("-j") == ["y"] else None, signal_job)
    print(f'Your job {QSUB_JOB_ID} ("{opts["-N"][0]}") has been submitted')
    with open(os.path.join(os.environ["FAKE_SPOOL"], "job_status"), "w") as f:
        f.write(str(status))
    return 0


def sbatch(args: list[str]) -> int:
    opts: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, _, value = args[i].partition("=")
        if not (name in SBATCH_OPTIONS and value or name in SBATCH_FLAGS and not value):
            sys.exit(f"sbatch stand-in: unexpected option {args[i]!r} (write --option=value)")
        opts[name] = value
        i += 1
    script, script_args = args[i], args[i + 1:]
    record("sbatch", args)
    spool, copy = spool_copy(script, SBATCH_JOB_ID)
    name = opts.get("--job-name", "job_script")
    env = dict(os.environ)  # sbatch's default: --export=ALL
    env.update(SLURM_JOB_ID=SBATCH_JOB_ID, SLURM_JOB_NAME=name, SLURM_NTASKS=opts["--ntasks"],
               SLURM_JOB_NODELIST=os.environ["FAKE_SLURM_NODELIST"], SLURM_SUBMIT_DIR=os.getcwd(),
               SLURM_TASKS_PER_NODE=os.environ["FAKE_SLURM_TASKS_PER_NODE"],
               TMPDIR=os.path.join(spool, "tmp"))
    out_path = opts.get("--output", "slurm-%j.out").replace("%x", name).replace("%j", SBATCH_JOB_ID)
    request = os.environ.get("FAKE_SIGNAL_JOB")
    if request == "warning":
        if not opts.get("--signal", "").startswith("B:"):
            sys.exit("sbatch stand-in: FAKE_SIGNAL_JOB=warning needs --signal=B:SIG@SECONDS")
        signame = opts["--signal"][2:].split("@")[0]
        request = signame if signame.startswith("SIG") else "SIG" + signame
    mode = "a" if opts.get("--open-mode") == "append" else "w"
    with open(out_path, mode, encoding="utf-8") as out:
        status = run_job([copy, *script_args], env, os.getcwd(), out, subprocess.STDOUT,
                         signal_shell(request or "SIGTERM"))
    print(f"Submitted batch job {SBATCH_JOB_ID}")
    with open(os.path.join(os.environ["FAKE_SPOOL"], "job_status"), "w") as f:
        f.write(str(status))
    return 0


def mpirun(args: list[str]) -> int:
    if args == ["--version"]:  # asked by mpirun_guard; not recorded
        print(os.environ.get("FAKE_MPIRUN_VERSION", "mpirun (Open MPI) 5.0.11\n\nReport bugs to "
                             "https://www.open-mpi.org/community/help/"))
        return 0
    hostfile = hostfile_dir_mode = None
    if "--hostfile" in args:
        path = args[args.index("--hostfile") + 1]
        with open(path, encoding="utf-8") as f:
            hostfile = f.read()
        hostfile_dir_mode = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)
    received: list[str] = []
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda signum, frame: received.append(signal.Signals(signum).name))
    record("mpirun", args, hostfile=hostfile, hostfile_dir_mode=hostfile_dir_mode)
    outcome = next_mpirun_outcome()
    open(os.path.join(os.environ["FAKE_SPOOL"], "mpirun_started"), "w").close()
    if outcome != "wait-signal":
        return int(outcome)
    deadline = time.monotonic() + 120
    while not received and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the same stop may come twice (to the process group and forwarded): collect both
    record("mpirun-signals", args, received=received)
    return 99 if received else 1


def next_mpirun_outcome() -> str:
    outcomes = os.environ.get("FAKE_MPIRUN_OUTCOMES", "0").split(",")
    counter = os.path.join(os.environ["FAKE_SPOOL"], "mpirun_calls")
    calls = int(open(counter).read()) if os.path.exists(counter) else 0
    with open(counter, "w") as f:
        f.write(str(calls + 1))
    return outcomes[min(calls, len(outcomes) - 1)]


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    if command in ("srun", "scontrol"):
        record(command, args)
        return 0
    return {"qsub": qsub, "sbatch": sbatch, "mpirun": mpirun}[command](args)


if __name__ == "__main__":
    sys.exit(main())
