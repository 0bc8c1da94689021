"""The per-task state row (``ScheduledTask``): kept in step with the code, read and claimed by
the scheduler, shown by the admin.

Every function here is one or two statements on ``SCHEDULING['DATABASE']``, in autocommit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError
from django.db.models import Q

from .models import ScheduledTask
from .triggers import Trigger, TriggerState

__all__ = ["TaskRow", "sync_tasks", "read_row", "claim", "record_finish"]


@dataclass(frozen=True)
class TaskRow:
    """What the scheduler reads of a task's row before a firing."""

    state: TriggerState
    paused: bool


def _state(row: ScheduledTask) -> TriggerState:
    return TriggerState(
        anchor=row.anchor, last_fire_time=row.last_fire_time, last_finished=row.last_finished_at
    )


def sync_tasks(
    tasks: Iterable[tuple[str, Trigger]], *, now: datetime, using: str, complete: bool
) -> dict[str, TriggerState]:
    """Create or update the rows of *tasks* and return each one's state.

    A changed trigger restarts its grid (a new anchor). With *complete* (every task of the code
    is in *tasks*), rows of tasks no longer in the code are marked removed.
    """
    tasks = list(tasks)
    manager = ScheduledTask.objects.using(using)
    rows = {row.name: row for row in manager.all()}
    missing = [
        ScheduledTask(
            name=name,
            kind=trigger.kind,
            trigger=trigger.describe()[:255],
            anchor=trigger.initial_anchor(now=now),
        )
        for name, trigger in tasks
        if name not in rows
    ]
    if missing:
        # Another instance may create the same rows at the same moment: its rows win.
        manager.bulk_create(missing, ignore_conflicts=True, batch_size=500)
        rows = {row.name: row for row in manager.all()}
    for name, trigger in tasks:
        row = rows[name]
        described = trigger.describe()[:255]
        changes: dict[str, object] = {}
        if row.trigger != described or row.kind != trigger.kind:
            changes.update(
                trigger=described, kind=trigger.kind, anchor=trigger.initial_anchor(now=now)
            )
        if row.removed_at is not None:
            changes["removed_at"] = None
        if changes:
            manager.filter(name=name).update(**changes)
            for field, value in changes.items():
                setattr(row, field, value)
    if complete:
        names = {name for name, _ in tasks}
        stale = [n for n, row in rows.items() if n not in names and row.removed_at is None]
        if stale:
            manager.filter(name__in=stale).update(removed_at=now)
    return {name: _state(rows[name]) for name, _ in tasks}


def publish_next_fire_times(times: dict[str, datetime | None], *, using: str) -> None:
    """Store the next fire times the scheduler computed at start, for the admin."""
    manager = ScheduledTask.objects.using(using)
    rows = [ScheduledTask(name=name, next_fire_time=when) for name, when in times.items()]
    manager.bulk_update(rows, ["next_fire_time"], batch_size=500)


def read_row(name: str, *, using: str) -> TaskRow | None:
    """Return the row of task *name*, or ``None`` when it is missing."""
    values = (
        ScheduledTask.objects.using(using)
        .filter(name=name)
        .values_list("anchor", "last_fire_time", "last_finished_at", "paused")
        .first()
    )
    if values is None:
        return None
    anchor, last_fire_time, last_finished, paused = values
    return TaskRow(TriggerState(anchor, last_fire_time, last_finished), paused)


def claim(
    name: str,
    fire_time: datetime,
    *,
    using: str,
    run_id: int | None,
    next_fire_time: datetime | None,
) -> bool:
    """Move the task's last fire time to *fire_time*, unless it is there already.

    Return whether this call moved it: only the caller that did runs the firing.
    """
    updated = (
        ScheduledTask.objects.using(using)
        .filter(Q(last_fire_time__isnull=True) | Q(last_fire_time__lt=fire_time), name=name)
        .update(last_fire_time=fire_time, last_run_id=run_id, next_fire_time=next_fire_time)
    )
    return updated == 1


def record_finish(
    name: str,
    *,
    using: str,
    finished_at: datetime | None,
    next_fire_time: datetime | None,
    run_id: int | None = None,
) -> None:
    """Store when the task's run finished and when it fires next."""
    changes: dict[str, object] = {"next_fire_time": next_fire_time}
    if finished_at is not None:
        changes["last_finished_at"] = finished_at
    if run_id is not None:
        changes["last_run_id"] = run_id
    ScheduledTask.objects.using(using).filter(name=name).update(**changes)


def ensure_row(name: str, trigger: Trigger, *, now: datetime, using: str) -> None:
    """Create the row of *name* again if it was deleted while the scheduler ran."""
    try:
        ScheduledTask.objects.using(using).get_or_create(
            name=name,
            defaults={
                "kind": trigger.kind,
                "trigger": trigger.describe()[:255],
                "anchor": trigger.initial_anchor(now=now),
            },
        )
    except IntegrityError:
        pass  # created by another instance meanwhile
