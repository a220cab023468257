"""The program behind ``rnn.py`` and the console command ``rnn-engine``: train, evaluate or forward a
model, ``rnn.py CONFIG [CONFIG ...] [++key value ...]``.

Data-parallel: ``mpirun -np N python rnn.py CONFIG ++use_horovod 1``.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

from engine.config.cli import help_text, parse_command_line, version_text
from engine.config.loader import Config
from engine.runtime import log, process
from engine.runtime.errors import QUIET_RANK_EXIT_DELAY, ConfigError, EngineError
from engine.tasks.check import check_at_start, run_check
from engine.training.checkpoints import stop_requests


def setup_logging(config: Config) -> None:
    log.init(
        verbosity=config.int("log_verbosity"),
        files=config.list("log"),
        per_rank_files=config.bool("use_horovod") and process.size() > 1,
        all_ranks_stdout=config.bool("log_all_ranks"),
    )


def report_error(exc: EngineError, show_traceback: bool) -> None:
    """One paragraph on stderr. A config or command-line error is the same on every rank of an MPI job,
    so only rank 0 prints it; other errors are printed by the rank that hit them, with its prefix."""
    if not process.is_main() and isinstance(exc, ConfigError) and not show_traceback:
        time.sleep(QUIET_RANK_EXIT_DELAY)
        return
    if show_traceback:
        traceback.print_exc()
    print(f"{process.rank_prefix()}rnn.py: error: {exc}", file=sys.stderr, flush=True)


def wants_traceback(config: Config | None) -> bool:
    """Only ``debug`` adds the traceback to an error the user can fix: RETURNN recipes run at
    log_verbosity 5 as a matter of course, and a config error is one paragraph for them too."""
    if config is None:
        return False
    try:
        return config.bool("debug")
    except EngineError:
        return False


def main(argv: list[str] | None = None) -> int:
    # TensorFlow's start-up INFO lines (oneDNN, CPU features) would be printed by every rank. The modules
    # imported above do not import TensorFlow; the task does.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    argv = sys.argv[1:] if argv is None else argv
    config: Config | None = None
    try:
        cmd = parse_command_line(argv)
        if cmd.show_help:
            print(help_text())
            return 0
        if cmd.show_version:
            print(version_text())
            return 0
        config = Config.from_sources(cmd.config_files, cmd.overrides)
        if cmd.check:
            return run_check(config)
        setup_logging(config)
        log.debug(f"{version_text()} starting: config files {cmd.config_files}, "
                  f"task {config.str('task')!r}, pid {os.getpid()}")
        check_at_start(config)
        if config.str("task") == "train":
            # A scheduler's stop warning can come while TensorFlow still loads (seconds): recorded from
            # here on, it stops the training at its first step boundary instead of killing the rank.
            stop_requests.install()
        from engine.tasks import run_task  # after logging: tasks import TensorFlow

        run_task(config)
        return 0
    except EngineError as exc:
        if process.has_communicator():  # before, an error is the same on every rank
            from engine.distributed import fail  # prints once, aborts the job unless all ranks know

            fail(exc, show_traceback=wants_traceback(config))
        report_error(exc, show_traceback=wants_traceback(config))
        return exc.exit_code
    except KeyboardInterrupt:
        print("rnn.py: interrupted", file=sys.stderr)
        return 130
    finally:
        log.close()
