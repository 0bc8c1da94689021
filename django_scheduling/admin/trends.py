"""Trends of a task's recent runs, for the admin: success rate, durations, failures in a row and
late starts.

Pure: the functions take the rows that ``recent_runs()`` or ``recent_runs_of()`` read (a few
columns, no model instances) and, where time matters, *now*; they are tested without a
database.

An engine task's firing ends when it is enqueued: an *enqueued* run is an ended, successful run
here, as for failure alerts (``alerts.failures_in_a_row()``) and metrics; how the worker's run
went is the engine's to report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections

from ..models import RunStatus, TaskRun

__all__ = [
    "CHART_RUNS",
    "SPARKLINE_RUNS",
    "LATE_START",
    "RUN_FIELDS",
    "RunPoint",
    "RunStats",
    "run_points",
    "run_stats",
    "failures_in_a_row",
    "percentile",
    "recent_runs",
    "recent_runs_of",
    "newest_runs_sql",
]

#: How many runs the chart on a task's page shows.
CHART_RUNS = 100
#: How many runs the sparkline of each task in the task list shows.
SPARKLINE_RUNS = 20
#: How many tasks one query of ``recent_runs_of()`` reads: SQLite allows 500 terms in a compound
#: SELECT. A page of the task list (100 tasks; 200 when it shows all) is one query.
NAMES_PER_QUERY = 250
#: A run is late when it started more than this after its fire time, beyond the task's jitter
#: (which delays firings on purpose).
LATE_START = timedelta(seconds=1)

#: The columns read of each run: (id, status, started_at, scheduled_at, duration, finished_at).
RUN_FIELDS = ("id", "status", "started_at", "scheduled_at", "duration", "finished_at")
RunRow = tuple[int, str, datetime, datetime | None, timedelta | None, datetime | None]

#: Statuses of runs that have not ended: not counted in the success rate or the durations.
IN_PROGRESS = frozenset({RunStatus.RUNNING.value})
#: Statuses of the runs that succeeded: an engine task's run succeeds when it is enqueued.
SUCCESSES = frozenset({RunStatus.SUCCEEDED.value, RunStatus.ENQUEUED.value})
#: Statuses that count as a failure of the task in "failures in a row".
FAILURES = frozenset({RunStatus.FAILED.value, RunStatus.TIMED_OUT.value, RunStatus.LOST.value})
#: Statuses that count neither way in "failures in a row": the task did not get to run.
NEUTRAL = frozenset({RunStatus.INTERRUPTED.value, RunStatus.REJECTED.value})


@dataclass(frozen=True, slots=True)
class RunPoint:
    """One run as the charts draw it."""

    id: int
    status: str
    #: When the task began (``task_began``).
    started_at: datetime
    #: How long it ran; for a run in progress, how long it has run so far (``None``: unknown,
    #: e.g. a lost run).
    duration: timedelta | None
    #: Start minus fire time; ``None`` for a manual run, which has no fire time.
    lateness: timedelta | None
    late: bool

    @property
    def in_progress(self) -> bool:
        return self.status in IN_PROGRESS


@dataclass(frozen=True, slots=True)
class RunStats:
    """What the runs of a chart add up to."""

    runs: int
    #: Runs that have ended (every status but running).
    finished: int
    #: Runs that succeeded or were enqueued.
    succeeded: int
    #: Succeeded runs among the finished ones, from 0 to 1; ``None`` when none has finished.
    success_rate: float | None
    p50: timedelta | None
    p95: timedelta | None
    #: Failed or lost runs since the newest run that ended otherwise (runs in progress are
    #: passed over).
    consecutive_failures: int
    late_starts: int


def task_began(
    status: str, started_at: datetime, duration: timedelta | None, finished_at: datetime | None
) -> datetime:
    """Return when a run's task began: once it has ended, its finish minus its duration (it may
    have waited for a pool thread after its start was recorded); otherwise, and for a run the
    pool rejected (its task never began), its recorded start."""
    if duration is None or finished_at is None or status == RunStatus.REJECTED:
        return started_at
    return finished_at - duration


def run_points(
    rows: Iterable[RunRow], *, now: datetime, late_after: timedelta = LATE_START
) -> list[RunPoint]:
    """Return the runs of *rows* (newest first, as read) oldest first, as the charts draw them.

    A run is late when the task began more than *late_after* after the fire time it served.
    """
    points = []
    for run_id, status, started_at, scheduled_at, duration, finished_at in rows:
        started_at = task_began(status, started_at, duration, finished_at)
        if duration is None and status in IN_PROGRESS:
            duration = max(now - started_at, timedelta(0))
        lateness = None if scheduled_at is None else started_at - scheduled_at
        late = lateness is not None and lateness > late_after
        points.append(RunPoint(run_id, status, started_at, duration, lateness, late))
    points.reverse()
    return points


def failures_in_a_row(points: Sequence[RunPoint]) -> int:
    """Return how many of the newest ended runs of *points* (oldest first) failed in a row:
    failed, timed out or lost runs since the newest that succeeded (or was enqueued);
    interrupted and rejected runs count neither way."""
    streak = 0
    for point in reversed(points):
        if point.in_progress or point.status in NEUTRAL:
            continue
        if point.status not in FAILURES:
            break
        streak += 1
    return streak


def run_stats(points: Sequence[RunPoint]) -> RunStats:
    """Return the success rate, the p50 and p95 durations of the ended runs, the failures in a
    row and the late starts of *points* (oldest first)."""
    ended = [p for p in points if not p.in_progress]
    succeeded = sum(1 for p in ended if p.status in SUCCESSES)
    durations = sorted(p.duration for p in ended if p.duration is not None)
    streak = failures_in_a_row(points)
    return RunStats(
        runs=len(points),
        finished=len(ended),
        succeeded=succeeded,
        success_rate=succeeded / len(ended) if ended else None,
        p50=percentile(durations, 0.50),
        p95=percentile(durations, 0.95),
        consecutive_failures=streak,
        late_starts=sum(1 for p in points if p.late),
    )


def percentile(ordered: Sequence[timedelta], fraction: float) -> timedelta | None:
    """Return the nearest-rank percentile *fraction* (0 to 1) of *ordered* (sorted), a value
    that occurred; ``None`` for no values."""
    if not ordered:
        return None
    rank = max(math.ceil(fraction * len(ordered)), 1)
    return ordered[rank - 1]


def recent_runs(name: str, *, using: str, limit: int = CHART_RUNS) -> list[RunRow]:
    """Return the *limit* newest runs of task *name*, newest first, in one query."""
    runs = TaskRun.objects.using(using).filter(task_name=name).order_by("-started_at", "-id")
    return list(runs.values_list(*RUN_FIELDS)[:limit])


def recent_runs_of(
    names: Sequence[str], *, using: str, limit: int = SPARKLINE_RUNS
) -> dict[str, list[RunRow]]:
    """Return the *limit* newest runs of each task of *names*, newest first, in one query (one
    per ``NAMES_PER_QUERY`` names).

    One ``SELECT ... WHERE task_name = %s ORDER BY started_at DESC LIMIT 20`` per task, joined by
    ``UNION ALL``: each reads at most *limit* rows of the index on (task_name, -started_at),
    however long the history (a ``ROW_NUMBER()`` window would number every run of the tasks).
    Each part is a derived table: SQLite allows no ``LIMIT`` on a part of a compound SELECT
    otherwise, and this form works on SQLite, MariaDB and PostgreSQL alike.
    """
    found: dict[str, list[RunRow]] = {name: [] for name in names}
    unique = list(found)
    for start in range(0, len(unique), NAMES_PER_QUERY):
        chunk = unique[start : start + NAMES_PER_QUERY]
        sql = newest_runs_sql(len(chunk), using=using, limit=limit)
        for run in TaskRun.objects.db_manager(using).raw(sql, chunk):
            found[run.task_name].append(tuple(getattr(run, field) for field in RUN_FIELDS))
    for rows in found.values():
        rows.sort(key=lambda run: (run[2], run[0]), reverse=True)  # UNION ALL keeps no order
    return found


def newest_runs_sql(tasks: int, *, using: str, limit: int) -> str:
    """Return the SQL of ``recent_runs_of()`` for *tasks* task names, given as parameters."""
    quote = connections[using].ops.quote_name
    opts = TaskRun._meta
    wanted = ("task_name", *RUN_FIELDS)
    column = {f.name: quote(f.column or f.name) for f in opts.concrete_fields if f.name in wanted}
    column = {name: column[name] for name in wanted}
    part = (
        f"SELECT {', '.join(column.values())} FROM {quote(opts.db_table)}"
        f" WHERE {column['task_name']} = %s"
        f" ORDER BY {column['started_at']} DESC, {column['id']} DESC LIMIT {int(limit)}"
    )
    return " UNION ALL ".join(f"SELECT * FROM ({part}) t{index}" for index in range(tasks))
