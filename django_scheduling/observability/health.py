"""What the health endpoint and ``manage.py scheduling_status --json`` report, and the
heartbeats of scheduler instances.

Each running scheduler writes a heartbeat (its ``SchedulerInstance`` row) every
``HEARTBEAT_INTERVAL``, and removes it when it stops cleanly. An instance is **alive** when its
last heartbeat is at most three intervals old; one that died (killed, frozen, cut off) stays in
the report, not alive, for ``DEAD_SHOWN_FOR``. **No scheduler** is reported
(``"scheduler_missing": true``) when some task is waiting for a fire time (not paused, removed
or done) and no instance is alive. That alone does not make the report fail: only overdue tasks
(see ``monitoring``) do (``"ok": false``), because a restart or a deploy leaves no instance
alive for a moment without any task being late.

The report comes in two sizes: ``public()`` says whether all is well and how many tasks are
overdue, for anyone; ``report()`` adds the names of the tasks and of the instances (hosts,
pids), for a holder of ``HEALTH_TOKEN`` or a staff user.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from ..checks import scheduler_errors
from ..models import ScheduledTask, SchedulerInstance
from .monitoring import overdue_tasks

__all__ = ["ALIVE_INTERVALS", "DEAD_SHOWN_FOR", "public", "report"]

logger = logging.getLogger(__name__)

#: An instance is alive while its last heartbeat is at most this many intervals old.
ALIVE_INTERVALS = 3
#: An instance that stopped without removing its heartbeat (it died) is listed this long.
DEAD_SHOWN_FOR = timedelta(minutes=10)


def public(full: dict[str, Any]) -> dict[str, Any]:
    """Return what anyone may read of the report *full*: whether all is well, how many tasks
    are overdue and how many configuration errors there are, and whether the database could be
    read; no names, hosts or times."""
    keep = ("ok", "overdue_count", "configuration_errors", "database_unavailable", "error")
    return {key: full[key] for key in keep if key in full}


def report(
    *, now: datetime, overdue_after: timedelta, heartbeat_interval: timedelta, using: str
) -> dict[str, Any]:
    """Return the health report: the overdue tasks (and why each is), the instances and
    whether one is alive.

    The report names tasks and instances and gives times; nothing else (no arguments, no
    errors of runs). A mistake in the tasks or settings that stops the scheduler gives
    ``{"ok": false, "configuration_errors": N, "problems": [...]}`` instead.
    """
    errors = scheduler_errors()
    if errors:
        return {
            "ok": False,
            "configuration_errors": len(errors),
            "problems": [{"id": error.id, "message": error.msg} for error in errors],
        }
    tasks = list(overdue_tasks(now=now, overdue_after=overdue_after, using=using))
    alive_after = now - heartbeat_interval * ALIVE_INTERVALS
    shown = SchedulerInstance.objects.using(using).filter(
        last_seen__gte=min(alive_after, now - DEAD_SHOWN_FOR)
    )
    instances = [
        {
            "name": instance.name,
            "host": instance.host,
            "pid": instance.pid,
            "started_at": instance.started_at.isoformat(),
            "last_seen": instance.last_seen.isoformat(),
            "alive": instance.last_seen >= alive_after,
            "outbox_pending": instance.outbox_pending,
            "outbox_set_aside": instance.outbox_set_aside,
        }
        for instance in shown.order_by("-last_seen", "name")
    ]
    waiting = ScheduledTask.objects.using(using).filter(
        removed_at__isnull=True, paused=False, next_fire_time__isnull=False
    )
    missing = not any(instance["alive"] for instance in instances) and waiting.exists()
    return {
        "ok": not tasks,
        "checked_at": now.isoformat(),
        "overdue_after_seconds": overdue_after.total_seconds(),
        "overdue_count": len(tasks),
        "overdue": [
            {
                "name": task.name,
                "trigger": task.trigger,
                "reason": task.overdue_reason,
                "next_fire_time": _iso(task.next_fire_time),
                "late_seconds": _late(task.next_fire_time, now),
            }
            for task in tasks
        ],
        "instances": instances,
        "scheduler_missing": missing,
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _late(due: datetime | None, now: datetime) -> float:
    """How late *due* is at *now*, in seconds: 0 for a time still to come (a run that timed
    out before its next fire time)."""
    if due is None:
        return 0.0
    return round(max((now - due).total_seconds(), 0.0), 3)


def due_at(task: ScheduledTask) -> datetime | None:
    """Return an overdue task's next fire time (``None`` for a one-shot whose run timed out)."""
    return task.next_fire_time
