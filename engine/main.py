"""The program behind ``rnn.py`` and the console command ``rnn-engine``: train, evaluate or forward a
model, ``rnn.py CONFIG [CONFIG ...] [++key value ...]``.

Data-parallel: ``mpirun -np N python rnn.py CONFIG ++use_horovod 1``.
"""
from __future__ import annotations

import os
import sys
import traceback

from engine import log
from engine.cli import help_text, parse_command_line, version_text
from engine.config import Config
from engine.errors import ConfigError, EngineError
from engine.launch import env_rank, env_size


def setup_logging(config: Config) -> None:
    use_horovod = config.bool("use_horovod", False)
    rank, size = (env_rank(), env_size()) if use_horovod else (0, 1)
    log.init(
        verbosity=config.int("log_verbosity", log.INFO),
        files=config.list("log", []),
        rank=rank,
        size=size,
        per_rank_files=use_horovod and size > 1,
        all_ranks_stdout=config.bool("log_all_ranks", False),
    )


def report_error(exc: EngineError, show_traceback: bool) -> None:
    """One paragraph on stderr. A config or command-line error is the same on every rank of an MPI job,
    so only rank 0 prints it; other errors are printed by the rank that hit them, with its prefix."""
    rank = env_rank()
    if rank > 0 and isinstance(exc, ConfigError) and not show_traceback:
        return
    prefix = f"[rank {rank}] " if env_size() > 1 else ""
    if show_traceback:
        traceback.print_exc()
    print(f"{prefix}rnn.py: error: {exc}", file=sys.stderr, flush=True)


def distributed_started() -> bool:
    """Whether a task created a communicator (errors before that are the same on every rank)."""
    helpers = sys.modules.get("engine.distributed.helpers")  # not imported yet: no communicator
    return helpers is not None and helpers.is_initialized()


def wants_traceback(config: Config | None) -> bool:
    if config is None:
        return False
    try:
        return config.bool("debug", False) or config.int("log_verbosity", log.INFO) >= log.TRACE
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
        setup_logging(config)
        log.debug(f"{version_text()} starting: config files {cmd.config_files}, "
                  f"task {config.str('task', 'train')!r}, pid {os.getpid()}")
        from engine.tasks import run_task  # after logging: tasks import TensorFlow

        run_task(config)
        return 0
    except EngineError as exc:
        if distributed_started():
            from engine.distributed import fail  # prints once, aborts the job unless all ranks know

            fail(exc, show_traceback=wants_traceback(config))
        report_error(exc, show_traceback=wants_traceback(config))
        return exc.exit_code
    except KeyboardInterrupt:
        print("rnn.py: interrupted", file=sys.stderr)
        return 130
    finally:
        log.close()
