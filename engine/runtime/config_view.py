"""``ConfigView``: the typed getters of the config that runtime reads (device, thread counts).

Runtime is the lowest stage and may not import ``engine.config``; its functions take the
``engine.config.loader.Config`` they are given, typed as this protocol.
"""
from __future__ import annotations

from typing import Any, Protocol


class ConfigView(Protocol):
    """The getters runtime calls; each returns the key's value (or ``default``) as that type, or None."""

    def str(self, key: str, default: Any = ...) -> str | None: ...

    def int(self, key: str, default: Any = ...) -> int | None: ...

    def dict(self, key: str, default: Any = ...) -> dict | None: ...
