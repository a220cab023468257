"""Rerun a training command after an abnormal end, with back-off, until it finishes or cannot be helped.

    supervise [--max-restarts N] [--backoff SECONDS] [--max-backoff SECONDS] [--reset-after SECONDS]
              -- COMMAND [ARGS ...]

    e.g. supervise --max-restarts 5 -- mpirun -np 8 python rnn.py config.py ++use_horovod 1

COMMAND must resume by itself when run again: ``rnn.py`` does with ``start_epoch = "auto"`` (the
default), from the newest checkpoint. What the supervisor does when COMMAND ends (exit codes as in
docs/long-jobs.md):

  0                 done: exit 0.
  2, 3              a config or data error (3 also: an Inf/NaN in training): a restart would fail the
                    same way; exit with that code.
  99                COMMAND stopped on request (preemption, time limit) after saving a checkpoint.
                    The request came from the scheduler, which is about to take the allocation away:
                    a rerun here would be killed mid-step and waste a restart. Exit 99, so that the
                    scheduler requeues the job (SGE does for 99; tools/sbatch_train.sh requeues on
                    SLURM) and it resumes in a fresh allocation.
  anything else     (a failed or stalled rank, a lost node, death by a signal): wait, then rerun;
                    the wait doubles each time from --backoff up to --max-backoff. After N restarts
                    exit with the last code (128 + N for death by signal N). A run that lasted
                    --reset-after seconds or more before it ended this way was healthy: its end counts
                    as the first again (restart 1 of N, the first back-off), so that a job crashing once
                    a day for weeks is not given up after N days.

Each restart is logged on stderr with its cause, the run's duration and the attempt count.
SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 sent to the supervisor are forwarded to COMMAND, and no
restart follows: the supervisor exits with COMMAND's code (99 when it saved and stopped). SIGTERM goes
on as SIGUSR2, the engine's save-and-exit request, as the job scripts pass it on: Open MPI's ``mpirun``
answers SIGTERM by killing the ranks within half a second, too soon to save a checkpoint, while it
forwards SIGUSR2 to every rank. A SIGTERM ``REPEAT_GRACE_SECONDS`` or more after the first goes on as
SIGTERM: whoever sends it again wants COMMAND gone now. COMMAND runs in its own session, so a signal to
the supervisor's process group (Ctrl-C) reaches it once, through the supervisor; killing the supervisor
with SIGKILL leaves COMMAND running.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

from engine.runtime.errors import (CONFIG_ERROR_EXIT_CODE, DATA_ERROR_EXIT_CODE, NOT_RESTARTABLE_EXIT_CODES,
                                   RESUMABLE_EXIT_CODE)
from engine.training.checkpoints.stop_requests import REPEAT_GRACE_SECONDS

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# A signal that arrives while waiting to restart: the scheduler's stop warnings end the supervisor with
# "resumable" (the newest checkpoint is on disk, a requeue resumes from it); others with 128 + N.
_STOP_WARNINGS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_WHY_FATAL = {CONFIG_ERROR_EXIT_CODE: "a config error",
              DATA_ERROR_EXIT_CODE: "a data error (or an Inf/NaN in training)"}
# What a first SIGTERM becomes: a stop request the engine saves a checkpoint for (stop_requests.py), which
# mpirun forwards to the ranks; mpirun would answer SIGTERM itself by killing them within 0.5 s.
TERM_FORWARDED_AS = signal.SIGUSR2
DEFAULT_RESET_AFTER = 3600.0  # a run this long was healthy: two checkpoints at the default 30 min interval


def log(message: str) -> None:
    print(f"supervise: {time.strftime('%Y-%m-%d %H:%M:%S')} {message}", file=sys.stderr, flush=True)


def describe_end(returncode: int) -> str:
    """``exit code 1``, ``exit code 137 (128 + SIGKILL)``, ``killed by SIGKILL``."""
    if returncode < 0:
        return f"killed by {_signal_name(-returncode)}"
    if 128 < returncode < 128 + signal.NSIG:
        return f"exit code {returncode} (128 + {_signal_name(returncode - 128)})"
    return f"exit code {returncode}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(returncode: int) -> int:
    """A child's end as the supervisor's own exit code (the shell's convention for signals)."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    def __init__(self, command: list[str], max_restarts: int, backoff: float, max_backoff: float,
                 reset_after: float = DEFAULT_RESET_AFTER) -> None:
        """``reset_after``: seconds of running after which an abnormal end counts as the first (0: never)."""
        self.command, self.max_restarts = command, max_restarts
        self.backoff, self.max_backoff = backoff, max_backoff
        self.reset_after = reset_after
        self.child: subprocess.Popen | None = None
        self.stop_signal: int | None = None  # the first forwarded signal: no more restarts after it
        self._first_term: float | None = None  # monotonic time of the first SIGTERM

    def _on_signal(self, signum: int, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(self._forwarded(signum))

    def _forwarded(self, signum: int) -> int:
        """The signal COMMAND gets for ``signum``: SIGTERM as the engine's save-and-exit request, unless
        it repeats a SIGTERM from ``REPEAT_GRACE_SECONDS`` or more ago (then as itself: end now)."""
        if signum != signal.SIGTERM:
            return signum
        now = time.monotonic()
        if self._first_term is None:
            self._first_term = now
        return TERM_FORWARDED_AS if now - self._first_term < REPEAT_GRACE_SECONDS else signal.SIGTERM

    def run(self) -> int:
        previous = {signum: signal.signal(signum, self._on_signal) for signum in FORWARDED_SIGNALS}
        try:
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run(self) -> int:
        attempts = self.max_restarts + 1
        attempt = 0
        while True:
            attempt += 1
            if self.stop_signal is not None:
                return self._stopped_while_waiting()
            started = time.monotonic()
            try:
                self.child = subprocess.Popen(self.command, start_new_session=True)
            except OSError as exc:
                log(f"cannot run {self.command[0]!r}: {exc.strerror}.")
                return 127 if isinstance(exc, FileNotFoundError) else 126
            if self.stop_signal is not None:  # arrived between the fork and the assignment
                self.child.send_signal(self._forwarded(self.stop_signal))
            code = self.child.wait()
            duration = time.monotonic() - started
            ran = f"after {duration:.1f} s, {describe_end(code)} (attempt {attempt} of {attempts})"
            if code == 0:
                if attempt > 1:
                    log(f"command finished {ran}.")
                return 0
            if self.stop_signal is not None:
                forwarded = _signal_name(self.stop_signal)
                if self.stop_signal == signal.SIGTERM:
                    forwarded += f" (as {_signal_name(TERM_FORWARDED_AS)}, the save-and-exit request)"
                log(f"command ended {ran} after {forwarded} was forwarded to it; not restarting.")
                return exit_status(code)
            if code in NOT_RESTARTABLE_EXIT_CODES:
                log(f"command ended {ran}: {_WHY_FATAL[code]}, which a restart cannot fix; giving up.")
                return code
            if code == RESUMABLE_EXIT_CODE:
                log(f"command stopped on request {ran} after saving a checkpoint; exiting "
                    f"{RESUMABLE_EXIT_CODE} so that the scheduler requeues the job, which then resumes.")
                return code
            if self.reset_after and duration >= self.reset_after and attempt > 1:
                # A long healthy stretch: the crashes before it say nothing about this one, which counts
                # as the first, so that rare crashes over weeks do not use up the restarts.
                ran += f", a run of --reset-after {self.reset_after:g} s or more: counted as attempt 1"
                attempt = 1
            if attempt == attempts:
                log(f"command ended {ran}; no restarts left (--max-restarts {self.max_restarts}), giving up.")
                return exit_status(code)
            wait = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
            log(f"command ended {ran}; restart {attempt} of {self.max_restarts} in {wait:g} s.")
            self._sleep(wait)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.stop_signal is None and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _stopped_while_waiting(self) -> int:
        name = _signal_name(self.stop_signal)
        if self.stop_signal in _STOP_WARNINGS:
            log(f"{name} while waiting to restart: exiting {RESUMABLE_EXIT_CODE}; the newest checkpoint is "
                "on disk and a requeued job resumes from it.")
            return RESUMABLE_EXIT_CODE
        log(f"{name} while waiting to restart: not restarting.")
        return 128 + self.stop_signal


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="supervise", description="Rerun COMMAND after an abnormal end, with exponential back-off.",
        usage="supervise [--max-restarts N] [--backoff SECONDS] [--max-backoff SECONDS] "
              "[--reset-after SECONDS] -- COMMAND [ARGS ...]",
        epilog="Exit codes and signals: see docs/long-jobs.md or engine/tools/supervise.py.")
    parser.add_argument("--max-restarts", type=int, default=3, metavar="N",
                        help="reruns after an abnormal end before giving up [3]")
    parser.add_argument("--backoff", type=float, default=30.0, metavar="SECONDS",
                        help="wait before the first restart, doubled for each further one [30]")
    parser.add_argument("--max-backoff", type=float, default=600.0, metavar="SECONDS",
                        help="longest wait between restarts [600]")
    parser.add_argument("--reset-after", type=float, default=DEFAULT_RESET_AFTER, metavar="SECONDS",
                        help="a run that lasted this long before it ended abnormally counts as the first "
                             "again: restart count and back-off start afresh; 0: never "
                             f"[{DEFAULT_RESET_AFTER:g}]")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments, after --")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no COMMAND given; write: supervise [options] -- COMMAND [ARGS ...]")
    if min(args.max_restarts, args.backoff, args.max_backoff, args.reset_after) < 0:
        parser.error("--max-restarts, --backoff, --max-backoff and --reset-after must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return Supervisor(args.command, args.max_restarts, args.backoff, args.max_backoff, args.reset_after).run()
