"""Task dispatch: ``task = "train" | "eval" | "forward"``."""
from __future__ import annotations

from engine.config import Config
from engine.errors import ConfigError

TASKS = ("train", "eval", "forward")


def run_task(config: Config) -> None:
    task = config.str("task", "train")
    if task not in TASKS:
        raise ConfigError(f"Config key 'task' is {task!r}, which this engine does not know; "
                          f"known tasks: {', '.join(TASKS)}.")
    raise ConfigError(f"Task {task!r} is not implemented yet in this version of the engine.")
