"""The per-task state row (``ScheduledTask``): kept in step with the code, read and claimed by
the scheduler, shown by the admin.

Every function here is one or two statements on ``SCHEDULING['DATABASE']``, in autocommit. The
writes that decide who runs what are conditional updates whose row count is the answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError
from django.db.models import Q

from .models import ScheduledTask, TaskLock
from .triggers import Trigger, TriggerState

__all__ = [
    "TaskRow",
    "sync_tasks",
    "describe",
    "read_row",
    "read_last_fire_time",
    "claim",
    "take_run_request",
    "take_recovery",
    "record_finish",
    "read_lock_holder",
    "ensure_row",
]


@dataclass(frozen=True)
class TaskRow:
    """What the scheduler reads of a task's row before a firing."""

    state: TriggerState
    paused: bool
    #: The trigger of the deployment that synced the row last, in words.
    trigger: str = ""
    run_requested_at: datetime | None = None
    last_run_id: int | None = None
    #: A lost run waiting to be run again (``recover=True``), and the fire time it served.
    recover_run_id: int | None = None
    recover_fire_time: datetime | None = None


def _state(row: ScheduledTask) -> TriggerState:
    return TriggerState(
        anchor=row.anchor, last_fire_time=row.last_fire_time, last_finished=row.last_finished_at
    )


def sync_tasks(
    tasks: Iterable[tuple[str, Trigger]], *, now: datetime, using: str, complete: bool
) -> dict[str, TriggerState]:
    """Create or update the rows of *tasks* and return each one's state.

    A changed trigger starts afresh, as a new task would: a new anchor, and no last fire time,
    so that no fire time of the old trigger, and none from before the change, is run (or
    counted as missed). Claims name the trigger they were computed from, so an instance still
    running the old trigger can no longer claim a fire time. With *complete* (every task of
    the code is in *tasks*), rows of tasks no longer in the code are marked removed.
    """
    tasks = list(tasks)
    manager = ScheduledTask.objects.using(using)
    rows = {row.name: row for row in manager.all()}
    missing = [
        ScheduledTask(
            name=name,
            kind=trigger.kind,
            trigger=describe(trigger),
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
        described = describe(trigger)
        changes: dict[str, object] = {}
        if row.trigger != described or row.kind != trigger.kind:
            changes.update(
                trigger=described,
                kind=trigger.kind,
                anchor=trigger.initial_anchor(now=now),
                last_fire_time=None,
                last_finished_at=None,
                next_fire_time=None,
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


def describe(trigger: Trigger) -> str:
    """Return the trigger as stored in the row (and compared by claims)."""
    return trigger.describe()[:255]


_ROW_FIELDS = (
    "anchor",
    "last_fire_time",
    "last_finished_at",
    "paused",
    "trigger",
    "run_requested_at",
    "last_run_id",
    "recover_run_id",
)


def read_row(name: str, *, using: str) -> TaskRow | None:
    """Return the row of task *name*, or ``None`` when it is missing."""
    found = (
        ScheduledTask.objects.using(using)
        .filter(name=name)
        .order_by()
        .values_list(*_ROW_FIELDS, "recover_run__scheduled_at")[:1]
    )
    if not found:
        return None
    values = found[0]
    anchor, last_fire, last_finished, paused, trigger, requested, last_run, recover, fire = values
    return TaskRow(
        TriggerState(anchor, last_fire, last_finished),
        paused,
        trigger,
        requested,
        last_run,
        recover,
        fire,
    )


def read_last_fire_time(name: str, *, using: str) -> datetime | None:
    """Return the newest fire time claimed for *name* (one small read, no lock)."""
    found = (
        ScheduledTask.objects.using(using)
        .filter(name=name)
        .order_by()
        .values_list("last_fire_time", flat=True)[:1]
    )
    return found[0] if found else None


def claim(
    name: str,
    fire_time: datetime,
    *,
    using: str,
    trigger: str,
    run_id: int | None,
    next_fire_time: datetime | None,
) -> bool:
    """Move the task's last fire time to *fire_time*, unless it is there already.

    Return whether this call moved it: only the caller that did runs the firing. A claim
    computed from another trigger than the row's (an older deployment's) never succeeds.
    """
    updated = (
        ScheduledTask.objects.using(using)
        .filter(Q(last_fire_time__isnull=True) | Q(last_fire_time__lt=fire_time), name=name)
        .filter(trigger=trigger)
        .update(last_fire_time=fire_time, last_run_id=run_id, next_fire_time=next_fire_time)
    )
    return updated == 1


def take_run_request(name: str, requested_at: datetime, *, using: str) -> bool:
    """Clear the "run now" request made at *requested_at*; True for the caller that did."""
    manager = ScheduledTask.objects.using(using)
    return (
        manager.filter(name=name, run_requested_at=requested_at).update(run_requested_at=None) == 1
    )


def take_recovery(name: str, run_id: int, *, using: str) -> bool:
    """Clear the recovery of lost run *run_id*; True for the caller that did."""
    manager = ScheduledTask.objects.using(using)
    return manager.filter(name=name, recover_run_id=run_id).update(recover_run=None) == 1


def record_finish(
    name: str,
    *,
    using: str,
    seen_fire_time: datetime | None,
    finished_at: datetime | None,
    next_fire_time: datetime | None,
    run_id: int | None = None,
) -> bool:
    """Store when the task's run finished and when it fires next.

    The write is fenced: it happens only while the row's last fire time is still
    *seen_fire_time*, the one this run claimed (or saw, for a run without a claim). A run whose
    lock was taken over must not overwrite the state of the newer run. Return whether it did.
    """
    changes: dict[str, object] = {"next_fire_time": next_fire_time}
    if finished_at is not None:
        changes["last_finished_at"] = finished_at
    if run_id is not None:
        changes["last_run_id"] = run_id
    rows = ScheduledTask.objects.using(using).filter(name=name)
    if seen_fire_time is None:
        rows = rows.filter(last_fire_time__isnull=True)
    else:
        rows = rows.filter(last_fire_time=seen_fire_time)
    return rows.update(**changes) == 1


def read_lock_holder(name: str, *, using: str) -> tuple[datetime, str, datetime] | None:
    """Return (locked_at, locked_by, lock_until) of the lock of task *name*, if it has one."""
    return (
        TaskLock.objects.using(using)
        .filter(name=name)
        .values_list("locked_at", "locked_by", "lock_until")
        .first()
    )


def ensure_row(name: str, trigger: Trigger, *, now: datetime, using: str) -> None:
    """Create the row of *name* again if it was deleted while the scheduler ran."""
    try:
        ScheduledTask.objects.using(using).get_or_create(
            name=name,
            defaults={
                "kind": trigger.kind,
                "trigger": describe(trigger),
                "anchor": trigger.initial_anchor(now=now),
            },
        )
    except IntegrityError:
        pass  # created by another instance meanwhile
