"""Local stand-ins for ``qsub``, ``sbatch``, ``srun`` and ``mpirun``, for testing the job scripts.

    standin.py COMMAND [ARGS ...]      (the test puts wrappers named qsub, sbatch, ... first on PATH)

``qsub`` and ``sbatch`` check their options, then run the job at once the way the scheduler would: a
copy of the script in a spool directory, the allocation in the scheduler's variables (taken from
``FAKE_PE_HOSTFILE`` / ``FAKE_SLURM_NODELIST`` and ``FAKE_SLURM_TASKS_PER_NODE``), the working
directory and output file the options ask for. ``mpirun`` and ``srun`` only record. Every call appends
one JSON line to ``$FAKE_RECORD``: the command, its arguments, its environment and, for ``mpirun``,
the content of its ``--hostfile``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

# Options each stand-in accepts, with how many values follow them (anything else is an error, so a
# script passing an option the test does not expect fails loudly).
QSUB_OPTIONS = {"-N": 1, "-pe": 2, "-S": 1, "-o": 1, "-e": 1, "-j": 1, "-l": 1, "-q": 1, "-cwd": 0, "-V": 0}
SBATCH_OPTIONS = ("--job-name", "--ntasks", "--output", "--nodes", "--ntasks-per-node", "--gpus-per-task",
                  "--cpus-per-task", "--time", "--partition")
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
    with open(out_path, "w", encoding="utf-8") as out:
        cwd = os.getcwd() if "-cwd" in opts else env.get("HOME", "/")
        status = subprocess.call([opts["-S"][0], copy, *script_args], env=env, cwd=cwd, stdout=out,
                                 stderr=subprocess.STDOUT if opts.get("-j") == ["y"] else None)
    print(f'Your job {QSUB_JOB_ID} ("{opts["-N"][0]}") has been submitted')
    with open(os.path.join(os.environ["FAKE_SPOOL"], "job_status"), "w") as f:
        f.write(str(status))
    return 0


def sbatch(args: list[str]) -> int:
    opts: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, _, value = args[i].partition("=")
        if name not in SBATCH_OPTIONS or not value:
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
    with open(out_path, "w", encoding="utf-8") as out:
        status = subprocess.call([copy, *script_args], env=env, stdout=out, stderr=subprocess.STDOUT)
    print(f"Submitted batch job {SBATCH_JOB_ID}")
    with open(os.path.join(os.environ["FAKE_SPOOL"], "job_status"), "w") as f:
        f.write(str(status))
    return 0


def mpirun(args: list[str]) -> int:
    hostfile = None
    if "--hostfile" in args:
        with open(args[args.index("--hostfile") + 1], encoding="utf-8") as f:
            hostfile = f.read()
    record("mpirun", args, hostfile=hostfile)
    return 0


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "srun":
        record("srun", args)
        return 0
    return {"qsub": qsub, "sbatch": sbatch, "mpirun": mpirun}[command](args)


if __name__ == "__main__":
    sys.exit(main())
