"""What state each task is in, for the admin and ``manage.py scheduling_status``.

A task is **overdue** when its next fire time is more than ``SCHEDULING['OVERDUE_AFTER']`` in
the past and no run has started for it: no scheduler is up, or it is stuck or starved.
"""

from __future__ import annotations

import enum
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypedDict

from django.db.models import Case, F, Q, QuerySet, Value, When

from .models import RunStatus, ScheduledTask

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

__all__ = ["TaskState", "StateAnnotations", "annotate_state", "overdue_tasks"]


class TaskState(enum.StrEnum):
    OVERDUE = "overdue"
    RUNNING = "running"
    PAUSED = "paused"
    UPCOMING = "upcoming"
    REMOVED = "removed"
    DONE = "done"


class StateAnnotations(TypedDict):
    """The values that ``annotate_state()`` adds to each task."""

    state: str
    state_order: int


def _overdue_q(now: datetime, overdue_after: timedelta) -> Q:
    not_started = Q(last_fire_time__isnull=True) | Q(last_fire_time__lt=F("next_fire_time"))
    return (
        Q(
            removed_at__isnull=True,
            paused=False,
            next_fire_time__lt=now - overdue_after,
        )
        & not_started
    )


def annotate_state(
    queryset: QuerySet[ScheduledTask], *, now: datetime, overdue_after: timedelta
) -> QuerySet[WithAnnotations[ScheduledTask, StateAnnotations]]:
    """Annotate each task with ``state`` and ``state_order`` (overdue first).

    A running task counts as running even when its next fire time has passed meanwhile."""
    running = Q(last_run__status=RunStatus.RUNNING)
    return queryset.annotate(
        state=Case(
            When(removed_at__isnull=False, then=Value(TaskState.REMOVED.value)),
            When(running, then=Value(TaskState.RUNNING.value)),
            When(_overdue_q(now, overdue_after), then=Value(TaskState.OVERDUE.value)),
            When(paused=True, then=Value(TaskState.PAUSED.value)),
            When(next_fire_time__isnull=True, then=Value(TaskState.DONE.value)),
            default=Value(TaskState.UPCOMING.value),
        ),
        state_order=Case(
            When(removed_at__isnull=False, then=Value(5)),
            When(running, then=Value(1)),
            When(_overdue_q(now, overdue_after), then=Value(0)),
            When(paused=True, then=Value(3)),
            When(next_fire_time__isnull=True, then=Value(4)),
            default=Value(2),
        ),
    )


def overdue_tasks(
    *, now: datetime, overdue_after: timedelta, using: str
) -> QuerySet[WithAnnotations[ScheduledTask, StateAnnotations]]:
    """Return the overdue tasks, the most overdue first (the rule of ``annotate_state``)."""
    tasks = ScheduledTask.objects.using(using).select_related("last_run")
    return (
        annotate_state(tasks, now=now, overdue_after=overdue_after)
        .filter(state=TaskState.OVERDUE.value)
        .order_by("next_fire_time", "name")
    )
