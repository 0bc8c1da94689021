"""Scheduled tasks for Django.

Declare a task with ``@scheduled`` in an app's ``tasks.py``::

    from django_scheduling import scheduled

    @scheduled(cron="0 0 3 * * *", zone="Europe/Berlin")
    def nightly_report():
        ...
"""

from __future__ import annotations

from .registry import scheduled
from .triggers import MissedRuns

__all__ = ["scheduled", "MissedRuns", "shutdown_requested"]


def shutdown_requested() -> bool:
    """Return whether the scheduler running this task is shutting down."""
    from .scheduler import shutdown_requested as requested

    return requested()
