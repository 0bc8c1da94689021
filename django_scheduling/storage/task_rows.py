"""The per-task state row (``ScheduledTask``): kept in step with the code, read and claimed by
the scheduler, shown by the admin.

Every function here is one or two statements on ``SCHEDULING['DATABASE']``, in autocommit, for
one task (``batch_rows`` serves a whole batch). The writes that decide who runs what are
conditional updates whose row count is the answer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections
from django.db.models import Q

from ..models import ScheduledTask, TaskLock
from ..schedules.decisions import TaskRow
from ..schedules.triggers import Trigger, TriggerState
from .sql import (
    column,
    datetime_adapter,
    timestamp_cast,
)

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
    "Holder",
]


def _state(row: ScheduledTask) -> TriggerState:
    return TriggerState(
        anchor=row.anchor, last_fire_time=row.last_fire_time, last_finished=row.last_finished_at
    )


_SYNC_FIELDS = (
    "name",
    "kind",
    "trigger",
    "removed_at",
    "anchor",
    "last_fire_time",
    "last_finished_at",
)
#: Rows written per statement at start-up.
_CHUNK = 500


def sync_tasks(
    tasks: Iterable[tuple[str, Trigger]],
    *,
    now: datetime,
    using: str,
    complete: bool,
    afresh: Collection[str] = (),
) -> dict[str, TriggerState]:
    """Create or update the rows of *tasks* and return each one's state.

    The tasks named in *afresh* whose rows are marked removed (a schedule in the database
    disabled, deleted or wrong, and back) start afresh too: the fire times they missed while
    they were gone are not run. Only the first instance to bring a row back resets it.

    A changed trigger starts afresh, as a new task would: a new anchor, and no last fire time,
    so that no fire time of the old trigger, and none from before the change, is run (or
    counted as missed). Claims name the trigger they were computed from, so an instance still
    running the old trigger can no longer claim a fire time. With *complete* (every task of
    the code is in *tasks*), rows of tasks no longer in the code are marked removed.

    The rows are read as tuples, and written in batches: ten thousand tasks start in a few
    dozen statements, without a model instance per task. Instances that start together write
    the same rows at once: every statement here takes its rows' locks in the order of their
    names, so that none of them waits for a row held by another that waits for one of its own
    (a deadlock).
    """
    tasks = sorted(tasks, key=lambda task: task[0])
    manager = ScheduledTask.objects.using(using)
    q = connections[using].ops.quote_name
    states: dict[str, TriggerState] = {}
    # Tasks declared alike share their state's values and, when equal, the state itself: a
    # scheduler holds one state per task for as long as it runs.
    shared: dict[Any, Any] = {}
    removed_again: list[str] = []
    # In batches: what is read for one batch is freed before the next, so the rows of ten
    # thousand tasks are never in memory at once (the memory they would leave fragmented).
    for first in range(0, len(tasks), _CHUNK):
        batch = tasks[first : first + _CHUNK]
        names = [name for name, _ in batch]

        rows = _read_rows_to_sync(manager, names)
        missing = [(name, trigger) for name, trigger in batch if name not in rows]
        if missing:
            # Another instance may create the same rows at the same moment: its rows win. Both
            # insert in the order of the names, so each waits for the other's first new key
            # before it holds one the other wants.
            manager.bulk_create(
                [
                    ScheduledTask(
                        name=name,
                        kind=trigger.kind,
                        trigger=describe(trigger),
                        anchor=trigger.initial_anchor(now=now),
                    )
                    for name, trigger in missing
                ],
                ignore_conflicts=True,
            )
            rows = _read_rows_to_sync(manager, names)
        for name, trigger in batch:
            _, kind, stored, removed_at, anchor, last_fire, last_finished = rows[name]
            described = describe(trigger)
            changed = stored != described or kind != trigger.kind
            if changed or (removed_at is not None and name in afresh):
                anchor, last_fire, last_finished = trigger.initial_anchor(now=now), None, None
                row = manager.filter(name=name)
                if not changed:  # back: only if no other instance brought it back first
                    row = row.filter(removed_at__isnull=False)
                if not row.update(
                    trigger=described,
                    kind=trigger.kind,
                    anchor=anchor,
                    last_fire_time=None,
                    last_finished_at=None,
                    next_fire_time=None,
                    removed_at=None,
                ):
                    _, _, _, _, anchor, last_fire, last_finished = _read_rows_to_sync(
                        manager, [name]
                    )[name]
            elif removed_at is not None:
                removed_again.append(name)
            key: tuple[Any, Any, Any] = tuple(
                shared.setdefault(value, value) for value in (anchor, last_fire, last_finished)
            )
            if (state := shared.get(key)) is None:
                state = shared[key] = TriggerState(*key)
            states[name] = state
    removed = q(column(ScheduledTask, "removed_at"))
    for first in range(0, len(removed_again), _CHUNK):
        _update_in_order(using, removed_again[first : first + _CHUNK], f"{removed} = NULL", [])
    if complete:
        declared = {name for name, _ in tasks}
        present = manager.filter(removed_at=None).values_list("name", flat=True).iterator()
        mark_removed([name for name in present if name not in declared], now=now, using=using)
    return states


def mark_removed(names: list[str], *, now: datetime, using: str) -> None:
    """Mark the rows of *names* removed at *now*: no scheduler runs them any more."""
    removed = connections[using].ops.quote_name(column(ScheduledTask, "removed_at"))
    now_value = datetime_adapter(connections[using])(now)
    names = sorted(names)
    for first in range(0, len(names), _CHUNK):
        _update_in_order(using, names[first : first + _CHUNK], f"{removed} = %s", [now_value])


def _read_rows_to_sync(manager: Any, names: list[str]) -> dict[str, tuple[Any, ...]]:
    found = manager.filter(name__in=names).order_by().values_list(*_SYNC_FIELDS)
    return {row[0]: row for row in found}


def _update_in_order(using: str, names: list[str], assignments: str, params: list[Any]) -> None:
    """Set *assignments* (SQL, with *params*) on the rows of *names*, in one statement that
    locks the rows in the order of their names.

    A plain ``UPDATE ... WHERE name IN (...)`` locks rows in the order its scan meets them:
    on PostgreSQL their place in the table, which every update moves. Two instances updating
    the same rows could then each hold a row the other waits for. The claims lock rows by
    name too (``claimable``).
    """
    conn = connections[using]
    q = conn.ops.quote_name
    table, name = q(ScheduledTask._meta.db_table), q(column(ScheduledTask, "name"))
    marks = ", ".join(["%s"] * len(names))
    if conn.vendor == "postgresql":  # locked by the subquery, after its sort
        where = (
            f"{name} IN (SELECT {name} FROM {table} WHERE {name} IN ({marks}) "
            f"ORDER BY {name} FOR UPDATE)"
        )
    elif conn.vendor == "mysql":
        where = f"{name} IN ({marks}) ORDER BY {name}"
    else:  # SQLite: a writer holds the whole database
        where = f"{name} IN ({marks})"
    with conn.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {assignments} WHERE {where}", [*params, *names])


def publish_next_fire_times(times: dict[str, datetime | None], *, using: str) -> None:
    """Store the next fire times the scheduler computed at start, for the admin: one
    statement per distinct time and batch of names, locking its rows by name."""
    conn = connections[using]
    adapt = datetime_adapter(conn)
    target = conn.ops.quote_name(column(ScheduledTask, "next_fire_time"))
    cast = timestamp_cast(conn)
    if len(set(times.values())) * 20 > len(times):  # mostly distinct times (jitter): a CASE
        items = sorted(times.items(), key=lambda item: item[0])
        name = conn.ops.quote_name(column(ScheduledTask, "name"))
        for first in range(0, len(items), _CHUNK):
            batch = items[first : first + _CHUNK]
            cases = " ".join(["WHEN %s THEN %s"] * len(batch))
            params = [value for n, when in batch for value in (n, adapt(when))]
            assignment = f"{target} = (CASE {name} {cases} END){cast}"
            _update_in_order(using, [n for n, _ in batch], assignment, params)
        return
    by_time: dict[datetime | None, list[str]] = {}
    for name, when in sorted(times.items(), key=lambda item: item[0]):
        by_time.setdefault(when, []).append(name)
    for when, names in by_time.items():
        for first in range(0, len(names), _CHUNK):
            group = names[first : first + _CHUNK]
            _update_in_order(using, group, f"{target} = %s{cast}", [adapt(when)])


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


Holder = tuple[datetime, str, datetime]
