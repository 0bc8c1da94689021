"""Tasks enqueued on django.tasks (django-tasks-db) and Celery by tests/test_engines*.py.

Each call writes an ``Execution`` row named "<schedule> <result id>", with the pid of the
process that ran it: the test joins it with the run history (``TaskRun.result_id``) to tell
which fire time it served and where it ran. The schedules are declared only when
``TESTAPP_ENGINES`` names them (processes load this module through
``SCHEDULING["TASK_MODULE"] = "engine_tasks"``).
"""

from __future__ import annotations

import os

from django.utils import timezone

from django_scheduling import scheduled

from .models import Execution

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


def record(name: str, result_id: str) -> None:
    Execution.objects.create(task=f"{name} {result_id}", pid=os.getpid(), started=timezone.now())


@task(takes_context=True)
def tasks_record(context, name: str) -> None:
    """Record one call, run by a django.tasks worker."""
    record(name, str(context.task_result.id))


@task
def tasks_fail(name: str) -> None:
    """Fail, on a django.tasks worker."""
    raise RuntimeError(f"{name} failed on the worker")


@task(backend="immediate", takes_context=True)
def immediate_record(context, name: str) -> None:
    record(name, str(context.task_result.id))


ENGINES = set(filter(None, os.environ.get("TESTAPP_ENGINES", "").split(",")))

if "tasks" in ENGINES:
    scheduled(fixed_rate="1s", name="tasks_every_1s", kwargs={"name": "tasks_every_1s"})(
        tasks_record
    )

if "plain" in ENGINES:

    @scheduled(fixed_rate="1s", name="plain_every_1s")
    def plain_every_1s() -> None:
        record("plain_every_1s", "-")


try:
    from tests.engines_celery import app
except ImportError:  # Celery is not installed
    app = None

if app is not None:

    @app.task(bind=True)
    def celery_record(self, name: str) -> None:
        """Record one call, run by a Celery worker."""
        record(name, str(self.request.id))

    if "celery" in ENGINES:
        # expires: the messages wait for the workers that tests/test_engines_processes.py
        # starts a few seconds later (by default they would expire at the next fire time).
        scheduled(
            fixed_rate="1s",
            name="celery_every_1s",
            kwargs={"name": "celery_every_1s"},
            expires="1m",
        )(celery_record)

    if "celery_outage" in ENGINES:
        # The default expiry: the next fire time, a second later.
        scheduled(fixed_rate="1s", name="celery_outage", kwargs={"name": "celery_outage"})(
            celery_record
        )
