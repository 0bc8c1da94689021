"""Real schedulers enqueue on real engines: django-tasks-db's ``db_worker`` and Celery workers
on Redis (tests/engines_celery.py, ``TEST_REDIS_URL``).

The tasks (tests/testapp/engine_tasks.py) write a row per call, named after their schedule and
their result's id, with the pid of the process that ran them; the checks join those rows with
the run history. The three-scheduler tests run on Django 6.1 (on each database of its
sessions), or anywhere with ``TEST_ALL_SESSIONS=1``; Django 5.2 runs a light one on the
django-tasks backport (SQLite only). Elsewhere they are deselected (``@pytest.mark.sessions``).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import tempfile
from collections import Counter
from datetime import timedelta
from pathlib import Path

import django
import pytest
import redis
from django.test import TransactionTestCase
from django_tasks_db.models import DBTaskResult

from django_scheduling.clock import utcnow
from django_scheduling.models import RunStatus, ScheduledTask, TaskRun
from django_scheduling.observability import outcomes

from .processes import (
    Process,
    RedisServer,
    celery_worker,
    db_worker,
    manage,
    poll,
    process_env,
    start_schedulers,
)
from .testapp.models import Execution

pytestmark = pytest.mark.processes

SECOND = timedelta(seconds=1)
REDIS_DEFAULT = "redis://127.0.0.1:63799/0"
FULL = django.VERSION[:2] == (6, 1) or bool(os.environ.get("TEST_ALL_SESSIONS"))
#: Three schedulers and two workers: in the Django 6.1 sessions (deselected elsewhere).
only_full = pytest.mark.sessions("6.1")


def engine_env(engines: str, scheduling: dict | None = None, **extra: str) -> dict[str, str]:
    return process_env(
        SCHEDULING_EXTRA=json.dumps({"TASK_MODULE": "engine_tasks", **(scheduling or {})}),
        SCHEDULING_LOG_LEVEL="INFO",
        TESTAPP_ENGINES=engines,
        **extra,
    )


class EngineProcessTests(TransactionTestCase):
    def start_schedulers(self, count: int, env: dict[str, str]) -> list[Process]:
        return start_schedulers(self, count, env)

    def runs(self, task: str, *statuses: RunStatus) -> list[TaskRun]:
        """Return the runs of *task* in *statuses*; by default those enqueued, whether or not
        their scheduler has since learnt that the worker ran them (succeeded)."""
        statuses = statuses or (RunStatus.ENQUEUED, RunStatus.SUCCEEDED)
        runs = TaskRun.objects.filter(task_name=task, status__in=statuses)
        return list(runs.order_by("scheduled_at"))

    def executions(self, task: str) -> list[Execution]:
        return list(Execution.objects.filter(task__startswith=f"{task} "))

    def assert_each_fire_time_ran_once_on_a_worker(
        self, task: str, schedulers: list[Process], workers: list[Process]
    ) -> None:
        runs = TaskRun.objects.filter(task_name=task).order_by("scheduled_at")
        self.assertLessEqual(
            {run.status for run in runs}, {RunStatus.ENQUEUED, RunStatus.SUCCEEDED}
        )
        times = [run.scheduled_at for run in runs]
        steps = {later - earlier for earlier, later in itertools.pairwise(times)}
        self.assertEqual(steps, {SECOND}, f"fire times missed or enqueued twice: {times}")
        executions = self.executions(task)
        ran = Counter(execution.task.split(" ", 1)[1] for execution in executions)
        self.assertEqual(ran, Counter(run.result_id for run in runs))  # each once, none else
        pids = {execution.pid for execution in executions}
        self.assertLessEqual(pids, {worker.popen.pid for worker in workers})
        self.assertFalse(pids & {scheduler.popen.pid for scheduler in schedulers})

    def wait_for_executions(self, task: str) -> None:
        """Wait until every enqueued run of *task* has run."""
        poll(
            lambda: len(self.executions(task)) >= len(self.runs(task)),
            timeout=30,
            message=f"the workers did not run every enqueued firing of {task}",
        )

    @pytest.mark.sessions("6.1", "5.2/sqlite")
    def test_django_tasks_firings_wait_for_workers_then_run_once_each(self):
        """With django-tasks-db on the scheduler's database: claim and enqueue in one
        transaction. No worker: the firings wait in the queue (its table). Then workers
        start, and every fire time runs once, on a worker."""
        task = "tasks_every_1s"
        env = engine_env("tasks")
        schedulers = self.start_schedulers(3 if FULL else 1, env)
        poll(lambda: len(self.runs(task)) >= 3, timeout=30, message="no firings enqueued")
        self.assertEqual(self.executions(task), [])
        results = DBTaskResult.objects.filter(pk__in=[run.result_id for run in self.runs(task)])
        self.assertEqual({result.status for result in results}, {"READY"})

        workers = [db_worker(env) for _ in range(2 if FULL else 1)]
        for worker in workers:
            self.addCleanup(worker.kill)
        enqueued = len(self.runs(task))
        poll(lambda: len(self.runs(task)) >= enqueued + 3, timeout=30)
        for scheduler in schedulers:
            self.assertEqual(scheduler.stop(), 0, scheduler.output)
        self.wait_for_executions(task)
        for worker in workers:
            worker.stop()
        self.assert_each_fire_time_ran_once_on_a_worker(task, schedulers, workers)
        self.assertEqual(set(DBTaskResult.objects.values_list("status", flat=True)), {"SUCCESSFUL"})
        # The run's admin page reads the outcome from the backend.
        run = self.runs(task)[0]
        self.assertEqual(outcomes.lookup(run.backend, run.result_id), "successful")

    @only_full
    def test_celery_firings_wait_for_workers_then_run_once_each(self):
        """Celery on Redis: enqueued after the claim commits. No worker: the messages wait in
        Redis. Then workers start, and every fire time runs once, on a worker."""
        queue = f"test-engines-{os.getpid()}"
        client = redis.Redis.from_url(os.environ.get("TEST_REDIS_URL", REDIS_DEFAULT))
        client.delete(queue)
        self.addCleanup(client.delete, queue)
        task = "celery_every_1s"
        env = engine_env("celery", TEST_CELERY_QUEUE=queue)
        schedulers = self.start_schedulers(3, env)
        poll(lambda: len(self.runs(task)) >= 3, timeout=30, message="no firings enqueued")
        self.assertEqual(self.executions(task), [])
        self.assertGreaterEqual(client.llen(queue), 3)

        workers = [celery_worker(f"w{index}", queue, env) for index in (1, 2)]
        for worker in workers:
            self.addCleanup(worker.kill)
        enqueued = len(self.runs(task))
        poll(lambda: len(self.runs(task)) >= enqueued + 3, timeout=30)
        for scheduler in schedulers:
            self.assertEqual(scheduler.stop(), 0, scheduler.output)
        self.wait_for_executions(task)
        for worker in workers:
            worker.stop()
        self.assert_each_fire_time_ran_once_on_a_worker(task, schedulers, workers)
        # The run's admin page reads the outcome from the result backend, in a process that
        # loads the Celery app (as a project's __init__.py does).
        import tests.engines_celery  # noqa: F401

        run = self.runs(task)[-1]
        self.assertEqual(outcomes.lookup(run.backend, run.result_id), "SUCCESS")

    @only_full
    def test_an_unreachable_broker_fails_the_firings_and_blocks_nothing_else(self):
        env = engine_env("celery,plain", TEST_REDIS_URL="redis://127.0.0.1:1/0")
        (scheduler,) = self.start_schedulers(1, env)
        poll(
            lambda: (
                len(self.runs("celery_every_1s", RunStatus.FAILED)) >= 3
                and len(self.executions("plain_every_1s")) >= 3
            ),
            timeout=30,
            message="the failed enqueues were not recorded, or the other task did not run",
        )
        self.assertEqual(scheduler.stop(), 0, scheduler.output)
        failed = self.runs("celery_every_1s", RunStatus.FAILED)
        self.assertEqual(TaskRun.objects.filter(task_name="celery_every_1s").count(), len(failed))
        self.assertIn("Connection refused", failed[0].error_message + failed[0].traceback)
        # Each failure was a fire time of its own: the schedule went on, a second apart.
        times = [run.scheduled_at for run in failed]
        self.assertEqual({b - a for a, b in itertools.pairwise(times)}, {SECOND})
        plain = self.runs("plain_every_1s", RunStatus.SUCCEEDED)
        self.assertEqual(
            {b.scheduled_at - a.scheduled_at for a, b in itertools.pairwise(plain)}, {SECOND}
        )

    @only_full
    def test_a_crash_between_the_claim_and_the_publish_loses_that_fire_time(self):
        """The guarantees' "at most once" for brokers outside the database: a scheduler killed
        while it publishes (to a broker that accepts the connection and never answers) leaves
        the run "running"; housekeeping marks it lost, and no one enqueues that fire time."""
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections complete in the kernel; nothing ever answers them
        self.addCleanup(silent.close)
        port = silent.getsockname()[1]
        scheduling = {"LOCK_AT_MOST_FOR": "2s", "HOUSEKEEPING_INTERVAL": "1s"}
        env = engine_env("celery", scheduling, TEST_REDIS_URL=f"redis://127.0.0.1:{port}/0")
        (stuck,) = self.start_schedulers(1, env)
        run = poll(
            lambda: TaskRun.objects.filter(task_name="celery_every_1s").first(),
            timeout=30,
            message="no firing started",
        )
        # The run is recorded just before its claim: kill only once the claim has committed
        # (the row names the run), while the publish hangs.
        poll(
            lambda: ScheduledTask.objects.filter(
                name="celery_every_1s", last_run_id=run.pk
            ).exists(),
            timeout=30,
            message="the firing's claim did not commit",
        )
        stuck.kill()
        self.assertEqual(run.status, RunStatus.RUNNING)
        queue = f"test-engines-{os.getpid()}"
        env = engine_env("celery", scheduling, TEST_CELERY_QUEUE=queue)
        self.start_schedulers(1, env)
        lost = poll(
            lambda: TaskRun.objects.filter(pk=run.pk, status=RunStatus.LOST).first(),
            timeout=30,
            message="the run cut off by the crash was not marked lost",
        )
        self.assertEqual(lost.result_id, "")
        poll(lambda: len(self.runs("celery_every_1s")) >= 2, timeout=30)
        # The other scheduler went on from the next fire times, and never served that one.
        self.assertEqual(
            TaskRun.objects.filter(
                task_name="celery_every_1s", scheduled_at=run.scheduled_at
            ).count(),
            1,
        )
        redis.Redis.from_url(os.environ.get("TEST_REDIS_URL", REDIS_DEFAULT)).delete(queue)


class BrokerOutageTests(TransactionTestCase):
    """Redis stopped and started again under three schedulers and two Celery workers (a Redis
    server of the test's own, which keeps its queue across the stop)."""

    def setUp(self) -> None:
        directory = tempfile.TemporaryDirectory(prefix="scheduling-redis-")
        self.addCleanup(directory.cleanup)
        self.redis = RedisServer(Path(directory.name))
        self.redis.start()
        self.addCleanup(self.redis.kill)

    @only_full
    @pytest.mark.vendor("postgresql")
    def test_every_fire_time_runs_once_on_a_worker_or_fails_with_its_reason(self):
        task = "celery_outage"
        queue = f"test-outage-{os.getpid()}"
        env = engine_env(
            "celery_outage",
            {"HEARTBEAT_INTERVAL": "1s"},
            TEST_REDIS_URL=self.redis.url,
            TEST_CELERY_QUEUE=queue,
        )
        workers = [celery_worker(f"o{index}", queue, env) for index in (1, 2)]
        for worker in workers:
            self.addCleanup(worker.kill)
        schedulers = self.start_schedulers(env)
        poll(lambda: len(self.executions(task)) >= 3, timeout=30, message="nothing ran")

        self.redis.stop()
        poll(
            lambda: TaskRun.objects.filter(task_name=task, status=RunStatus.FAILED).count() >= 3,
            timeout=30,
            message="the enqueues during the outage were not recorded failed",
        )
        self.redis.start()
        restarted = utcnow()
        poll(
            lambda: (
                Execution.objects.filter(task__startswith=task, started__gt=restarted).count() >= 3
            ),
            timeout=60,
            message="no firing ran on a worker after the broker came back",
        )
        # Every run up to now must be settled: run by a worker, or failed with its reason
        # (a message that expired in the queue meanwhile is settled failed by its scheduler).
        cutoff = utcnow()
        poll(
            lambda: not self.unsettled(task, before=cutoff),
            timeout=60,
            message=f"runs neither run by a worker nor failed: {self.unsettled(task, cutoff)}",
        )
        for scheduler in schedulers:
            self.assertEqual(scheduler.stop(), 0, scheduler.output)
        for worker in workers:
            worker.stop()

        runs = list(
            TaskRun.objects.filter(task_name=task, started_at__lt=cutoff).order_by("scheduled_at")
        )
        ran = Counter(execution.task.split(" ", 1)[1] for execution in self.executions(task))
        fire_times = Counter(run.scheduled_at for run in runs)
        self.assertEqual(max(fire_times.values()), 1, "a fire time was enqueued twice")
        for run in runs:
            if run.status in (RunStatus.ENQUEUED, RunStatus.SUCCEEDED):
                # Counted a success: it reached a worker, once.
                self.assertEqual(ran[run.result_id], 1, f"run {run.pk} ({run.status})")
            else:
                self.assertEqual(run.status, RunStatus.FAILED, run.pk)
                self.assertTrue(run.error_message, f"run {run.pk} failed without a reason")
                self.assertEqual(ran[run.result_id] if run.result_id else 0, 0, run.pk)
        # None lost: every fire time of the grid has its run, or is counted on the run after it.
        for earlier, later in itertools.pairwise(runs):
            gap = round((later.scheduled_at - earlier.scheduled_at) / SECOND)
            self.assertEqual(gap, later.missed_count + 1, f"fire times lost before run {later.pk}")
        failed = [run for run in runs if run.status == RunStatus.FAILED]
        self.assertTrue(
            any("Connection refused" in run.error_message + run.traceback for run in failed),
            [run.error_message for run in failed],
        )

    def start_schedulers(self, env: dict[str, str]) -> list[Process]:
        processes = [manage("runscheduler", env=env) for _ in range(3)]
        for process in processes:
            self.addCleanup(process.kill)
        for process in processes:
            process.wait_for("Scheduler running")
        return processes

    def executions(self, task: str) -> list[Execution]:
        return list(Execution.objects.filter(task__startswith=f"{task} "))

    def unsettled(self, task: str, before) -> list[int]:
        """Return the runs started before *before* that count as enqueued but that no worker
        has run (yet)."""
        ran = {execution.task.split(" ", 1)[1] for execution in self.executions(task)}
        runs = TaskRun.objects.filter(
            task_name=task,
            started_at__lt=before,
            status__in=[RunStatus.ENQUEUED, RunStatus.SUCCEEDED, RunStatus.RUNNING],
        )
        return [run.pk for run in runs if run.result_id not in ran]
