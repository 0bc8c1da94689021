"""The run history: record runs, mark the ones that died, prune old ones."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef

from .models import RunStatus, TaskLock, TaskRun

__all__ = [
    "record_start",
    "record_end",
    "record_rejection",
    "mark_interrupted",
    "mark_lost_runs",
    "prune",
    "PRUNE_BATCH_SIZE",
]

#: Rows deleted per statement, so that pruning never holds long locks on the table.
PRUNE_BATCH_SIZE = 1000


def record_start(
    *, using: str, task_name: str, fire_time: datetime | None, started: datetime, instance: str
) -> int:
    """Record that a run started and return its id."""
    run = TaskRun.objects.using(using).create(
        task_name=task_name,
        scheduled_at=fire_time,
        started_at=started,
        status=RunStatus.RUNNING,
        instance=instance,
    )
    return run.pk


def record_end(
    *,
    using: str,
    run_id: int,
    status: RunStatus,
    started: datetime,
    finished: datetime,
    error: tuple[str, str, str] = ("", "", ""),
) -> None:
    """Record how a run ended; *error* is (exception type, message, traceback)."""
    TaskRun.objects.using(using).filter(pk=run_id).update(
        status=status,
        finished_at=finished,
        duration=finished - started,
        error_type=error[0][:255],
        error_message=error[1],
        traceback=error[2],
    )


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


def mark_lost_runs(*, now: datetime, using: str) -> int:
    """Mark as lost the runs still "running" whose task lock has expired.

    A live run keeps its lock alive, so a running run whose lock has expired belongs to a
    process that died without a chance to finish. Runs of tasks with ``lock=False`` have no
    lock to tell and are left alone.
    """
    expired = TaskLock.objects.using(using).filter(name=OuterRef("task_name"), lock_until__lte=now)
    free_since_start = expired.filter(lock_until__gt=OuterRef("started_at"))
    lost = TaskRun.objects.using(using).filter(
        Exists(free_since_start), status=RunStatus.RUNNING, started_at__lt=now
    )
    return lost.update(
        status=RunStatus.LOST,
        finished_at=now,
        error_message="The run ended without recording a finish: its process stopped or lost "
        "the database, and its lock expired.",
    )


def prune(*, older_than: datetime, using: str, batch_size: int = PRUNE_BATCH_SIZE) -> int:
    """Delete finished runs that started before *older_than*, in batches; return how many."""
    total = 0
    manager = TaskRun.objects.using(using)
    while True:
        batch = list(
            manager.filter(started_at__lt=older_than)
            .exclude(status=RunStatus.RUNNING)
            .order_by("started_at")
            .values_list("pk", flat=True)[:batch_size]
        )
        if not batch:
            return total
        total += manager.filter(pk__in=batch).delete()[0]
