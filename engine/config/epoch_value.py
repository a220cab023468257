"""RETURNN's ``WrapEpochValue`` (``from returnn.pretrain import WrapEpochValue`` in config code): a value of
a pretraining network that depends on the epoch. ``engine/model/pretrain.py`` resolves it."""
from __future__ import annotations

from typing import Any, Callable


class WrapEpochValue:
    """A value of a pretraining network that depends on the epoch: ``func(epoch=e)``."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func

    def get_value(self, epoch: int) -> Any:
        return self.func(epoch=epoch)
