"""A helper of the cron tests: successive next() results."""

from __future__ import annotations

from datetime import datetime

from django_scheduling.schedules.cron import CronExpression


def chain(expression: CronExpression | str, start: datetime, count: int) -> list[datetime | None]:
    """Return *count* successive next() results from *start*, stopping at None."""
    cron = CronExpression.parse(expression) if isinstance(expression, str) else expression
    results: list[datetime | None] = []
    current: datetime | None = start
    for _ in range(count):
        assert current is not None
        current = cron.next(current)
        results.append(current)
        if current is None:
            break
    return results
