"""Scheduled tasks for Django.

Declare a task with ``@scheduled`` in an app's ``tasks.py``::

    from django_scheduling import scheduled

    @scheduled(cron="0 0 3 * * *", zone="Europe/Berlin")
    def nightly_report():
        ...
"""

from __future__ import annotations

from . import _moved
from .context import (
    EnqueuedTooLate,
    RunTimedOut,
    cancel_requested,
    current_fire_time,
    shutdown_requested,
)
from .schedules.triggers import MissedRuns
from .tasks.registry import schedulable, scheduled

#: The version of django-scheduling, the one place it is written (pyproject.toml reads it).
__version__ = "0.1.0"

__all__ = [
    "__version__",
    "scheduled",
    "schedulable",
    "MissedRuns",
    "cancel_requested",
    "shutdown_requested",
    "current_fire_time",
    "RunTimedOut",
    "EnqueuedTooLate",
]

_moved.install()
