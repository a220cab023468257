#!/usr/bin/env python3
"""Train, evaluate or forward a model: ``python rnn.py CONFIG [CONFIG ...] [++key value ...]``.

Data-parallel: ``mpirun -np N python rnn.py CONFIG ++use_horovod 1``.
"""
from __future__ import annotations

import os
import sys
import traceback

# TensorFlow's start-up INFO lines (oneDNN, CPU features) would be printed by every rank.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from engine import log, process
from engine.cli import help_text, parse_command_line, version_text
from engine.config import Config
from engine.errors import ConfigError, EngineError


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
        return
    if show_traceback:
        traceback.print_exc()
    print(f"{process.rank_prefix()}rnn.py: error: {exc}", file=sys.stderr, flush=True)


def wants_traceback(config: Config | None) -> bool:
    if config is None:
        return False
    try:
        return config.bool("debug") or config.int("log_verbosity") >= log.TRACE
    except EngineError:
        return False


def main(argv: list[str]) -> int:
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
        setup_logging(config)
        log.debug(f"{version_text()} starting: config files {cmd.config_files}, "
                  f"task {config.str('task', 'train')!r}, pid {os.getpid()}")
        from engine.tasks import run_task  # after logging: tasks import TensorFlow

        run_task(config)
        return 0
    except EngineError as exc:
        if process.has_communicator():  # errors before that are the same on every rank
            from engine.distributed import fail  # prints once, aborts the job unless all ranks know

            fail(exc, show_traceback=wants_traceback(config))
        report_error(exc, show_traceback=wants_traceback(config))
        return exc.exit_code
    except KeyboardInterrupt:
        print("rnn.py: interrupted", file=sys.stderr)
        return 130
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
