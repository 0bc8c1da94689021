"""What state each task is in, for the admin, ``manage.py scheduling_status``, the health
endpoint and the metrics.

A task is **overdue** when it needs someone's attention: its next fire time is more than
``SCHEDULING['OVERDUE_AFTER']`` in the past and no run has started for it (no scheduler is up,
or it is stuck or starved), or a run still holds it by then (hung), or a run has passed its
``timeout=`` (timed out). A task is **failing** when its last ``ALERT_AFTER_FAILURES`` (by
default 3) finished runs failed: the admin tells that from the runs it reads for the sparkline.
"""

from __future__ import annotations

import enum
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypedDict

from django.db.models import Case, F, Q, QuerySet, Value, When

from ..models import RunStatus, ScheduledTask, TriggerKind

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

__all__ = [
    "FAILING_AFTER",
    "OverdueAnnotations",
    "OverdueReason",
    "StateAnnotations",
    "TaskState",
    "annotate_state",
    "overdue_tasks",
]

#: A task whose last this many finished runs failed is *failing*, unless
#: ``ALERT_AFTER_FAILURES`` says another number.
FAILING_AFTER = 3


class TaskState(enum.StrEnum):
    OVERDUE = "overdue"
    FAILING = "failing"
    RUNNING = "running"
    PAUSED = "paused"
    UPCOMING = "upcoming"
    REMOVED = "removed"
    DONE = "done"


#: The order of the task list: the states that need attention first.
STATE_ORDER = {
    TaskState.OVERDUE: 0,
    TaskState.FAILING: 1,
    TaskState.RUNNING: 2,
    TaskState.UPCOMING: 3,
    TaskState.PAUSED: 4,
    TaskState.DONE: 5,
    TaskState.REMOVED: 6,
}


class OverdueReason(enum.StrEnum):
    """Why an overdue task is overdue."""

    #: Its fire time passed and no run started for it.
    NOT_STARTED = "not started"
    #: A run still holds it, past its next fire time.
    HUNG = "hung"
    #: A run has passed its ``timeout=``.
    TIMED_OUT = "timed out"


class OverdueAnnotations(TypedDict):
    """The value that ``overdue_tasks()`` adds to each task."""

    overdue_reason: str


class StateAnnotations(OverdueAnnotations):
    """The values that ``annotate_state()`` adds to each task."""

    state: str
    state_order: int


def _running() -> Q:
    return Q(last_run__status=RunStatus.RUNNING)


def _timed_out(now: datetime) -> Q:
    return _running() & Q(last_run__timeout_at__lt=now)


def _overdue_q(now: datetime, overdue_after: timedelta) -> Q:
    """Return the rule of an overdue task (see the module's docstring).

    A fixed-delay task's next fire time counts from the end of its run: while it runs, the
    stored one is provisional, and only its timeout can make it late.
    """
    not_claimed = Q(last_fire_time__isnull=True) | Q(last_fire_time__lt=F("next_fire_time"))
    late = Q(next_fire_time__lt=now - overdue_after) & not_claimed
    running_fixed_delay = _running() & Q(kind=TriggerKind.FIXED_DELAY)
    attended = Q(removed_at__isnull=True, paused=False)
    return attended & ((late & ~running_fixed_delay) | _timed_out(now))


def annotate_state(
    queryset: QuerySet[ScheduledTask],
    *,
    now: datetime,
    overdue_after: timedelta,
) -> QuerySet[WithAnnotations[ScheduledTask, StateAnnotations]]:
    """Annotate each task with ``state``, ``state_order`` (overdue first) and, for an overdue
    one, ``overdue_reason``.

    An overdue task is overdue even while a run holds it (hung, timed out). Whether an
    upcoming task is *failing* is read from its recent runs (``trends.failures_in_a_row``),
    which the admin reads anyway, not here: the last N runs of every task would cost the
    task list a sort of each one's history.
    """
    overdue = _overdue_q(now, overdue_after)
    cases = [
        (Q(removed_at__isnull=False), TaskState.REMOVED),
        (overdue, TaskState.OVERDUE),
        (_running(), TaskState.RUNNING),
        (Q(paused=True), TaskState.PAUSED),
        (Q(next_fire_time__isnull=True), TaskState.DONE),
    ]
    return queryset.annotate(
        state=Case(
            *(When(rule, then=Value(state.value)) for rule, state in cases),
            default=Value(TaskState.UPCOMING.value),
        ),
        state_order=Case(
            *(When(rule, then=Value(STATE_ORDER[state])) for rule, state in cases),
            default=Value(STATE_ORDER[TaskState.UPCOMING]),
        ),
        overdue_reason=Case(
            When(~overdue, then=Value("")),
            When(_timed_out(now), then=Value(OverdueReason.TIMED_OUT.value)),
            When(_running(), then=Value(OverdueReason.HUNG.value)),
            default=Value(OverdueReason.NOT_STARTED.value),
        ),
    )


def overdue_tasks(
    *, now: datetime, overdue_after: timedelta, using: str
) -> QuerySet[WithAnnotations[ScheduledTask, OverdueAnnotations]]:
    """Return the overdue tasks, the most overdue first (the rule of ``annotate_state``)."""
    tasks = ScheduledTask.objects.using(using).select_related("last_run")
    return (
        tasks.filter(_overdue_q(now, overdue_after))
        .annotate(
            overdue_reason=Case(
                When(_timed_out(now), then=Value(OverdueReason.TIMED_OUT.value)),
                When(_running(), then=Value(OverdueReason.HUNG.value)),
                default=Value(OverdueReason.NOT_STARTED.value),
            )
        )
        .order_by(F("next_fire_time").asc(nulls_last=True), "name")
    )
