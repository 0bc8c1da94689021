"""The heartbeats of scheduler instances: one ``SchedulerInstance`` row each, written every
``HEARTBEAT_INTERVAL`` by its maintenance thread and removed when it stops cleanly."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from django.db import IntegrityError

from ..models import SchedulerInstance

__all__ = ["INSTANCE_RETENTION", "beat", "forget_instance", "forget_old_instances"]

#: Rows of instances not seen for this long are deleted.
INSTANCE_RETENTION = timedelta(days=1)


def beat(
    *,
    name: str,
    host: str,
    started_at: datetime,
    now: datetime,
    using: str,
    outbox_pending: int = 0,
    outbox_set_aside: int = 0,
) -> None:
    """Record that instance *name* is alive at *now*, with its outbox's figures."""
    instances = SchedulerInstance.objects.using(using)
    state = {
        "last_seen": now,
        "outbox_pending": outbox_pending,
        "outbox_set_aside": outbox_set_aside,
    }
    if instances.filter(name=name).update(**state):
        return
    try:
        instances.create(name=name, host=host, pid=os.getpid(), started_at=started_at, **state)
    except IntegrityError:  # created meanwhile by an earlier beat that was thought lost
        instances.filter(name=name).update(**state)


def forget_instance(*, name: str, using: str) -> None:
    """Remove the heartbeat of instance *name*, which has stopped."""
    SchedulerInstance.objects.using(using).filter(name=name).delete()


def forget_old_instances(*, now: datetime, using: str) -> int:
    """Delete the rows of instances not seen for ``INSTANCE_RETENTION``; return how many."""
    old = SchedulerInstance.objects.using(using).filter(last_seen__lt=now - INSTANCE_RETENTION)
    return old.delete()[0]
