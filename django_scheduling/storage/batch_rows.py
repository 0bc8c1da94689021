"""A batch's reads and writes of the task rows (``ScheduledTask``): one statement each for the
whole batch, inside its transaction. ``task_rows`` serves one task at a time.

The writes that decide who runs what are conditional updates whose row count is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Q

from ..models import ScheduledTask, TaskLock, TaskRun
from ..schedules.decisions import TaskRow
from ..schedules.triggers import TriggerState
from .sql import (
    any_of,
    column,
    datetime_adapter,
    datetime_as_text,
    datetime_reader,
    rows_of,
    update_from,
)
from .task_rows import Holder

__all__ = ["Rows", "read_rows", "claim_many", "note_runs", "claimable", "read_claims"]


@dataclass(frozen=True)
class Rows:
    """What ``read_rows`` found: the database's clock (``None`` on SQLite), the task rows
    that exist, and the (locked_at, locked_by, lock_until) of the lock rows that exist."""

    now: datetime | None
    rows: dict[str, TaskRow]
    locks: dict[str, Holder]


_DATABASE_NOW = {"mysql": "UTC_TIMESTAMP(6)", "postgresql": "now()"}


def read_rows(names: list[str], *, using: str) -> Rows:
    """Return the rows of *names*, their locks' rows and the database's clock, in one
    statement."""
    conn = connections[using]
    q = conn.ops.quote_name
    task, run, lock = ScheduledTask._meta, TaskRun._meta, TaskLock._meta

    def qualified(meta: Any, field: str, table: str) -> str:
        name = f"{table}.{q(column(meta.model, field))}"
        if meta.get_field(field).get_internal_type() == "DateTimeField":
            # As text: the values of a burst mostly repeat, and are parsed here once each
            # (``aware``), not once per row by the driver.
            return datetime_as_text(conn, name)
        return name

    fields = [qualified(task, f, "t") for f in ("name", "anchor", "last_fire_time")]
    fields += [qualified(task, f, "t") for f in ("last_finished_at", "paused", "trigger")]
    fields += [qualified(task, f, "t") for f in ("run_requested_at", "last_run", "recover_run")]
    fields += [qualified(run, "scheduled_at", "r")]
    fields += [qualified(lock, f, "l") for f in ("locked_at", "locked_by", "lock_until")]
    database_now = _DATABASE_NOW.get(conn.vendor)
    if database_now is not None:
        fields.append(datetime_as_text(conn, database_now))
    statement = (
        f"SELECT {', '.join(fields)} FROM {q(task.db_table)} t "
        f"LEFT JOIN {q(run.db_table)} r ON r.{q(column(TaskRun, 'id'))} = "
        f"{qualified(task, 'recover_run', 't')} "
        f"LEFT JOIN {q(lock.db_table)} l "
        f"ON {qualified(lock, 'name', 'l')} = {qualified(task, 'name', 't')} "
    )
    among, params = any_of(conn, qualified(task, "name", "t"), names)
    with conn.cursor() as cursor:
        cursor.execute(f"{statement}WHERE {among}", params)
        found = cursor.fetchall()
    # The tasks of a burst mostly share their times: each distinct value is converted once
    # (see ``datetime_reader``), and tasks in the same state share one TriggerState.
    aware = datetime_reader(conn)
    states: dict[tuple[Any, Any, Any], TriggerState] = {}
    rows: dict[str, TaskRow] = {}
    holders: dict[str, Holder] = {}
    now: datetime | None = None
    for values in found:
        name, anchor, last_fire, last_finished, paused, trigger, requested, last_run = values[:8]
        recover, fire, held_at, held_by, held_until = values[8:13]
        if held_by is not None:
            holders[name] = (aware(held_at), held_by, aware(held_until))  # type: ignore[assignment]
        if database_now is not None:
            now = aware(values[13])
        key = (anchor, last_fire, last_finished)
        if (shared := states.get(key)) is None:
            shared = states[key] = TriggerState(
                aware(anchor), aware(last_fire), aware(last_finished)
            )
        rows[name] = TaskRow(
            shared,
            bool(paused),
            trigger,
            aware(requested),
            last_run,
            recover,
            aware(fire),
        )
    return Rows(now, rows, holders)


def _per_row(name: str, names: list[str], values: list[Any]) -> tuple[str, list[Any]]:
    """Return the SQL and parameters of a column set to *values*, one per row of *names* (the
    quoted name column *name*): one value for all rows when they share it (a burst on one
    trigger), else a CASE."""
    if all(value == values[0] for value in values):
        return "%s", [values[0]]
    cases = " ".join(["WHEN %s THEN %s"] * len(names))
    params = [item for pair in zip(names, values, strict=True) for item in pair]
    return f"CASE {name} {cases} END", params


def claim_many(
    fire_time: datetime,
    claims: list[tuple[str, str, int | None, datetime | None]],
    *,
    using: str,
) -> int:
    """Claim *fire_time* for each (name, trigger, run id, next fire time) of *claims*, in one
    statement, as ``claim()`` does for one; return how many rows it moved.

    When that is fewer than the claims, ``read_claims`` tells which ones are the caller's.
    """
    if not claims:
        return 0
    conn = connections[using]
    q = conn.ops.quote_name
    meta = ScheduledTask._meta
    columns = {f: q(column(ScheduledTask, f)) for f in ("name", "trigger", "last_fire_time")}
    run_column = q(column(ScheduledTask, "last_run"))
    next_column = q(column(ScheduledTask, "next_fire_time"))
    adapt = datetime_adapter(conn)
    value = adapt(fire_time)
    name = columns["name"]
    names = [claim[0] for claim in claims]
    found = rows_of(
        conn,
        ["text", "text", "bigint", "timestamptz"],
        ["name", "trigger", "run", "next"],
        [names, [c[1] for c in claims], [c[2] for c in claims], [c[3] for c in claims]],
        compares_text=True,
    )
    params: list[Any]
    if found is not None:  # one statement text whatever the batch's size
        last = f"t.{columns['last_fire_time']}"
        statement, params = update_from(
            conn,
            q(meta.db_table),
            found,
            [(columns["last_fire_time"], "%s"), (run_column, "v.run"), (next_column, "v.next")],
            [value],
            (
                f"t.{name} = v.name AND t.{columns['trigger']} = v.trigger "
                f"AND ({last} IS NULL OR {last} < %s)",
                [value],
            ),
        )
    else:
        run_sql, run_params = _per_row(name, names, [c[2] for c in claims])
        next_sql, next_params = _per_row(name, names, [adapt(c[3]) for c in claims])
        trigger_sql, trigger_params = _per_row(name, names, [c[1] for c in claims])
        statement = (
            f"UPDATE {q(meta.db_table)} SET {columns['last_fire_time']} = %s, "
            f"{run_column} = {run_sql}, {next_column} = {next_sql} "
            f"WHERE {name} IN ({', '.join(['%s'] * len(claims))}) "
            f"AND {columns['trigger']} = {trigger_sql} "
            f"AND ({columns['last_fire_time']} IS NULL OR {columns['last_fire_time']} < %s)"
        )
        params = [value, *run_params, *next_params, *names, *trigger_params, value]
    with conn.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.rowcount


def note_runs(runs: list[tuple[str, int | None, datetime | None]], *, using: str) -> None:
    """Store, for each (name, run id, next fire time) of *runs*, the run and when its task fires
    next, in one statement: the runs of tasks with ``lock=False``, which claim no fire time (each
    instance keeps its own schedule)."""
    if not runs:
        return
    conn = connections[using]
    q = conn.ops.quote_name
    adapt = datetime_adapter(conn)
    name = q(column(ScheduledTask, "name"))
    names = [run[0] for run in runs]
    run_column = q(column(ScheduledTask, "last_run"))
    next_column = q(column(ScheduledTask, "next_fire_time"))
    found = rows_of(
        conn,
        ["text", "bigint", "timestamptz"],
        ["name", "run", "next"],
        [names, [run[1] for run in runs], [run[2] for run in runs]],
        compares_text=True,
    )
    if found is not None:  # one statement text whatever the batch's size
        statement, params = update_from(
            conn,
            q(ScheduledTask._meta.db_table),
            found,
            [(run_column, "v.run"), (next_column, "v.next")],
            [],
            (f"t.{name} = v.name", []),
        )
    else:
        run_sql, run_params = _per_row(name, names, [run[1] for run in runs])
        next_sql, next_params = _per_row(name, names, [adapt(run[2]) for run in runs])
        statement = (
            f"UPDATE {q(ScheduledTask._meta.db_table)} "
            f"SET {run_column} = {run_sql}, {next_column} = {next_sql} "
            f"WHERE {name} IN ({', '.join(['%s'] * len(runs))})"
        )
        params = [*run_params, *next_params, *names]
    with conn.cursor() as cursor:
        cursor.execute(statement, params)


def claimable(
    fire_time: datetime, claims: list[tuple[str, str, int | None, datetime | None]], *, using: str
) -> set[str]:
    """Return the names of *claims* (name, trigger, ...) that ``claim_many`` would claim now,
    and lock their rows until the caller's transaction ends, so that it does.

    For claims that carry no run id (the history off), which cannot be told apart afterwards.
    """
    conn = connections[using]
    rows = (
        ScheduledTask.objects.using(using)
        .filter(name__in=[name for name, _, _, _ in claims])
        .filter(Q(last_fire_time__isnull=True) | Q(last_fire_time__lt=fire_time))
        .order_by("name")
    )
    if conn.features.has_select_for_update:  # SQLite: the transaction holds the database
        rows = rows.select_for_update()
    triggers = {name: trigger for name, trigger, _, _ in claims}
    return {
        name for name, trigger in rows.values_list("name", "trigger") if triggers[name] == trigger
    }


def read_claims(names: list[str], *, using: str) -> dict[str, tuple[datetime | None, int | None]]:
    """Return the (last fire time, last run id) of the rows of *names* (not empty), in one
    statement, as ``read_rows``: the instances that meet on a burst ask this for most of its
    firings."""
    conn = connections[using]
    q = conn.ops.quote_name
    name = q(column(ScheduledTask, "name"))
    fire = datetime_as_text(conn, q(column(ScheduledTask, "last_fire_time")))
    among, params = any_of(conn, name, names)
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT {name}, {fire}, {q(column(ScheduledTask, 'last_run'))} "
            f"FROM {q(ScheduledTask._meta.db_table)} WHERE {among}",
            params,
        )
        found = cursor.fetchall()
    read = datetime_reader(conn)
    return {task: (read(value), run) for task, value, run in found}
