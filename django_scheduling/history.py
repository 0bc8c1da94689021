"""Keep the run history honest and bounded: mark runs that died, prune old ones."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef

from .models import RunStatus, TaskLock, TaskRun

__all__ = ["mark_lost_runs", "prune", "PRUNE_BATCH_SIZE"]

#: Rows deleted per statement, so that pruning never holds long locks on the table.
PRUNE_BATCH_SIZE = 1000


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
