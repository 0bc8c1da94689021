"""Scheduled tasks for Django.

Declare a task with ``@scheduled`` in an app's ``tasks.py``::

    from django_scheduling import scheduled

    @scheduled(cron="0 0 3 * * *", zone="Europe/Berlin")
    def nightly_report():
        ...
"""

from __future__ import annotations

from datetime import datetime

from .registry import scheduled
from .triggers import MissedRuns

__all__ = ["scheduled", "MissedRuns", "shutdown_requested", "current_fire_time"]


def shutdown_requested() -> bool:
    """Return whether the scheduler running this task is shutting down."""
    from .scheduler import shutdown_requested as requested

    return requested()


def current_fire_time() -> datetime | None:
    """Return the fire time that the running task serves.

    Two runs never serve the same fire time, so it makes a good idempotency key. ``None`` in a
    manual run ("run now") and outside a task.
    """
    from .execution import current_fire_time as current

    return current()
