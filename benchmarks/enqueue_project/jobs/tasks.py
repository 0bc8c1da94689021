"""``BENCH_TASKS`` tasks ``job_00000`` ..., each due every second, for the system in
``BENCH_SYSTEM``:

- ``ours-tasks``: django.tasks Tasks (django-tasks-db), ``@scheduled(cron="* * * * * *")``;
- ``ours-celery``: Celery tasks named ``bench.job_NNNNN``, the same ``@scheduled``;
- ``crontask``: the same django.tasks Tasks, ``@cron(CronTrigger(second="*"))`` (django-crontask
  loads this module itself: ``manage.py crontask`` imports each app's ``tasks``).

celery beat's entries are in ``celery_app.py``. Nothing here runs the tasks: the benchmark
counts what is enqueued. Every other option is the default.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from django_scheduling import scheduled

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]

SYSTEM = os.environ.get("BENCH_SYSTEM", "")
COUNT = int(os.environ.get("BENCH_TASKS", "0"))
CRON = "* * * * * *"


def _function(name: str) -> Callable[[], None]:
    def job() -> None:
        """Never runs: the benchmark counts enqueues."""

    # A module-level name, as django.tasks requires of a Task's function.
    job.__name__ = job.__qualname__ = name
    job.__module__ = __name__
    return job


for _index in range(COUNT):
    _name = f"job_{_index:05d}"
    if SYSTEM in ("ours-tasks", "crontask"):
        globals()[_name] = _task = task(_function(_name))
        if SYSTEM == "ours-tasks":
            scheduled(cron=CRON)(_task)
        else:
            from apscheduler.triggers.cron import CronTrigger
            from crontask import cron

            cron(CronTrigger(second="*", timezone="UTC"))(_task)
    elif SYSTEM == "ours-celery":
        from ..celery_app import app

        globals()[_name] = _celery_task = app.task(name=f"bench.{_name}")(_function(_name))
        scheduled(cron=CRON)(_celery_task)
