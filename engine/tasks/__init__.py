"""Task dispatch: ``task = "train" | "eval" | "forward" | "search"``.

Stage 7 (tasks): may import every stage below (runtime to training); imported by tools and main.
"""
from __future__ import annotations

from engine.config.loader import Config
from engine.runtime.errors import ConfigError

TASKS = ("train", "eval", "forward", "search")


def run_task(config: Config) -> None:
    task = config.str("task")
    if task not in TASKS:
        raise ConfigError(f"Config key 'task' is {task!r}, which this engine does not know; "
                          f"known tasks: {', '.join(TASKS)}.")
    if task == "train":
        from engine.tasks.train import run_train as run
    elif task == "eval":
        from engine.tasks.evaluate import run_eval as run
    elif task == "search":
        from engine.tasks.search import run_search as run
    else:
        from engine.tasks.forward import run_forward as run
    run(config)
