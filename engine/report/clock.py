"""Durations as the reports show them."""
from __future__ import annotations

from datetime import timedelta


def hms(seconds: float) -> str:
    """``0:28:58``: hours, minutes, seconds, as RETURNN prints them."""
    return str(timedelta(seconds=int(round(max(seconds, 0.0)))))
