"""What the health endpoint and ``manage.py scheduling_status --json`` report, and the
heartbeats of scheduler instances.

Each running scheduler writes a heartbeat (its ``SchedulerInstance`` row) every
``HEARTBEAT_INTERVAL``. An instance is **alive** when its last heartbeat is at most three
intervals old. **No scheduler** is reported (``"scheduler_missing": true``) when some task is
waiting for a fire time (not paused, removed or done) and no instance is alive. That alone does
not make the report fail: only overdue tasks do (``"ok": false``), because a restart or a deploy
leaves no instance alive for a moment without any task being late.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError

from .checks import scheduler_errors
from .models import ScheduledTask, SchedulerInstance
from .monitoring import overdue_tasks

__all__ = [
    "ALIVE_INTERVALS",
    "INSTANCE_RETENTION",
    "beat",
    "forget_old_instances",
    "report",
]

logger = logging.getLogger(__name__)

#: An instance is alive while its last heartbeat is at most this many intervals old.
ALIVE_INTERVALS = 3
#: Rows of instances not seen for this long are deleted.
INSTANCE_RETENTION = timedelta(days=1)


def beat(*, name: str, host: str, started_at: datetime, now: datetime, using: str) -> None:
    """Record that instance *name* is alive at *now*."""
    instances = SchedulerInstance.objects.using(using)
    if instances.filter(name=name).update(last_seen=now):
        return
    try:
        instances.create(
            name=name, host=host, pid=os.getpid(), started_at=started_at, last_seen=now
        )
    except IntegrityError:  # created meanwhile by an earlier beat that was thought lost
        instances.filter(name=name).update(last_seen=now)


def forget_old_instances(*, now: datetime, using: str) -> int:
    """Delete the rows of instances not seen for ``INSTANCE_RETENTION``; return how many."""
    old = SchedulerInstance.objects.using(using).filter(last_seen__lt=now - INSTANCE_RETENTION)
    return old.delete()[0]


def report(
    *, now: datetime, overdue_after: timedelta, heartbeat_interval: timedelta, using: str
) -> dict[str, Any]:
    """Return the health report: the overdue tasks, the instances and whether one is alive.

    The report names tasks and instances and gives times; nothing else (no arguments, no
    errors). A mistake in the tasks or settings that stops the scheduler gives
    ``{"ok": false, "problems": [...]}`` instead.
    """
    errors = scheduler_errors()
    if errors:
        return {
            "ok": False,
            "problems": [{"id": error.id, "message": error.msg} for error in errors],
        }
    tasks = list(overdue_tasks(now=now, overdue_after=overdue_after, using=using))
    alive_after = now - heartbeat_interval * ALIVE_INTERVALS
    instances = [
        {
            "name": instance.name,
            "host": instance.host,
            "pid": instance.pid,
            "started_at": instance.started_at.isoformat(),
            "last_seen": instance.last_seen.isoformat(),
            "alive": instance.last_seen >= alive_after,
        }
        for instance in SchedulerInstance.objects.using(using).order_by("-last_seen", "name")
    ]
    waiting = ScheduledTask.objects.using(using).filter(
        removed_at__isnull=True, paused=False, next_fire_time__isnull=False
    )
    missing = not any(instance["alive"] for instance in instances) and waiting.exists()
    return {
        "ok": not tasks,
        "checked_at": now.isoformat(),
        "overdue_after_seconds": overdue_after.total_seconds(),
        "overdue": [
            {
                "name": task.name,
                "trigger": task.trigger,
                "next_fire_time": due_at(task).isoformat(),
                "late_seconds": round((now - due_at(task)).total_seconds(), 3),
            }
            for task in tasks
        ],
        "instances": instances,
        "scheduler_missing": missing,
    }


def due_at(task: ScheduledTask) -> datetime:
    """Return an overdue task's next fire time, which ``overdue_tasks()`` requires to be set."""
    assert task.next_fire_time is not None
    return task.next_fire_time
