"""The wall clock as an aware datetime. Logic takes "now" as an argument or an injected clock
(defaulting to ``utcnow``), so that it can be tested with explicit times; only the threads'
waits (the dispatcher's heap, keep-alive, the pool) read ``time`` directly."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utcnow"]


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(UTC)
