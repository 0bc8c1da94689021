"""The one place that reads the wall clock; everything else takes "now" as an argument or an
injected clock, so that it can be tested with explicit times."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utcnow"]


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(UTC)
