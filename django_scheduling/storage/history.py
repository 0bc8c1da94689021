"""The run history: record runs, mark the ones that died, prune old ones."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.db.models import DateTimeField, Exists, F, OuterRef, Q, Value
from django.db.models.functions import Least

from ..models import RunStatus, ScheduledTask, TaskLock, TaskRun
from .sql import (
    DatabaseUtcNow,
    column,
    datetime_adapter,
    duration_adapter,
    duration_between,
    rows_of,
    timestamp_cast,
    update_from,
)

__all__ = [
    "record_start",
    "record_end",
    "record_starts",
    "record_ends",
    "Ended",
    "Start",
    "forget_start",
    "forget_starts",
    "flag_lock_lost",
    "record_rejection",
    "mark_interrupted",
    "mark_lost_runs",
    "prune",
    "PRUNE_BATCH_SIZE",
]

#: Rows deleted per statement, so that pruning never holds long locks on the table.
PRUNE_BATCH_SIZE = 1000


def record_start(
    *,
    using: str,
    task_name: str,
    fire_time: datetime | None,
    started: datetime,
    instance: str,
    recovery_of: int | None = None,
    locked_at: datetime | None = None,
    attempt: int = 1,
    timeout_at: datetime | None = None,
    missed: int = 0,
) -> int:
    """Record that a run started and return its id; *locked_at* names the lock acquisition
    it runs under, *attempt* which try of its fire time it is, *timeout_at* when it passes
    its timeout, *missed* how many fire times passed without a run just before its own."""
    run = TaskRun.objects.using(using).create(
        task_name=task_name,
        scheduled_at=fire_time,
        started_at=started,
        status=RunStatus.RUNNING,
        instance=instance,
        recovery_of_id=recovery_of,
        locked_at=locked_at,
        attempt=attempt,
        timeout_at=timeout_at,
        missed_count=missed,
    )
    return run.pk


class Start(NamedTuple):
    """A run that starts, as ``record_starts`` records it."""

    task_name: str
    fire_time: datetime | None
    locked_at: datetime | None
    timeout_at: datetime | None
    missed: int = 0
    recovery_of: int | None = None


def record_starts(*, using: str, instance: str, started: datetime, runs: list[Start]) -> list[int]:
    """Record that the runs *runs* started, in one statement per batch; return their ids in
    the same order."""
    conn = connections[using]
    if runs:
        as_rows = _insert_starts_as_rows(conn, instance, started, runs)
        if as_rows is not None:
            return as_rows
    returning = conn.features.can_return_rows_from_bulk_insert
    size = max(1, (conn.features.max_query_params or 10_000) // _START_PARAMS)
    ids: list[int] = []
    for first in range(0, len(runs), size):
        batch = runs[first : first + size]
        ids += _insert_starts(conn, instance, started, batch, returning=returning)
    return ids


#: The columns of a run's start that each row sends (``_insert_starts``)...
_START_COLUMNS = (
    "task_name",
    "scheduled_at",
    "started_at",
    "instance",
    "locked_at",
    "timeout_at",
    "missed_count",
    "recovery_of",
)
#: ...and those the same in every row and fixed by this code: written in the statement, not
#: sent as parameters (MySQLdb escapes each parameter in Python: a fifth of a claim's time).
_START_CONSTANTS = {
    "status": f"'{RunStatus.RUNNING.value}'",
    "error_type": "''",
    "error_message": "''",
    "traceback": "''",
    "output": "''",
    "lock_lost": "FALSE",
}
#: The parameters of one row of ``_insert_starts``.
_START_PARAMS = len(_START_COLUMNS)


def _insert_starts(
    conn: Any,
    instance: str,
    started: datetime,
    runs: list[Start],
    *,
    returning: bool,
) -> list[int]:
    # Written out rather than through bulk_create, whose per-field preparation costs more than
    # the statement for a thousand rows.
    meta = TaskRun._meta
    q = conn.ops.quote_name
    columns, constants = _START_COLUMNS, _START_CONSTANTS
    names = [*columns, *constants]
    column_sql = ", ".join(q(column(TaskRun, name)) for name in names)
    adapt = datetime_adapter(conn)
    row_sql = "(" + ", ".join(["%s"] * len(columns) + list(constants.values())) + ")"
    at = adapt(started)
    adapted: dict[datetime | None, Any] = {}  # the runs of a batch mostly share their times

    def once(value: datetime | None) -> Any:
        if value not in adapted:
            adapted[value] = adapt(value)
        return adapted[value]

    params: list[Any] = []
    for name, fire_time, locked_at, timeout_at, missed, recovery_of in runs:
        params += [name, once(fire_time), at, instance, once(locked_at)]
        params += [once(timeout_at), missed, recovery_of]
    pk = q(column(TaskRun, "id"))
    statement = f"INSERT INTO {q(meta.db_table)} ({column_sql}) VALUES "
    statement += ", ".join([row_sql] * len(runs))
    with conn.cursor() as cursor:
        if returning:
            cursor.execute(f"{statement} RETURNING {pk}", params)
            return [row[0] for row in cursor.fetchall()]
        cursor.execute(statement, params)
    # MySQL cannot return the ids of a multi-row INSERT: the instance name, the start and the
    # task name identify each run.
    found = dict(
        TaskRun.objects.using(conn.alias)
        .filter(
            instance=instance,
            started_at=started,
            status=RunStatus.RUNNING,
            task_name__in=[run[0] for run in runs],
        )
        .values_list("task_name", "pk")
    )
    return [found[run[0]] for run in runs]


def _insert_starts_as_rows(
    conn: Any, instance: str, started: datetime, runs: list[Start]
) -> list[int] | None:
    """``_insert_starts`` with the rows as a table parameter (``sql.rows_of``), one statement
    text whatever the batch's size; ``None`` on a database without one."""
    q = conn.ops.quote_name
    names = ", ".join(q(column(TaskRun, name)) for name in (*_START_COLUMNS, *_START_CONSTANTS))
    columns: list[list[Any]] = [[], [], [], [], [], []]
    for run in runs:
        for values, value in zip(columns, run, strict=True):
            values.append(value)
    found = rows_of(
        conn,
        ["text", "timestamptz", "timestamptz", "timestamptz", "integer", "bigint"],
        ["name", "fire", "locked", "timeout", "missed", "recovery"],
        columns,
    )
    if found is None or not conn.features.can_return_rows_from_bulk_insert:
        return None
    rows, rows_params = found
    cast = timestamp_cast(conn)
    constants = ", ".join(_START_CONSTANTS.values())
    statement = (
        f"INSERT INTO {q(TaskRun._meta.db_table)} ({names}) "
        f"SELECT v.name, v.fire, %s{cast}, %s, v.locked, v.timeout, v.missed, "
        f"v.recovery, {constants} FROM {rows} "
        f"RETURNING {q(column(TaskRun, 'id'))}, {q(column(TaskRun, 'task_name'))}"
    )
    with conn.cursor() as cursor:
        cursor.execute(statement, [datetime_adapter(conn)(started), instance, *rows_params])
        ids = dict((name, pk) for pk, name in cursor.fetchall())
    # By name: the rows come back in no promised order (a batch has a task once).
    return [ids[run.task_name] for run in runs]


@dataclass(slots=True)  # not frozen: one per run, and a frozen one is slower to create
class Ended:
    """How a run ended, to record."""

    run_id: int
    status: str
    #: When the task began: the duration counts from here. The row's ``started_at`` stays as
    #: its start recorded it (``record_starts``), see ``record_ends``.
    started: datetime
    finished: datetime
    error: tuple[str, str, str] = ("", "", "")
    #: An enqueued run: the engine's backend and the id of its result.
    backend: str = ""
    result_id: str = ""
    #: What a management command wrote (``tasks.commands``).
    output: str = ""


#: The ends one statement binds on SQLite (see ``record_ends``).
ENDS_PER_STATEMENT = 100


def record_ends(*, using: str, ends: list[Ended]) -> None:
    """Record how the runs *ends* ended: those without an error or output (successes,
    enqueues) in one statement per status and backend and batch, the others one by one.

    An end writes the status, the finish and the duration (from when the task began), and
    never moves ``started_at`` later: that stays the start recorded with the claim. Each of the
    table's four secondary indexes holds ``started_at``, and an end that moved it rewrote all
    four where the status moves two. At 10,000 tasks due every second on MariaDB x3, leaving it
    cut the server's share of the CPU from 56 to 48 % (see docs/benchmarks.md). Only an
    enqueued run may begin before its recorded start (claimed ahead of its instant and handed
    to its engine at once, with the instant to run at): its end moves the start back to when
    the enqueue began.
    """
    plain: dict[tuple[str, str], list[Ended]] = {}
    for end in ends:
        if any(end.error) or end.output:
            record_end(
                using=using,
                run_id=end.run_id,
                status=RunStatus(end.status),
                started=end.started,
                finished=end.finished,
                error=end.error,
                backend=end.backend,
                result_id=end.result_id,
                output=end.output,
            )
        else:
            plain.setdefault((str(end.status), end.backend), []).append(end)
    conn = connections[using]
    if conn.vendor == "sqlite":
        # Django's SQLite cursor keeps every row of an executemany() until it returns (it
        # peeks at the first through itertools.tee): the rows of one statement are held at
        # once. After an instant of 10,000 firings, 6,001 rows were (docs/benchmarks.md).
        size = ENDS_PER_STATEMENT
    else:
        size = max(1, (conn.features.max_query_params or 2000) // 12)
    for (status, backend), same in plain.items():
        for first in range(0, len(same), size):
            _record_plain(conn, status, backend, same[first : first + size])


def _record_plain(conn: Any, status: str, backend: str, ends: list[Ended]) -> None:
    """Record the ends *ends*, all of *status* and *backend* and without an error."""
    meta = TaskRun._meta
    q = conn.ops.quote_name
    pk, status_column, started, finished, duration, backend_column, result_column = (
        q(column(TaskRun, f))
        for f in ("id", "status", "started_at", "finished_at", "duration", "backend", "result_id")
    )
    if conn.vendor == "sqlite":
        # One text for every batch, run once per row (see sql.any_of): in-process, there
        # is no round trip to save by a statement per batch.
        adapt = datetime_adapter(conn)
        adapt_duration = duration_adapter(conn)
        assignments = f"{status_column} = %s, {finished} = %s, {duration} = %s"
        if backend:
            assignments += f", {backend_column} = %s, {result_column} = %s"
            assignments += f", {started} = MIN({started}, %s)"  # see record_ends
        each = [
            [
                status,
                adapt(end.finished),
                adapt_duration(end.finished - end.started),
                *([backend[:100], end.result_id[:255], adapt(end.started)] if backend else []),
                end.run_id,
            ]
            for end in ends
        ]
        with conn.cursor() as cursor:
            cursor.executemany(f"UPDATE {q(meta.db_table)} SET {assignments} WHERE {pk} = %s", each)
        return
    columns: list[list[Any]] = [
        [end.run_id for end in ends],
        [end.started for end in ends],
        [end.finished for end in ends],
        [end.result_id[:255] for end in ends],
    ]
    names = ["id", "started", "finished", "result"]
    rows = rows_of(conn, ["bigint", "timestamptz", "timestamptz", "text"], names, columns)
    if rows is None:
        # MySQL and MariaDB before 10.6: the rows as a derived table of one SELECT each. The
        # server matches each run once, where a CASE per column compared each run with every
        # WHEN; 100 ends took 2.0 ms that way on MariaDB 10.11, 1.1 ms joined.
        rows = _selected_rows(conn, names, columns)
    assignments_of = [
        (status_column, "%s"),
        (finished, "v.finished"),
        (duration, duration_between(conn, "v.started", "v.finished")),
    ]
    params: list[Any] = [status]
    if backend:
        assignments_of += [(backend_column, "%s"), (result_column, "v.result")]
        assignments_of.append((started, f"LEAST(t.{started}, v.started)"))  # see record_ends
        params.append(backend[:100])
    statement, params = update_from(
        conn, q(meta.db_table), rows, assignments_of, params, (f"t.{pk} = v.id", [])
    )
    with conn.cursor() as cursor:
        cursor.execute(statement, params)


def _selected_rows(conn: Any, names: list[str], columns: list[list[Any]]) -> tuple[str, list[Any]]:
    """Return the rows of *columns* as a derived table ``v`` of one ``SELECT`` per row, and
    its parameters (datetimes in the form *conn* stores)."""
    adapt = datetime_adapter(conn)
    first = "SELECT " + ", ".join(f"%s AS {name}" for name in names)
    rest = "SELECT " + ", ".join(["%s"] * len(names))
    selects = " UNION ALL ".join([first, *[rest] * (len(columns[0]) - 1)])
    params = [
        adapt(value) if isinstance(value, datetime) else value
        for row in zip(*columns, strict=True)
        for value in row
    ]
    return f"({selects}) AS v", params


def forget_start(*, using: str, run_id: int) -> None:
    """Delete the record of a run that did not start after all (its claim failed)."""
    forget_starts(using=using, run_ids=[run_id])


def forget_starts(*, using: str, run_ids: list[int]) -> None:
    """Delete the records of runs that did not start after all (their claims failed)."""
    with transaction.atomic(using=using):
        running = TaskRun.objects.using(using).filter(pk__in=run_ids, status=RunStatus.RUNNING)
        ids = list(running.values_list("pk", flat=True))
        if ids:
            _delete_runs(ids, using=using)


def record_end(
    *,
    using: str,
    run_id: int,
    status: RunStatus,
    started: datetime,
    finished: datetime,
    error: tuple[str, str, str] = ("", "", ""),
    lock_lost: bool = False,
    backend: str = "",
    result_id: str = "",
    output: str = "",
) -> None:
    """Record how a run ended; *error* is (exception type, message, traceback). An enqueued
    run names the engine's *backend* and the *result_id* it gave; a management command's run
    keeps its *output*.

    A run that housekeeping marked lost while it was in fact still running (its process was
    frozen, or cut off from the database) gets its real outcome here.
    """
    changes: dict[str, object] = {
        "status": status,
        "finished_at": finished,
        "duration": finished - started,
        "error_type": error[0][:255],
        "error_message": error[1],
        "traceback": error[2],
    }
    if output:
        changes["output"] = output
    if backend:
        changes["backend"] = backend[:100]
        changes["result_id"] = result_id[:255]
        # An enqueue claimed ahead began before its recorded start (see record_ends).
        changes["started_at"] = Least(F("started_at"), Value(started, DateTimeField()))
    if lock_lost:  # never cleared: the flag may have been set while the run went on
        changes["lock_lost"] = True
    TaskRun.objects.using(using).filter(pk=run_id).update(**changes)


def record_rejection(
    *,
    using: str,
    task_name: str,
    fire_time: datetime | None,
    now: datetime,
    instance: str,
    reason: str,
) -> None:
    """Record a firing that the pool did not run."""
    TaskRun.objects.using(using).create(
        task_name=task_name,
        scheduled_at=fire_time,
        started_at=now,
        finished_at=now,
        duration=timedelta(0),
        status=RunStatus.REJECTED,
        instance=instance,
        error_type="django_scheduling.pool.RejectedWork",
        error_message=reason,
    )


def mark_interrupted(*, using: str, run_ids: list[int], now: datetime) -> None:
    """Mark runs still going when a shutdown timed out."""
    if run_ids:
        TaskRun.objects.using(using).filter(pk__in=run_ids, status=RunStatus.RUNNING).update(
            status=RunStatus.INTERRUPTED, finished_at=now
        )


def flag_lock_lost(*, using: str, run_id: int) -> bool:
    """Flag a run whose lock expired or was taken over while it ran; return False when it
    was flagged already."""
    runs = TaskRun.objects.using(using).filter(pk=run_id, lock_lost=False)
    return runs.update(lock_lost=True) == 1


def mark_lost_runs(*, now: datetime, using: str) -> list[tuple[int, str, int | None]]:
    """Mark as lost the runs still "running" that no longer hold their task's lock, and
    return their (id, task name, id of the run they recovered).

    A live run keeps its lock alive. So a running run is dead once its lock has expired, or
    has been taken again since (the lock's ``locked_at`` is no longer the run's): a task that
    runs back to back holds its lock nearly all the time, so expiry alone would miss most
    deaths. Expiry is judged by the database's clock, as the locks are. Runs without a lock
    (``lock=False`` tasks) have nothing to tell and are left alone.
    """
    locks = TaskLock.objects.using(using).filter(name=OuterRef("task_name"))
    gone = locks.filter(Q(lock_until__lte=DatabaseUtcNow()) | ~Q(locked_at=OuterRef("locked_at")))
    lost = TaskRun.objects.using(using).filter(
        Exists(gone), status=RunStatus.RUNNING, locked_at__isnull=False
    )
    found: list[tuple[int, str, int | None]] = list(
        lost.values_list("pk", "task_name", "recovery_of_id")
    )
    if not found:
        return []
    TaskRun.objects.using(using).filter(
        pk__in=[pk for pk, _, _ in found], status=RunStatus.RUNNING
    ).update(
        status=RunStatus.LOST,
        finished_at=now,
        error_message="The run ended without recording a finish: its process died, froze or "
        "lost the database, and its lock expired or was taken by another instance.",
    )
    return found


def prune(*, older_than: datetime, using: str, batch_size: int = PRUNE_BATCH_SIZE) -> int:
    """Delete finished runs that started before *older_than*, in batches; return how many.

    Each batch, in one transaction: what points at its runs is cleared, as the links'
    ``SET_NULL`` says (a task's last run and run to recover, a recovery's run), then the runs
    are deleted by id. ``QuerySet.delete()`` would load every run whole first, to collect
    what points at it: 20,000 runs took 0.8-1.0 s that way.
    """
    conn = connections[using]
    size = min(batch_size, conn.features.max_query_params or batch_size)
    total = 0
    manager = TaskRun.objects.using(using)
    while True:
        batch = list(
            manager.filter(started_at__lt=older_than)
            .exclude(status=RunStatus.RUNNING)
            .order_by("started_at")
            .values_list("pk", flat=True)[:size]
        )
        if not batch:
            return total
        with transaction.atomic(using=using):
            total += _delete_runs(batch, using=using)


def _delete_runs(ids: list[int], *, using: str) -> int:
    """Delete the runs *ids* (in the caller's transaction) and return how many; first clear
    what points at them, as the links' ``SET_NULL`` says: a task's last run and run to
    recover, a recovery's run."""
    tasks = ScheduledTask.objects.using(using)
    # ``last_run`` has no index (every claim moves it): the tasks are found by a plain read,
    # then updated by name, so that no task row is locked but theirs (an UPDATE that scans
    # would lock every row it reads under REPEATABLE READ on MySQL).
    holding = list(tasks.filter(last_run__in=ids).values_list("name", flat=True))
    if holding:
        tasks.filter(name__in=holding, last_run__in=ids).update(last_run=None)
    tasks.filter(recover_run__in=ids).update(recover_run=None)
    TaskRun.objects.using(using).filter(recovery_of__in=ids).update(recovery_of=None)
    conn = connections[using]
    table = conn.ops.quote_name(TaskRun._meta.db_table)
    pk = conn.ops.quote_name(column(TaskRun, "id"))
    placeholders = ", ".join(["%s"] * len(ids))
    with conn.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {pk} IN ({placeholders})", ids)
        return int(cursor.rowcount)
