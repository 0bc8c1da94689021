"""Values for the statements the scheduler writes out itself, without Django's field machinery,
whose per-value checks cost more than the statement for a batch of a thousand rows.

The app requires ``USE_TZ`` (E006), so every datetime column holds UTC.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["datetime_adapter", "duration_adapter", "aware", "column"]


def datetime_adapter(vendor: str) -> Callable[[datetime | None], Any]:
    """Return a function that turns an aware datetime into what the *vendor*'s driver
    stores for a ``DateTimeField``, as Django writes it."""
    if vendor == "postgresql":
        return lambda value: value
    if vendor == "sqlite":
        # str(), as Django's SQLite backend: the column is compared as text.
        return lambda value: (
            None if value is None else str(value.astimezone(UTC).replace(tzinfo=None))
        )
    return lambda value: None if value is None else value.astimezone(UTC).replace(tzinfo=None)


def duration_adapter(vendor: str) -> Callable[[timedelta], Any]:
    """Return a function that turns a timedelta into what the *vendor* stores for a
    ``DurationField``: an interval on PostgreSQL, microseconds elsewhere."""
    if vendor == "postgresql":
        return lambda value: value
    return lambda value: value // timedelta(microseconds=1)


def aware(value: Any) -> datetime | None:
    """Return a datetime column's value, read without Django's converters, as aware UTC."""
    if value is None:
        return None
    if isinstance(value, str):  # SQLite
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def column(model: Any, field: str) -> str:
    """Return the column name of *model*'s field *field*."""
    found = model._meta.get_field(field)
    return str(found.column)
