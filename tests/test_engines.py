"""Firings that enqueue on a task engine: django.tasks with django-tasks-db (the backport on
Django 5.2), and Celery on a real Redis server (``TEST_REDIS_URL``, ``scripts/redis-test-server``).

One firing goes through the real runner, lock provider and database, as in test_execution.py;
the engines are real: their rows, messages and result backends are read back. The processes
(schedulers and workers) are in test_engines_processes.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from unittest import mock

import celery
import pytest
import redis
from celery import Celery
from django.contrib.auth.models import User
from django.core import checks
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test import TransactionTestCase, override_settings
from django.urls import reverse
from django_tasks_db.models import DBTaskResult

from django_scheduling import signals
from django_scheduling.checks import check_engines, task_errors
from django_scheduling.conf import get_settings
from django_scheduling.context import EnqueuedTooLate
from django_scheduling.locking import DatabaseLockProvider
from django_scheduling.models import RunStatus, ScheduledTask, TaskRun
from django_scheduling.observability import outcomes
from django_scheduling.observability.deadline import OUTCOME_TIMEOUT
from django_scheduling.observability.events import run_events
from django_scheduling.observability.outcomes import WATCH_FOR, OutcomeWatch
from django_scheduling.runtime.firing import FiringPipeline
from django_scheduling.runtime.scheduler import Entry, RunRequest
from django_scheduling.runtime.service import WARM_UP_TIMEOUT, _warm_up_engines
from django_scheduling.tasks import engines
from django_scheduling.tasks.registry import TaskRegistry
from tests.engines_celery import REDIS_URL
from tests.engines_celery import app as celery_app
from tests.testapp import engine_tasks
from tests.testapp.engine_tasks import (
    celery_record,
    immediate_record,
    tasks_fail,
    tasks_record,
)

try:
    from django.tasks.signals import task_enqueued
except ImportError:  # Django 5.2: the backport
    from django_tasks.signals import task_enqueued  # type: ignore[no-redef]

T0 = datetime(2026, 5, 13, 12, 0, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def make_runner(name, now):
    conf = dataclasses.replace(get_settings(), instance_name=name)
    return FiringPipeline(
        conf=conf,
        provider=DatabaseLockProvider(owner=name),
        default_zone=UTC,
        clock=lambda: now,
    )


def entry(runner, definition):
    (spec,) = runner.specs([definition], complete=False)
    return Entry(spec.name, spec)


class DeclarationTests(TransactionTestCase):
    def setUp(self):
        self.registry = TaskRegistry()

    def test_a_task_is_returned_unchanged_and_named_after_its_function(self):
        from django_scheduling.tasks import registry as module

        before = list(module.registry)
        try:
            returned = module.scheduled(fixed_rate="1m", kwargs={"name": "x"})(tasks_record)
            self.assertIs(returned, tasks_record)
            definition = module.registry.get("tests.testapp.engine_tasks.tasks_record")
        finally:
            module.registry._tasks.pop("tests.testapp.engine_tasks.tasks_record", None)
        self.assertEqual(list(module.registry), before)
        self.assertEqual(definition.engine, engines.DJANGO_TASKS)
        self.assertEqual(definition.origin, "tests.testapp.engine_tasks.tasks_record")
        self.assertEqual(definition.kwargs, {"name": "x"})
        self.assertIsNone(definition.error)

    def test_a_celery_task_is_detected_without_evaluating_its_proxy(self):
        app = Celery("unfinalized", set_as_current=False)

        @app.task
        def refresh_feeds():
            pass

        definition = self.registry.add(refresh_feeds, fixed_rate="5m")
        self.assertFalse(app.finalized)  # evaluating the proxy would have finalized the app
        self.assertEqual(definition.engine, engines.CELERY)
        self.assertEqual(
            definition.name,
            f"{__name__}.DeclarationTests."
            "test_a_celery_task_is_detected_without_evaluating_its_proxy.<locals>.refresh_feeds",
        )
        shared = self.registry.add(celery_record, fixed_rate="5m", kwargs={"name": "x"})
        self.assertEqual(shared.name, "tests.testapp.engine_tasks.celery_record")

    def test_a_shared_task_is_named_after_its_function(self):
        from celery import shared_task

        @shared_task
        def refresh_feeds():
            pass

        definition = self.registry.add(refresh_feeds, fixed_rate="5m")
        self.assertEqual(definition.engine, engines.CELERY)
        self.assertTrue(definition.name.endswith("<locals>.refresh_feeds"), definition.name)

    def test_several_schedules_for_one_task_and_arguments_for_plain_functions(self):
        def report(kind, *, dry_run=False):
            pass

        self.registry.add(tasks_record, cron="0 3 * * *", name="daily", kwargs={"name": "d"})
        self.registry.add(tasks_record, fixed_rate="1h", name="hourly", kwargs={"name": "h"})
        plain = self.registry.add(report, fixed_rate="1h", args=("full",), name="report")
        self.assertEqual([d.name for d in self.registry], ["daily", "hourly", "report"])
        self.assertEqual(task_errors(self.registry), [])
        self.assertEqual((plain.args, plain.engine), (("full",), None))

    def test_mistakes_are_reported_by_checks(self):
        def report(kind):
            pass

        self.registry.add(tasks_record, fixed_rate="1h", name="same", kwargs={"name": "a"})
        self.registry.add(tasks_record, fixed_rate="2h", name="same", kwargs={"name": "b"})
        self.registry.add(report, fixed_rate="1h", kwargs={"other": 1}, name="wrong_arguments")
        self.registry.add(tasks_record, fixed_rate="1h", expires="5m", name="tasks_expires")
        self.registry.add(celery_record, fixed_rate="1h", expires="soon", name="bad_expires")
        self.registry.add(tasks_record, fixed_rate="1h", name="not_json", kwargs={"name": object()})
        self.registry.add(celery_record, fixed_rate="1h", lock=False, name="unlocked")
        errors = {error.id: error.msg for error in task_errors(self.registry)}
        self.assertEqual(
            errors,
            {
                "django_scheduling.E002": "Two @scheduled lines on "
                "tests.testapp.engine_tasks.tasks_record give the same name 'same'.",
                "django_scheduling.E003": errors["django_scheduling.E003"],
                "django_scheduling.E009": errors["django_scheduling.E009"],
            },
        )
        self.assertIn(
            "would enqueue each firing once per scheduler", errors["django_scheduling.E003"]
        )
        messages = [error.msg for error in task_errors(self.registry)]
        self.assertTrue(
            any("cannot be enqueued: a django.tasks Task takes JSON" in m for m in messages)
        )
        self.assertTrue(any("kwargs={'other': 1} do not fit the function" in m for m in messages))
        self.assertTrue(any("expires='5m' applies to Celery tasks only" in m for m in messages))
        self.assertTrue(any("expires" in m and "soon" in m for m in messages))

    def test_a_backend_alias_missing_from_tasks_is_an_error(self):
        self.registry.add(tasks_record, fixed_rate="1h", name="nightly", kwargs={"name": "n"})
        tasks = {"other": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
        with override_settings(TASKS=tasks):
            (error,) = task_errors(self.registry)
        self.assertEqual(error.id, "django_scheduling.E010")
        self.assertIn(
            "enqueues on the django.tasks backend 'default', which is not in TASKS", error.msg
        )
        self.assertIn("'other'", error.hint)

    def test_immediate_backend_gives_a_warning(self):
        from django_scheduling.tasks import registry as module

        module.scheduled(fixed_rate="1h", name="immediate", kwargs={"name": "i"})(immediate_record)
        try:
            (warning,) = check_engines()
        finally:
            module.registry._tasks.pop("immediate")
        self.assertIsInstance(warning, checks.Warning)
        self.assertEqual(warning.id, "django_scheduling.W010")
        self.assertIn("runs it at once inside the scheduler's process", warning.msg)


class DjangoTasksTests(TransactionTestCase):
    """django.tasks with django-tasks-db on the scheduler's database: one transaction."""

    def setUp(self):
        self.registry = TaskRegistry()
        self.definition = self.registry.add(
            tasks_record, fixed_rate="10s", name="nightly", kwargs={"name": "nightly"}
        )

    def test_a_firing_enqueues_in_the_claims_transaction(self):
        seen = []

        def enqueued(sender, task_result, **kwargs):
            # Sent by the backend inside its enqueue(): the claim, made before it, is visible
            # and not committed yet (the firing's transaction is still open).
            row = ScheduledTask.objects.get(name="nightly")
            seen.append((connection.in_atomic_block, row.last_fire_time))

        task_enqueued.connect(enqueued)
        self.addCleanup(task_enqueued.disconnect, enqueued)
        runner = make_runner("a", T0)
        self.assertTrue(engines.commits_with(tasks_record, engines.DJANGO_TASKS, "default"))
        next_time = runner.run(entry(runner, self.definition), T0)

        self.assertEqual(next_time, T0 + timedelta(seconds=10))
        self.assertEqual(seen, [(True, T0)])
        run = TaskRun.objects.get()
        self.assertEqual(
            (run.status, run.scheduled_at, run.backend),
            (RunStatus.ENQUEUED, T0, "django.tasks:default"),
        )
        result = DBTaskResult.objects.get()
        self.assertEqual(str(result.id), run.result_id)
        self.assertEqual(result.args_kwargs, {"args": [], "kwargs": {"name": "nightly"}})
        self.assertEqual(ScheduledTask.objects.get(name="nightly").last_run_id, run.pk)
        self.assertFalse(engine_tasks.Execution.objects.exists())  # nothing ran here
        self.assertEqual(outcomes.lookup(run.backend, run.result_id), "ready")

    def test_an_enqueued_firing_is_signalled_and_counted(self):
        from prometheus_client import REGISTRY

        from django_scheduling import signals
        from django_scheduling.observability import metrics

        metrics.install()
        sent = []

        def receiver(signal):
            def receive(sender, **kwargs):
                sent.append((signal, sender, kwargs.get("scheduled_at"), kwargs.get("result_id")))
                # Sent once the claim committed, never inside its transaction.
                self.assertFalse(connection.in_atomic_block)

            return receive

        started, enqueued = receiver("started"), receiver("enqueued")
        signals.run_started.connect(started)
        signals.run_enqueued.connect(enqueued)
        self.addCleanup(signals.run_started.disconnect, started)
        self.addCleanup(signals.run_enqueued.disconnect, enqueued)
        labels = {"task": "nightly", "status": "enqueued"}
        before = REGISTRY.get_sample_value("django_scheduling_runs_total", labels) or 0.0

        runner = make_runner("a", T0)
        runner.run(entry(runner, self.definition), T0)

        run = TaskRun.objects.get()
        self.assertTrue(run_events.drain(10))  # the signals go out from the events thread
        self.assertEqual(
            sent,
            [("started", "nightly", T0, None), ("enqueued", "nightly", T0, run.result_id)],
        )
        after = REGISTRY.get_sample_value("django_scheduling_runs_total", labels)
        self.assertEqual(after, before + 1)
        # An enqueue is not a success: that is the worker's to report (outcomes.py).
        self.assertIsNotNone(
            REGISTRY.get_sample_value(
                "django_scheduling_last_enqueued_timestamp_seconds", {"task": "nightly"}
            )
        )
        self.assertIsNone(
            REGISTRY.get_sample_value(
                "django_scheduling_last_success_timestamp_seconds", {"task": "nightly"}
            )
        )

    @override_settings(SCHEDULING={"ALERT_AFTER_FAILURES": 2})
    def test_an_enqueue_after_failed_ones_is_a_recovery_and_breaks_a_streak(self):
        from django_scheduling.observability import alerts
        from django_scheduling.signals import task_failing

        alerts.install()
        sent = []

        def receive(sender, **kwargs):
            sent.append((sender, kwargs["failures"], kwargs["recovered"]))

        task_failing.connect(receive)
        self.addCleanup(task_failing.disconnect, receive)
        for minutes in (3, 2):  # two enqueues that failed, on another instance
            TaskRun.objects.create(
                task_name="nightly",
                started_at=T0 - timedelta(minutes=minutes),
                finished_at=T0 - timedelta(minutes=minutes),
                status=RunStatus.FAILED,
                instance="other:1:1",
            )
        runner = make_runner("a", T0)
        runner.run(entry(runner, self.definition), T0)
        run_events.drain(10)  # the signals go out from the events thread
        self.assertEqual(sent, [("nightly", 2, True)])
        TaskRun.objects.create(
            task_name="nightly",
            started_at=T0 + timedelta(minutes=1),
            finished_at=T0 + timedelta(minutes=1),
            status=RunStatus.FAILED,
            instance="other:1:1",
        )
        # failed, enqueued, failed: one failure in a row, not two
        self.assertEqual(
            alerts.failures_in_a_row("nightly", before=None, limit=5, using="default"), 1
        )

    @pytest.mark.vendor("mysql", "postgresql")  # SQLite's test database is never closed
    def test_firings_that_enqueue_keep_their_connection(self):
        connections_seen = []

        def note(sender, **kwargs):
            connections_seen.append(connection.connection)

        task_enqueued.connect(note)
        self.addCleanup(task_enqueued.disconnect, note)
        runner = make_runner("a", T0)
        task_entry = entry(runner, self.definition)
        for second in (0, 10, 20):
            runner.clock = lambda second=second: T0 + timedelta(seconds=second)
            runner.run(task_entry, T0 + timedelta(seconds=second))
        self.assertEqual(TaskRun.objects.filter(status=RunStatus.ENQUEUED).count(), 3)
        # Not one connection per firing (CONN_MAX_AGE = 0 closes them after task code).
        self.assertEqual(len({id(seen) for seen in connections_seen}), 1)

    def test_a_firing_claimed_elsewhere_enqueues_nothing(self):
        a, b = make_runner("a", T0), make_runner("b", T0)
        entry_a, entry_b = entry(a, self.definition), entry(b, self.definition)
        a.run(entry_a, T0)
        b.run(entry_b, T0)  # b finds the fire time claimed: no second run, no second enqueue
        self.assertEqual(TaskRun.objects.count(), 1)
        self.assertEqual(DBTaskResult.objects.count(), 1)

    def refuse(self, error):
        """Make each enqueue fail with *error*, raised inside the backend's enqueue() after
        its row is written (from the task_enqueued signal)."""

        def raise_error(sender, **kwargs):
            raise error

        task_enqueued.connect(raise_error)
        self.addCleanup(task_enqueued.disconnect, raise_error)

    def test_an_enqueue_that_fails_is_a_failed_run_and_the_schedule_goes_on(self):
        self.refuse(RuntimeError("the queue is full"))
        runner = make_runner("a", T0)
        next_time = runner.run(entry(runner, self.definition), T0)
        self.assertEqual(next_time, T0 + timedelta(seconds=10))
        run = TaskRun.objects.get()
        self.assertEqual((run.status, run.error_type), (RunStatus.FAILED, "builtins.RuntimeError"))
        self.assertEqual((run.backend, run.result_id), ("django.tasks:default", ""))
        self.assertFalse(DBTaskResult.objects.exists())  # the savepoint took its row back
        # The claim committed: the next firing is the next fire time, not this one again.
        self.assertEqual(ScheduledTask.objects.get(name="nightly").last_fire_time, T0)

    def test_a_database_error_of_the_enqueue_rolls_the_claim_back_and_the_firing_is_retried(self):
        self.refuse(OperationalError("the database went away"))
        runner = make_runner("a", T0)
        task_entry = entry(runner, self.definition)
        retry_at = runner.run(task_entry, T0)
        self.assertIsNotNone(retry_at)
        self.assertLess(retry_at, T0 + timedelta(seconds=10))  # backs off, before its next time
        self.assertIsNone(ScheduledTask.objects.get(name="nightly").last_fire_time)
        self.assertFalse(TaskRun.objects.exists())
        self.assertFalse(DBTaskResult.objects.exists())
        self.doCleanups()  # the receiver goes: the database answers again
        self.assertEqual(runner.run(task_entry, T0), T0 + timedelta(seconds=10))
        run = TaskRun.objects.get()
        self.assertEqual((run.status, run.scheduled_at), (RunStatus.ENQUEUED, T0))
        self.assertEqual(DBTaskResult.objects.count(), 1)

    def test_run_now_from_the_admin_enqueues(self):
        runner = make_runner("a", T0)
        task_entry = entry(runner, self.definition)
        user = User.objects.create_superuser("admin", "admin@example.com", "x")
        self.client.force_login(user)
        url = reverse("admin:django_scheduling_scheduledtask_run", args=["nightly"])
        self.client.post(url)
        requested = ScheduledTask.objects.get(name="nightly").run_requested_at
        self.assertIsNotNone(requested)

        runner.run(task_entry, RunRequest(requested_at=requested))

        run = TaskRun.objects.get()
        self.assertEqual((run.status, run.scheduled_at), (RunStatus.ENQUEUED, None))
        self.assertEqual(str(DBTaskResult.objects.get().id), run.result_id)
        self.assertIsNone(ScheduledTask.objects.get(name="nightly").run_requested_at)
        page = self.client.get(reverse("admin:django_scheduling_taskrun_change", args=[run.pk]))
        self.assertContains(page, f"django.tasks:default as {run.result_id}: ready")


class OtherBackendTests(TransactionTestCase):
    def test_a_backend_without_results_is_enqueued_after_the_claim_and_says_so(self):
        definition = TaskRegistry().add(
            immediate_record, fixed_rate="10s", name="immediate", kwargs={"name": "immediate"}
        )
        self.assertFalse(engines.commits_with(immediate_record, engines.DJANGO_TASKS, "default"))
        runner = make_runner("a", T0)
        runner.run(entry(runner, definition), T0)
        run = TaskRun.objects.get()
        self.assertEqual((run.status, run.backend), (RunStatus.ENQUEUED, "django.tasks:immediate"))
        # The ImmediateBackend ran it inside enqueue(), here (hence check W010).
        (execution,) = engine_tasks.Execution.objects.all()
        self.assertEqual(execution.task, f"immediate {run.result_id}")
        self.assertEqual(execution.pid, os.getpid())
        self.assertEqual(
            outcomes.lookup(run.backend, run.result_id),
            "outcome not reported by backend django.tasks:immediate",
        )


@override_settings(TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}})
class CeleryTests(TransactionTestCase):
    """Celery on Redis: enqueued right after the claim commits."""

    def setUp(self):
        self.queue = f"test-engines-{os.getpid()}"
        celery_app.conf.task_default_queue = self.queue
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.redis.ping()  # scripts/test starts the server: fail here with the reason if not
        self.redis.delete(self.queue)
        self.addCleanup(self.redis.delete, self.queue)
        self.registry = TaskRegistry()

    def test_a_firing_publishes_a_message_that_expires_at_the_next_fire_time(self):
        definition = self.registry.add(
            celery_record, fixed_rate="10s", name="feeds", kwargs={"name": "feeds"}
        )
        runner = make_runner("a", T0)
        self.assertFalse(engines.commits_with(celery_record, engines.CELERY, "default"))
        self.assertEqual(runner.run(entry(runner, definition), T0), T0 + timedelta(seconds=10))
        run = TaskRun.objects.get()
        self.assertEqual((run.status, run.backend), (RunStatus.ENQUEUED, "celery"))
        self.assertEqual(self.redis.llen(self.queue), 1)
        message = json.loads(self.redis.lindex(self.queue, 0))
        self.assertEqual(message["headers"]["id"], run.result_id)
        self.assertEqual(message["headers"]["task"], "tests.testapp.engine_tasks.celery_record")
        self.assertEqual(message["headers"]["expires"], (T0 + timedelta(seconds=10)).isoformat())
        self.assertEqual(
            outcomes.lookup("celery", run.result_id), "pending (or unknown to the result backend)"
        )

    def test_a_firing_sent_late_still_gets_a_whole_period(self):
        definition = self.registry.add(
            celery_record,
            fixed_rate="10s",
            name="catch_up",
            kwargs={"name": "c"},
            missed="run_all",
        )
        late = T0 + timedelta(minutes=5)  # a catch-up: the fire time T0 is sent 5 minutes late
        runner = make_runner("a", late)
        runner.run(entry(runner, definition), T0)
        message = json.loads(self.redis.lindex(self.queue, 0))
        self.assertEqual(message["headers"]["expires"], (late + timedelta(seconds=10)).isoformat())

    def test_expires_can_be_given_or_turned_off(self):
        given = self.registry.add(
            celery_record, fixed_rate="10s", name="given", kwargs={"name": "g"}, expires="1h"
        )
        never = self.registry.add(
            celery_record, fixed_rate="10s", name="never", kwargs={"name": "n"}, expires=False
        )
        runner = make_runner("a", T0)
        runner.run(entry(runner, given), T0)
        runner.run(entry(runner, never), T0)
        expires = [
            json.loads(raw)["headers"]["expires"] for raw in self.redis.lrange(self.queue, 0, -1)
        ]
        self.assertCountEqual(expires, [(T0 + timedelta(hours=1)).isoformat(), None])

    def test_a_message_delayed_within_its_period_keeps_the_next_fire_time_as_expiry(self):
        definition = self.registry.add(
            celery_record, fixed_rate="10s", name="feeds", kwargs={"name": "feeds"}
        )
        runner = make_runner("a", T0)
        task_entry = entry(runner, definition)  # first scheduled at T0
        runner.clock = lambda: T0 + timedelta(seconds=3)  # sent 3 s after its fire time
        runner.run(task_entry, T0)
        message = json.loads(self.redis.lindex(self.queue, 0))
        self.assertEqual(message["headers"]["expires"], (T0 + timedelta(seconds=10)).isoformat())

    def test_expires_is_counted_from_the_fire_time(self):
        definition = self.registry.add(
            celery_record, fixed_rate="1h", name="feeds", kwargs={"name": "f"}, expires="10m"
        )
        runner = make_runner("a", T0)
        task_entry = entry(runner, definition)
        runner.clock = lambda: T0 + timedelta(seconds=3)
        runner.run(task_entry, T0)
        message = json.loads(self.redis.lindex(self.queue, 0))
        self.assertEqual(message["headers"]["expires"], (T0 + timedelta(minutes=10)).isoformat())

    def test_a_timeout_becomes_the_celery_time_limit(self):
        definition = self.registry.add(
            celery_record, fixed_rate="1h", name="feeds", kwargs={"name": "f"}, timeout="90s"
        )
        runner = make_runner("a", T0)
        runner.run(entry(runner, definition), T0)
        message = json.loads(self.redis.lindex(self.queue, 0))
        self.assertEqual(message["headers"]["timelimit"], [90.0, None])

    def down_task(self):
        down = "redis://127.0.0.1:1/0"  # nothing listens on port 1
        down_app = Celery("down", broker=down, backend=down, set_as_current=False)
        down_app.conf.result_backend_transport_options = {"retry_policy": {"max_retries": 0}}
        down_app.conf.broker_transport_options = {"max_retries": 1}

        @down_app.task
        def refresh_feeds():
            pass

        return refresh_feeds

    def test_the_start_connects_a_producer_for_each_worker_that_may_publish_at_once(self):
        app = Celery("warm", broker=REDIS_URL, backend=REDIS_URL, set_as_current=False)
        app.conf.broker_pool_limit = 3  # fewer than the workers: no more than the pool holds
        self.addCleanup(app.close)

        @app.task
        def warmed():
            pass

        # Four tasks: up to four publishes at once (with one, a single producer would do).
        definitions = [
            self.registry.add(warmed, fixed_rate="1h", name=f"warmed{i}") for i in range(4)
        ]
        _warm_up_engines(definitions, 4)
        queue = app.amqp.router.route({}, warmed.name)["queue"]
        with contextlib.ExitStack() as held:
            for _ in range(3):  # a producer the start did not open would be a new one
                producer = held.enter_context(app.producer_pool.acquire(block=False))
                self.assertTrue(producer.connection.connected)  # else not until used
                # Its first publish declares no queue (kombu's maybe_declare remembers).
                self.assertIn(hash(queue), producer.connection.declared_entities)

    def test_the_start_opens_no_more_producers_than_there_are_celery_tasks(self):
        app = Celery("warm", broker=REDIS_URL, backend=REDIS_URL, set_as_current=False)
        self.addCleanup(app.close)

        @app.task
        def warmed():
            pass

        definition = self.registry.add(warmed, fixed_rate="1h", name="warmed")
        _warm_up_engines([definition], 16)
        with app.producer_pool.acquire(block=False) as first:
            self.assertTrue(first.connection.connected)
            with app.producer_pool.acquire(block=False) as second:
                self.assertFalse(second.connection.connected)  # made now: never needed before

    def test_a_broker_that_is_down_at_the_start_delays_it_no_longer_than_the_warm_up(self):
        definition = self.registry.add(self.down_task(), fixed_rate="1h", name="feeds")
        started = time.monotonic()
        with self.assertLogs("django_scheduling.runtime.service", "WARNING") as logs:
            _warm_up_engines([definition], 4)
        self.assertLess(time.monotonic() - started, WARM_UP_TIMEOUT + 1.0)
        self.assertIn("Could not connect to the Celery broker at start", logs.output[0])

    def test_a_broker_that_is_down_is_tried_until_the_deadline_then_fails_the_run(self):
        definition = self.registry.add(self.down_task(), fixed_rate="2s", name="feeds")
        runner = make_runner("a", T0)
        started = time.monotonic()
        with self.assertLogs("django_scheduling.runtime.firing", "WARNING") as logs:
            self.assertEqual(runner.run(entry(runner, definition), T0), T0 + 2 * SECOND)
        # Tried again within the 2 s until the next fire time, then given up.
        self.assertLess(time.monotonic() - started, 10)
        # This thread's: a thread another test left behind may log its own.
        retries = [
            record
            for record in logs.records
            if record.thread == threading.get_ident() and "trying again in" in record.getMessage()
        ]
        self.assertGreaterEqual(len(retries), 1, logs.output)
        run = TaskRun.objects.get()
        self.assertEqual((run.status, run.backend, run.result_id), (RunStatus.FAILED, "celery", ""))
        self.assertIn("Connection refused", run.error_message + run.traceback)
        self.assertIn(f"in {len(retries) + 1} attempt(s)", run.error_message)
        self.assertEqual(ScheduledTask.objects.get(name="feeds").last_fire_time, T0)

    def test_a_message_that_reaches_the_broker_after_its_expiry_is_no_success(self):
        from celery.signals import before_task_publish

        definition = self.registry.add(
            celery_record, fixed_rate="5s", name="feeds", kwargs={"name": "feeds"}
        )
        clock = {"now": T0}
        runner = make_runner("a", T0)
        runner.clock = lambda: clock["now"]

        def stalled(**kwargs):
            clock["now"] = T0 + timedelta(seconds=12)  # the publish waited on an outage

        before_task_publish.connect(stalled, weak=False)
        self.addCleanup(before_task_publish.disconnect, stalled)
        failed = []
        signals.run_failed.connect(
            lambda sender, exception, **kw: failed.append(exception),
            weak=False,
            dispatch_uid="late",
        )
        self.addCleanup(signals.run_failed.disconnect, dispatch_uid="late")
        enqueued = []
        signals.run_enqueued.connect(
            lambda sender, **kw: enqueued.append(sender), weak=False, dispatch_uid="late"
        )
        self.addCleanup(signals.run_enqueued.disconnect, dispatch_uid="late")
        runner.run(entry(runner, definition), T0)
        run = TaskRun.objects.get()
        self.assertEqual(run.status, RunStatus.FAILED)
        self.assertEqual(run.error_type, "django_scheduling.context.EnqueuedTooLate")
        self.assertIn("after it expired at 2026-05-13T12:00:05+00:00", run.error_message)
        self.assertTrue(run.result_id)  # it did reach the broker, as that message
        self.assertTrue(run_events.drain(10))  # the signals go out from the events thread
        self.assertEqual(enqueued, [])
        self.assertIsInstance(failed[0], EnqueuedTooLate)


class OutcomeDeadlineTests(TransactionTestCase):
    """A result backend that accepts connections and never answers (a Redis server that hangs)
    must not hold up the run's page: the outcome lookup gives up after its deadline."""

    def setUp(self):
        # A real socket that listens (the kernel completes the connection) and never answers.
        self.server = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(self.server.close)  # the waiting lookups then fail, and end
        url = f"redis://127.0.0.1:{self.server.getsockname()[1]}/0"
        silent = Celery("silent", broker=url, backend=url, set_as_current=False)
        # The default is 120 s; shorter here, so that a lookup without a deadline ends too,
        # having waited well beyond the deadline.
        silent.conf.redis_socket_timeout = 10
        silent.conf.result_backend_transport_options = {"retry_policy": {"max_retries": 0}}
        previous = celery.current_app._get_current_object()
        silent.set_current()
        self.addCleanup(previous.set_current)

    def test_the_lookup_gives_up_after_its_deadline_and_says_so(self):
        started = time.monotonic()
        text = outcomes.lookup("celery", "3f1c0d3e-silent")
        elapsed = time.monotonic() - started
        self.assertEqual(text, "outcome unknown: the backend did not answer within 2 s")
        self.assertLess(elapsed, OUTCOME_TIMEOUT + 2)

    def test_the_runs_page_renders_within_the_deadline(self):
        run = TaskRun.objects.create(
            task_name="feeds",
            started_at=T0,
            finished_at=T0,
            status=RunStatus.ENQUEUED,
            instance="web-1:100",
            backend="celery",
            result_id="3f1c0d3e-page",
        )
        user = User.objects.create_superuser("admin", "admin@example.com", "x")
        self.client.force_login(user)
        started = time.monotonic()
        page = self.client.get(reverse("admin:django_scheduling_taskrun_change", args=[run.pk]))
        elapsed = time.monotonic() - started
        self.assertContains(
            page, "celery as 3f1c0d3e-page: outcome unknown: the backend did not answer within 2 s"
        )
        self.assertLess(elapsed, OUTCOME_TIMEOUT + 2)


class OutcomeWatchTests(TransactionTestCase):
    """Enqueued runs are settled with what the engine reports of their worker's run."""

    def enqueue(self, task, name, seconds):
        definition = TaskRegistry().add(task, fixed_rate="1h", name=name, kwargs={"name": name})
        runner = make_runner("a", T0 + timedelta(seconds=seconds))
        runner.run(entry(runner, definition), T0 + timedelta(seconds=seconds))
        return TaskRun.objects.get(task_name=name)

    def watch(self):
        return OutcomeWatch(using="default", instance="a", clock=lambda: T0 + timedelta(minutes=1))

    @override_settings(TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}})
    def test_django_tasks_runs_become_succeeded_or_failed_once_a_worker_ran_them(self):
        ok = self.enqueue(tasks_record, "watched_ok", 0)
        failing = self.enqueue(tasks_fail, "watched_fail", 1)
        watch = self.watch()
        self.assertEqual(watch.settle(now=T0 + timedelta(minutes=1)), 0)  # not run yet
        call_command("db_worker", "--batch", "--no-startup-delay", "--queue-name", "*", verbosity=0)
        self.assertEqual(watch.settle(now=T0 + timedelta(minutes=1)), 2)
        ok.refresh_from_db()
        failing.refresh_from_db()
        self.assertEqual((ok.status, ok.outcome), (RunStatus.SUCCEEDED, "successful"))
        self.assertEqual((failing.status, failing.outcome), (RunStatus.FAILED, "failed"))
        self.assertEqual(failing.error_message, "The worker reported the run FAILED.")
        self.assertEqual(watch.settle(now=T0 + timedelta(minutes=1)), 0)  # settled once

    @override_settings(TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}})
    def test_runs_older_than_the_watch_or_of_another_instance_are_left_alone(self):
        run = self.enqueue(tasks_record, "watched_old", 0)
        call_command("db_worker", "--batch", "--no-startup-delay", "--queue-name", "*", verbosity=0)
        late = T0 + WATCH_FOR + timedelta(seconds=1)
        self.assertEqual(self.watch().settle(now=late), 0)
        other = OutcomeWatch(using="default", instance="b")
        self.assertEqual(other.settle(now=T0), 0)
        run.refresh_from_db()
        self.assertEqual(run.status, RunStatus.ENQUEUED)

    def test_celery_states_from_the_result_backend(self):
        celery_app.conf.task_default_queue = f"test-watch-{os.getpid()}"
        self.addCleanup(redis.Redis.from_url(REDIS_URL).delete, celery_app.conf.task_default_queue)
        done = self.enqueue(celery_record, "watched_done", 0)
        dropped = self.enqueue(celery_record, "watched_dropped", 1)
        # What a worker writes: a success, and a message it dropped as expired.
        celery_app.backend.store_result(done.result_id, None, "SUCCESS")
        celery_app.backend.mark_as_revoked(dropped.result_id, reason="expired")
        self.assertEqual(self.watch().settle(now=T0 + timedelta(minutes=1)), 2)
        done.refresh_from_db()
        dropped.refresh_from_db()
        self.assertEqual((done.status, done.outcome), (RunStatus.SUCCEEDED, "success"))
        self.assertEqual((dropped.status, dropped.outcome), (RunStatus.FAILED, "revoked"))
        self.assertIn("it expired before a worker took it", dropped.error_message)

    def test_celery_states_are_read_in_one_round_trip(self):
        backend = celery_app.backend
        ids = [f"watch-{os.getpid()}-{i}" for i in range(3)]
        self.addCleanup(
            redis.Redis.from_url(REDIS_URL).delete, *[backend.get_key_for_task(i) for i in ids]
        )
        backend.store_result(ids[0], None, "SUCCESS")
        backend.mark_as_revoked(ids[1], reason="expired")
        mget = mock.Mock(wraps=backend.mget)
        with (
            mock.patch.object(backend, "mget", mget),
            mock.patch.object(backend, "get", side_effect=AssertionError("one GET per result")),
        ):
            found = engines.states("celery", ids)
        self.assertEqual(found, {ids[0]: "SUCCESS", ids[1]: "REVOKED", ids[2]: "PENDING"})
        self.assertEqual(mget.call_count, 1)
