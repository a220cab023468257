"""Chaos: a 2-rank training under ``supervise`` takes a seeded series of faults and must end with the
parameters of an uninterrupted run, bit for bit (mpi backend, grad mode).

    python benchmarks/bench_chaos.py [--hosts simulated|local] [--seed N] [--faults 8] [--epochs 40]

``--hosts simulated`` (the default; root): the job runs on 2 simulated hosts, one rank each, started as
SGE's job body with ``MAX_RESTARTS`` (chaos_jobs.py), and takes all six kinds of fault; ``--hosts local``:
2 ranks on this host, the first four kinds. The faults, cycled in a seeded random order, each at a seeded
random moment once the restarted job trains (it has written a checkpoint; faults during start-up have
tests of their own):
  kill       SIGKILL of one rank: mpirun ends the job, ``supervise`` restarts it;
  preempt    SIGUSR1 to one rank: every rank saves and exits 99, ``supervise`` exits 99 and this script
             requeues the job, as a scheduler would;
  stall      SIGSTOP of one rank: the other's stall watchdog ends the job (``distributed_stall_timeout``),
             ``supervise`` restarts it;
  truncate   as soon as a new checkpoint appears, SIGKILL of rank 0 (which writes the checkpoints) and the
             newest checkpoint cut to half its bytes before the restart: the resume falls back to the
             previous good checkpoint;
  cut        one host's end of the link set down (TCP sees silence, not a reset) until the job has ended,
             then up again: the launcher's keepalive or the stall watchdog ends the job, ``supervise``
             restarts it;
  hostkill   SIGKILL to every process of host 1, its MPI daemon included: ``mpirun_guard`` reports the
             lost host, ``supervise`` restarts the job (the host is back, as after a reboot).
A fault counts as survived only when its effect is in the job's log (``fault_effect``), between its
injection and the next fault's: kill, a restart by ``supervise``; preempt, the requeue (``supervise``
exiting 99 after the save); stall, the stall watchdog's end of the job and a restart; truncate, the resume
falling back from the cut checkpoint to the one before it, after a restart; cut, a line that shows the
lost link (the stall watchdog's end, ssh's timeout, Open MPI's lost daemon) and a restart; hostkill,
``mpirun_guard``'s message naming simhost1 and a restart. A signal that was sent but
left no such trace (it hit a rank that was already ending, the save raced the kill, ...) is reported
as "effect not seen" and fails the verdict.
Prints each fault with the log line that shows its effect, then the faults survived, restarts and
requeues, the time against the clean run, and a verdict: PASS only when every fault was injected and
its effect seen, the job finished, and every parameter is bitwise equal to the clean run's.
"""
from __future__ import annotations

import argparse
import glob
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from chaos_jobs import HOST_FAULTS, ONE_HOST_FAULTS, LocalJob, SimulatedHostsJob  # the script's directory

Launcher = LocalJob | SimulatedHostsJob

FAULTS = ONE_HOST_FAULTS + HOST_FAULTS
STALL_TIMEOUT = 8.0

CONFIG = """
train = {{"class": "Task12AXDataset", "num_seqs": 1200, "fixed_random_seed": 1, "seq_ordering": "random"}}
dev = {{"class": "Task12AXDataset", "num_seqs": 40, "fixed_random_seed": 2}}
batch_size = 400
max_seqs = 20
network = {{"lstm": {{"class": "rec", "unit": "lstm", "n_out": 32, "dropout": 0.1}},
           "output": {{"class": "softmax", "loss": "ce", "from": "lstm"}}}}
optimizer = {{"class": "adam"}}
learning_rate = 0.01
learning_rate_control = "newbob"
num_epochs = {epochs}
model = {model!r}
checkpoint_interval = 5
random_seed = 3
use_horovod = True
distributed_backend = "mpi"
distributed_stall_warning = 2
distributed_stall_timeout = {stall}
log_verbosity = 3
"""


# The log lines that show a fault's effect (supervise's own lines, the engine's messages)
# (not anchored at a line's start: Open MPI's abort message can leave a NUL byte before supervise's line)
RESTART = re.compile(r"supervise: \S+ \S+ command ended .*; restart \d+ of \d+")
REQUEUE = re.compile(r"supervise: \S+ \S+ command stopped on request .*exiting 99")
STALL_END = re.compile(r"did not (reach|complete) .*within [\d.]+ s "
                       r"\(distributed_(stall|checkpoint)_timeout[^)]*\).*Ending the (MPI )?job", re.M)
FALLBACK = re.compile(r"Checkpoint '([^']+)' cannot be used: .*Falling back to the checkpoint before it",
                      re.M)
# a lost link: rank 0's stall watchdog, ssh's keepalive (Open MPI's launch agent), PRRTE's lost daemon
LINK_LOST = re.compile(STALL_END.pattern + r"|Timeout, server \S+ not responding"
                       r"|PRTE has lost communication with a remote daemon", re.M)
HOST_LOST = re.compile(r"mpirun_guard: error: mpirun lost its daemon on simhost1\b.*")


@dataclass
class Fault:
    kind: str
    what: str  # what was done, for the report
    offset: int  # the log's size just before it was injected: its effect is logged after this
    checkpoint: str = ""  # truncate: the file cut
    at: float = 0.0  # time.monotonic() when it was injected


def fault_effect(fault: Fault, segment: str) -> str | None:
    """The log line(s) in ``segment`` (the log from the fault's injection to the next fault's) that show
    ``fault`` had its effect, or None when they are not there."""
    def first(pattern: re.Pattern, check=lambda m: True) -> str | None:
        return next((m.group(0) for m in pattern.finditer(segment) if check(m)), None)

    restart = first(RESTART)
    if fault.kind == "kill":
        return restart
    if fault.kind == "preempt":
        return first(REQUEUE)
    if fault.kind == "stall":
        ended = first(STALL_END)
        return f"{ended} ... {restart}" if ended and restart else None
    if fault.kind == "truncate":
        cut = os.path.basename(fault.checkpoint)
        fallback = first(FALLBACK, lambda m: os.path.basename(m.group(1)) == cut)
        return f"{restart} ... {fallback}" if restart and fallback else None
    if fault.kind in ("cut", "hostkill"):
        lost = first(LINK_LOST if fault.kind == "cut" else HOST_LOST)
        return f"{lost} ... {restart}" if lost and restart else None
    raise ValueError(f"unknown fault kind {fault.kind!r}")


EXPECTED = {"kill": "a restart by supervise", "preempt": "a requeue (supervise exits 99)",
            "stall": "the stall watchdog ending the job, and a restart",
            "truncate": "a restart, and the resume falling back from the cut checkpoint",
            "cut": "a line showing the lost link, and a restart",
            "hostkill": "mpirun_guard naming the lost simhost1, and a restart"}


def fault_effects(log: bytes, faults: list[Fault]) -> list[str | None]:
    """``fault_effect`` of each fault, each on its own part of the log (up to the next fault)."""
    ends = [f.offset for f in faults[1:]] + [len(log)]
    return [fault_effect(f, log[f.offset:end].decode(errors="replace")) for f, end in zip(faults, ends)]


def write_config(folder: Path, epochs: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "chaos.py"
    path.write_text(CONFIG.format(epochs=epochs, model=str(folder / "net"), stall=STALL_TIMEOUT))
    return path


def rank_pids(config: Path) -> dict[int, int]:
    """Rank -> pid of the ranks that train ``config`` now."""
    ranks = {}
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            cmdline = open(f"{proc}/cmdline", "rb").read().split(b"\0")
            if not cmdline[0].endswith(b"python") or str(config).encode() not in cmdline:
                continue
            environ = dict(item.split(b"=", 1) for item in open(f"{proc}/environ", "rb").read().split(b"\0")
                           if b"=" in item)
            ranks[int(environ[b"OMPI_COMM_WORLD_RANK"])] = int(proc.rsplit("/", 1)[1])
        except (OSError, KeyError, ValueError, IndexError):
            continue  # gone meanwhile, or not a rank
    return ranks


def checkpoints(folder: Path) -> dict[str, float]:
    """Path -> modification time of every checkpoint (``net.NNN``, ``net.NNN.stepS``)."""
    found = {}
    for path in glob.glob(str(folder / "net.*")):
        if re.fullmatch(r"net\.\d{3,}(\.step\d+)?", os.path.basename(path)):
            try:
                found[path] = os.path.getmtime(path)
            except OSError:
                continue  # removed meanwhile (superseded)
    return found


def newest_checkpoint(folder: Path) -> str | None:
    found = checkpoints(folder)
    return max(found, key=found.get) if found else None


def params_of(folder: Path, epochs: int) -> dict[str, np.ndarray]:
    arrays = {}
    with h5py.File(folder / f"net.{epochs:03d}", "r") as f:
        f["params"].visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                               if isinstance(obj, h5py.Dataset) else None)
    return arrays


def clean_run(launcher: Launcher, folder: Path, epochs: int) -> float:
    config = write_config(folder, epochs)
    log_path = folder / "clean.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        code = launcher.start(config, log).wait(timeout=1800)
    if code != 0:
        tail = log_path.read_bytes()[-3000:].decode(errors="replace")
        sys.exit(f"bench_chaos: the clean run failed (exit {code}); the end of {log_path}:\n{tail}")
    return time.monotonic() - started


def wait_for_training(folder: Path, config: Path, job: subprocess.Popen,
                      timeout: float = 300) -> dict[int, int] | None:
    """The ranks' pids once this attempt has written a checkpoint (so it trains, past its start-up);
    None when the job ended first."""
    since = time.time()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.poll() is None:
        pids = rank_pids(config)
        if len(pids) == 2 and max(checkpoints(folder).values(), default=0.0) > since:
            return pids
        time.sleep(0.1)
    return None


def wait_gone(pids: dict[int, int], timeout: float = 120) -> None:
    """Until the faulted ranks have ended, so that the next fault hits the restarted job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids.values()):
        time.sleep(0.1)


def inject(fault: str, rng: random.Random, launcher: Launcher, folder: Path, config: Path,
           job: subprocess.Popen, log_path: Path) -> Fault | None:
    """One fault into the running job, then waits until its ranks are gone; None when the job ended
    before the fault could be injected. The fault's log offset is the log's size just before it: the
    previous fault's effects (restart, fallback) are logged by then, since this one waited for the
    restarted job to train."""
    if wait_for_training(folder, config, job) is None:
        return None
    time.sleep(rng.uniform(0.0, 1.5))  # a random step (10-30 steps a second on 2 cores)
    rank = rng.randrange(2)
    pids = rank_pids(config)
    if len(pids) < 2 or job.poll() is not None:
        return None
    offset, at = log_path.stat().st_size, time.monotonic()
    if fault in HOST_FAULTS:
        done = launcher.inject(fault, rank, log_path, offset), ""
    else:
        done = _inject(fault, rank, pids, folder, job)
    if done is None:
        return None
    wait_gone(pids)
    return Fault(fault, done[0], offset, done[1], at)


def _inject(fault: str, rank: int, pids: dict[int, int], folder: Path,
            job: subprocess.Popen) -> tuple[str, str] | None:
    if fault in ("kill", "preempt", "stall"):
        signum = {"kill": signal.SIGKILL, "preempt": signal.SIGUSR1, "stall": signal.SIGSTOP}[fault]
        os.kill(pids[rank], signum)
        return f"{signum.name} to rank {rank}", ""
    before = newest_checkpoint(folder)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        newest = newest_checkpoint(folder)
        if newest != before:
            # rank 0 writes the checkpoints: killing another rank left it time to write the next one (and
            # remove the cut one) before the job ended, and the resume never met the cut file
            os.kill(pids[0], signal.SIGKILL)
            size = os.path.getsize(newest)
            with open(newest, "r+b") as f:
                f.truncate(size // 2)
            cut = f"{os.path.basename(newest)} cut from {size} to {size // 2} bytes"
            return f"SIGKILL to rank 0 (the checkpoint writer), {cut}", newest
        time.sleep(0.05)
    return None


def chaos_run(launcher: Launcher, folder: Path, epochs: int, faults: list[str],
              rng: random.Random) -> tuple[float, dict]:
    config = write_config(folder, epochs)
    log_path = folder / "chaos.log"
    log = open(log_path, "w")
    counts: dict = {"injected": 0, "restarts": 0, "requeues": 0}
    injected: list[Fault] = []
    started = time.monotonic()
    pending = list(faults)
    while True:
        job = launcher.start(config, log)
        while pending and job.poll() is None:
            done = inject(pending[0], rng, launcher, folder, config, job, log_path)
            if done is not None:
                injected.append(done)
                print(f"  fault {len(injected)}: {pending[0]:8s} {done.what} "
                      f"(at {done.at - started:.0f} s)", flush=True)
                pending.pop(0)
        code = job.wait(timeout=1800)
        if code != 99:  # finished (0), or supervise gave up; a finished job rerun would only say so again
            break
        counts["requeues"] += 1  # saved and stopped: requeued, as a scheduler would
    log.close()
    text = log_path.read_bytes()
    counts["restarts"] = text.count(b"; restart ")
    counts["exit"] = code
    counts["not_injected"] = len(pending)
    counts["injected"] = len(injected)
    counts["faults"] = list(zip(injected, fault_effects(text, injected)))
    return time.monotonic() - started, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", choices=("simulated", "local"), default="simulated",
                        help="2 simulated hosts, one rank each (root; all fault kinds), or 2 ranks on this "
                        "host (kinds: " + ", ".join(ONE_HOST_FAULTS) + ") [simulated]")
    parser.add_argument("--seed", type=int, default=None, help="fault schedule seed (default: random)")
    parser.add_argument("--kinds", help="the fault kinds to cycle through [all that --hosts allows]")
    parser.add_argument("--faults", type=int, default=8, help="number of faults (at least 5 for the verdict)")
    parser.add_argument("--epochs", type=int, default=40,
                        help="default 40: long enough for 8 faults to land before the end (the 12AX steps "
                        "are fast: 12 epochs took 4 s of training on 2 simulated hosts, and a run with 12 "
                        "finished before its fourth fault)")
    parser.add_argument("--keep", help="keep the run folders here instead of a temporary folder")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    allowed = SimulatedHostsJob.kinds if args.hosts == "simulated" else LocalJob.kinds
    kinds = args.kinds.split(",") if args.kinds else list(allowed)
    if set(kinds) - set(allowed):
        parser.error(f"--kinds: {sorted(set(kinds) - set(allowed))} not possible with --hosts {args.hosts}; "
                     f"possible: {', '.join(allowed)}")
    faults = [kinds[i % len(kinds)] for i in range(args.faults)]
    rng.shuffle(faults)
    launcher = SimulatedHostsJob() if args.hosts == "simulated" else LocalJob()
    print(f"bench_chaos: seed {seed}, {args.faults} faults ({', '.join(faults)}), {args.epochs} epochs, "
          f"{launcher.where}, mpi backend, stall timeout {STALL_TIMEOUT:.0f} s", flush=True)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_chaos."))
    try:
        clean_time = clean_run(launcher, base / "clean", args.epochs)
        print(f"clean run: {clean_time:.1f} s", flush=True)
        chaos_time, counts = chaos_run(launcher, base / "chaos", args.epochs, faults, rng)
    finally:
        launcher.close()
    print(f"chaos run: {chaos_time:.1f} s, exit {counts['exit']}", flush=True)
    equal = False
    if counts["exit"] == 0:
        clean, chaos = params_of(base / "clean", args.epochs), params_of(base / "chaos", args.epochs)
        equal = clean.keys() == chaos.keys() and all(np.array_equal(clean[k], chaos[k]) for k in clean)
    survived = 0
    for i, (fault, effect) in enumerate(counts["faults"], 1):
        survived += effect is not None
        print(f"  fault {i}: {fault.kind:8s} effect: {effect}" if effect else
              f"  fault {i}: {fault.kind:8s} effect NOT SEEN in the log (expected {EXPECTED[fault.kind]}): "
              "not survived")
    print(f"faults survived (effect seen): {survived} of {args.faults} ({counts['injected']} injected); "
          f"restarts by supervise: {counts['restarts']}; requeues: {counts['requeues']}; "
          f"time {chaos_time / clean_time:.2f}x the clean run (+{chaos_time - clean_time:.0f} s)")
    if counts["not_injected"]:
        print(f"the job finished before {counts['not_injected']} fault(s) could be injected: train longer "
              "(--epochs)")
    passed = equal and survived == counts["injected"] == args.faults >= 5
    print(f"verdict: {'PASS' if passed else 'FAIL'} (target: >= 5 faults injected, each with its effect "
          f"seen, parameters bitwise equal to the clean run: {'yes' if equal else 'no'}); logs in {base}")
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
